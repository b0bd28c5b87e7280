// lib/reshard/torch_dist_output, ucp-load --format torch_dist's OutputWriter (reached through the registry,
// as run_load and plan_json reach it), on the GPT fixture's DeepSpeed source read through the Megatron-Core
// view: the target layout given or taken from the source, Megatron's own layout checks, the folder it
// writes (tracker, iteration folder, metadata.json written as Megatron writes it, common.pt for a
// Megatron-Core before 0.17), and tensors read back from the DCP files against dsgen's ground truth.
#include <gtest/gtest.h>

#include <functional>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/dcp/reader.h"
#include "io/torch/torch_file.h"
#include "reshard/load.h"
#include "reshard/output_writer.h"
#include "reshard/universal_fixture.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace torch_dist_output_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

namespace {

// --format torch_dist of the GPT source (TP 1 PP 1 DP 2, bf16, iteration 100; 4 heads), nothing given.
LoadOptions td_options(const std::string& output) {
  LoadOptions o;
  o.input = loadtest::gpt_case().src.string();
  o.output = output;
  o.format = OutputFormat::TorchDist;
  o.given = {.tp = false, .pp = false, .dp = false, .zero_stage = false, .ep = false, .dtype = false};
  o.threads = 2;
  return o;
}

LoadOptions with_mesh(LoadOptions o, int tp, int dp) {
  o.target.tp = tp;
  o.target.dp = dp;
  o.given.tp = o.given.dp = true;
  return o;
}

std::string scratch(const std::string& name) { return ucpkit::testing::scratch_dir("torch_dist_output_" + name); }

std::string error_of(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

// dsgen's universal tensor (fp32, row-major) of a Megatron-DeepSpeed name.
std::vector<float> truth(const std::string& name, const std::string& state) {
  auto root = load_torch((loadtest::gpt_case().truth / "universal" / "zero" / name / (state + ".pt")).string());
  return root->at("param")->as_tensor().contiguous().to_vector<float>();
}

// fp32 -> bf16, round to nearest even (no NaN in the ground truth).
uint16_t bf16_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

TEST(TorchDistOutput, RegisteredAsAWriterOfSeveralProcessesThatReadsItsInputItself) {
  const OutputWriter& w = output_writer(OutputFormat::TorchDist);
  EXPECT_FALSE(w.one_process());  // the data files shared among MPI ranks
  EXPECT_TRUE(w.reads_megatron_core_input());
  EXPECT_FALSE(w.reads_model());
  EXPECT_TRUE(w.takes_model_map());
  EXPECT_TRUE(w.takes_megatron_options());
}

TEST(TorchDistOutput, LayoutNotGivenIsTheSourcesAndSaidSo) {
  const nlohmann::json j = plan_json(td_options("/nowhere"));
  EXPECT_EQ(j["format"], "torch_dist");
  EXPECT_EQ(j["from_source"], (nlohmann::json{{"tp", 1}, {"pp", 1}, {"ep", 1}, {"dp", 2}, {"dtype", "bf16"}}));
  EXPECT_EQ(j["target"]["world"], 2);
  EXPECT_EQ(j["target"]["iteration"], 100);
  EXPECT_EQ(j["iteration_folder"], "iter_0000100");  // Megatron's iter_{N:07d}
  EXPECT_EQ(j["target"]["common_state"], "common_state/shard_0_1");
  EXPECT_EQ(j["target"]["optimizer_format"], "fully_reshardable");
}

TEST(TorchDistOutput, GivenLayoutIsWrittenWithItsKeys) {
  const nlohmann::json j = plan_json(with_mesh(td_options("/nowhere"), 2, 3));
  EXPECT_EQ(j["from_source"], (nlohmann::json{{"pp", 1}, {"ep", 1}, {"dtype", "bf16"}}));
  EXPECT_EQ(j["target"]["tp"], 2);
  EXPECT_EQ(j["target"]["dp"], 3);
  EXPECT_EQ(j["target"]["world"], 6);
  // The GPT's 4 layers stacked under Megatron-Core names; QKV column-parallel, the projection row-parallel.
  std::map<std::string, nlohmann::json> keys;
  for (const auto& k : j["keys"]) keys[k["key"]] = k;
  ASSERT_TRUE(keys.count("decoder.layers.self_attention.linear_qkv.weight"));
  EXPECT_EQ(keys["decoder.layers.self_attention.linear_qkv.weight"]["size"], nlohmann::json({4, 96, 32}));
  EXPECT_EQ(keys["decoder.layers.self_attention.linear_qkv.weight"]["tp_dim"], 0);
  EXPECT_EQ(keys["decoder.layers.self_attention.linear_proj.weight"]["tp_dim"], 1);
  EXPECT_EQ(keys["embedding.position_embeddings.weight"]["tp_dim"], -1);
  EXPECT_EQ(keys["embedding.word_embeddings.weight"]["size"], nlohmann::json({104, 32}));  // padded vocabulary
  EXPECT_LT(j["tensor_entries"].get<int>(), j["entries"].get<int>());  // the common state and objects are bytes
}

TEST(TorchDistOutput, WorldSizeGivesDpOrIsRefused) {
  LoadOptions o = td_options("/nowhere");
  o.target.tp = 2;
  o.given.tp = true;
  o.given.world_size = 8;
  EXPECT_EQ(plan_json(o)["target"]["dp"], 4);
  o.given.world_size = 7;
  EXPECT_NE(error_of([&] { plan_json(o); }).find("--world-size 7 is not a multiple of TP * PP = 2"), std::string::npos);
  o.given.dp = true;
  o.target.dp = 3;
  o.given.world_size = 8;
  EXPECT_NE(error_of([&] { plan_json(o); }).find("--world-size 8 is not TP * PP * DP = 6"), std::string::npos);
}

TEST(TorchDistOutput, MegatronsLayoutChecksRefuseWhatItCannotBuild) {
  const std::string heads = error_of([] { plan_json(with_mesh(td_options("/nowhere"), 3, 1)); });
  EXPECT_NE(heads.find("--tp 3 does not divide the 4 attention heads"), std::string::npos) << heads;
  LoadOptions o = with_mesh(td_options("/nowhere"), 1, 3);
  o.target.ep = 2;
  o.given.ep = true;
  EXPECT_NE(error_of([&] { plan_json(o); }).find("--ep 2 must divide DP 3"), std::string::npos);
  o = td_options("/nowhere");
  o.target.etp = 2;
  const std::string etp = error_of([&] { plan_json(o); });
  EXPECT_NE(etp.find("--etp"), std::string::npos) << etp;
  EXPECT_NE(etp.find("is not an MoE model"), std::string::npos) << etp;
  EXPECT_THROW(plan_json(o), UsageError);
}

TEST(TorchDistOutput, WritesMegatronsFolderWithTheTruthsValues) {
  const std::string out = scratch("write") + "/td";
  std::vector<std::string> warnings;
  LoadOptions o = td_options(out);
  o.reporter.warn = [&](const std::string& w) { warnings.push_back(w); };
  const LoadSummary s = run_load(o);
  EXPECT_EQ(s.threads, 1);
  EXPECT_EQ(s.target["world"], 2);
  bool said_dp = false;
  for (const auto& w : warnings) said_dp |= w.find("--dp not given: DP 2 as the source's") != std::string::npos;
  EXPECT_TRUE(said_dp);

  EXPECT_EQ(ucpkit::testing::file_bytes(out + "/latest_checkpointed_iteration.txt"), "100");
  const std::string iter = out + "/iter_0000100";
  EXPECT_EQ(ucpkit::testing::file_bytes(iter + "/metadata.json"),
            "{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1}");
  EXPECT_FALSE(fs::exists(iter + "/common.pt"));
  uint64_t bytes = 0;
  for (const auto& [name, b] : ucpkit::testing::tree_bytes(out)) bytes += b.size();
  EXPECT_EQ(s.bytes_written, bytes);

  formats::dcp::Reader r(iter);
  // A replicated weight in the source dtype (bf16), the fp32 master rounded.
  const Tensor w = r.read_tensor("embedding.position_embeddings.weight");
  ASSERT_EQ(w.dtype(), DType::BFloat16);
  const std::vector<float> want = truth("language_model.embedding.position_embeddings.weight", "fp32");
  ASSERT_EQ(w.numel(), static_cast<int64_t>(want.size()));
  const auto wb = w.contiguous().contiguous_bytes();
  size_t bad = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    uint16_t got;
    std::memcpy(&got, wb.data() + 2 * k, 2);
    bad += got != bf16_of(want[k]);
  }
  EXPECT_EQ(bad, 0u);
  // Its optimizer state, fp32 as the source's.
  bool found = false;
  for (const auto& e : r.metadata().entries)
    if (!e.is_bytes && e.fqn.find("exp_avg_sq") != std::string::npos &&
        e.fqn.find("embedding.position_embeddings.weight") != std::string::npos) {
      found = true;
      const Tensor t = r.read_tensor(e.fqn);
      EXPECT_EQ(t.dtype(), DType::Float32) << e.fqn;
      EXPECT_TRUE(t.contiguous().to_vector<float>() ==
                  truth("language_model.embedding.position_embeddings.weight", "exp_avg_sq"))
          << e.fqn;
    }
  EXPECT_TRUE(found);
}

TEST(TorchDistOutput, MegatronCoreBefore017GetsCommonPt) {
  const std::string out = scratch("legacy") + "/td";
  LoadOptions o = td_options(out);
  o.megatron_version = "0.16";
  EXPECT_EQ(plan_json(o)["target"]["common_state"], "common.pt");
  (void)run_load(o);
  const std::string iter = out + "/iter_0000100";
  ASSERT_TRUE(fs::exists(iter + "/common.pt"));
  // torch.save(common_state_dict) with the target's args.
  const auto common = load_torch(iter + "/common.pt");
  ASSERT_TRUE(common && common->get("args"));
  formats::dcp::Reader r(iter);
  for (const auto& e : r.metadata().entries) EXPECT_NE(e.fqn, "common_state/shard_0_1");
}

// Weights without a training run (manifest source.weights_only, what the Hugging Face import records): the
// output is Megatron's release checkpoint, folder and tracker "release" (save_checkpoint(release=True),
// training/checkpointing.py:1012 at core_v0.19.0), which its default load_checkpoint starts from as
// pretrained weights (:2473, :2555); without the flag the iteration folder. The universal folder is
// ucp-union --to-names megatron-core of the GPT source (a copy), with the flag set in its manifest.
TEST(TorchDistOutput, WeightsOnlySourceIsWrittenAsMegatronsReleaseFolder) {
  const std::string dir = scratch("release");
  const std::string mc = loadtest::gpt_megatron_core_named_copy("release");
  std::string out;
  for (const bool weights_only : {false, true}) {
    SCOPED_TRACE(weights_only);
    if (weights_only) {
      nlohmann::json m = nlohmann::json::parse(ucpkit::testing::file_bytes(mc + "/manifest.json"));
      m["source"]["weights_only"] = true;
      std::ofstream(mc + "/manifest.json") << m.dump(1);
    }
    const std::string td = dir + (weights_only ? "/release_td" : "/iter_td");
    LoadOptions o = td_options(td);
    o.input = mc;
    EXPECT_EQ(plan_json(o)["target"]["release"], weights_only);
    (void)run_load(o);
    const std::string folder = weights_only ? "release" : "iter_0000100";
    EXPECT_EQ(ucpkit::testing::file_bytes(td + "/latest_checkpointed_iteration.txt"), weights_only ? "release" : "100");
    EXPECT_TRUE(fs::exists(td + "/" + folder + "/metadata.json"));
    EXPECT_EQ(fs::exists(td + "/iter_0000100"), !weights_only);
    formats::dcp::Reader r(td + "/" + folder);
    EXPECT_EQ(r.read_tensor("embedding.position_embeddings.weight").dtype(), DType::BFloat16);
    // ucp-info names the release folder as a DeepSpeed checkpoint's tag.
    ASSERT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_BIN_DIR) + "/ucp-info --json " + ucpkit::testing::quote(td) +
                                               " 2>/dev/null",
                                           &out),
              0)
        << out;
    EXPECT_EQ(nlohmann::json::parse(out)["tag"], weights_only ? nlohmann::json("release") : nlohmann::json()) << out;
  }
}

}  // namespace torch_dist_output_test
