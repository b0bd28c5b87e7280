// pec-save / pec-restore on native DeepSpeed MoE whose blocks are not Megatron's `layers.N` (issue 33):
// an expert's MoE layer is the L of the expert file holding it (DeepSpeed's moe_layer_id), and the
// optimizer shards' expert fragments are matched to it by name (lib/pec/checkpoint.cpp open_native).
// The tools before found the layer with a `layers.N` regex and refused `blocks.N` checkpoints
// ("expert parameter without a layer index"). Truth: each step's checkpoint from the generator
// (tests/generator, --block-prefix blocks, its own seed per step) and ucp-union's atomic tensors of it
// (checked against the generator's truth by MoeBlockNames.*): with K = 1 every expert of the restored
// checkpoint must be, bit for bit, that of the step the report names, and everything else that of the
// last step. The same on a chain DeepSpeed's real engine saved.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace moe_layers_blocks_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::testing::file_bytes;

namespace {

// UCPKIT_TEST_BIN (support/paths.h) runs these against other tools (the tools before issue 33 refuse the checkpoint).
const int64_t kSteps[] = {100, 200, 300};

int sh(const std::string& cmd, std::string* out = nullptr) { return ucpkit::testing::run_command(cmd, out); }

json read_json(const fs::path& p) { return json::parse(file_bytes(p.string())); }

// zero/<param> folder -> (MoE layer, global expert) of a universal folder's expert entries; dense: absent.
std::map<std::string, std::pair<int, int>> experts_of(const fs::path& universal) {
  std::map<std::string, std::pair<int, int>> out;
  const json manifest = read_json(universal / "manifest.json");
  for (const auto& p : manifest["params"])
    if (p.contains("expert") && p["expert"].is_object())
      out[p["name"]] = {p["expert"]["layer"].get<int>(), p["expert"]["global_id"].get<int>()};
  return out;
}

// pec-save (sequential, K = 1) of every checkpoint of `chain` (step -> folder with `latest`) into one
// store, pec-restore of the last, and the check: each expert (its file and, through ucp-union, its
// fp32 / exp_avg / exp_avg_sq) is the one of the step the report names, the rest the last step's.
// `experts`: MoE layers x experts; `tensors`: parameters per expert.
void expect_k1_restore(const fs::path& dir, const std::map<int64_t, fs::path>& chain, size_t experts, size_t tensors) {
  std::string out;
  for (const auto& [s, ck] : chain) {
    ASSERT_EQ(sh(kBin + "/pec-save -q --checkpoint " + ck.string() + " --store " + (dir / "store").string() + " --step " +
                     std::to_string(s) + " --policy sequential --k 1", &out), 0) << out;
    ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + ck.string() + " --output " + (dir / ("u" + std::to_string(s))).string(), &out), 0)
        << out;
  }
  const int64_t last = chain.rbegin()->first;
  ASSERT_EQ(sh(kBin + "/pec-restore -q --store " + (dir / "store").string() + " --output " + (dir / "out").string() +
                   " --report " + (dir / "report.json").string(), &out), 0) << out;
  const json report = read_json(dir / "report.json");
  EXPECT_EQ(report["step"], last);
  std::map<std::pair<int, int>, int64_t> from;
  std::set<int64_t> steps;
  for (const auto& e : report["experts"]) {
    from[{e["moe_layer"].get<int>(), e["expert"].get<int>()}] = e["restored_step"].get<int64_t>();
    steps.insert(e["restored_step"].get<int64_t>());
  }
  ASSERT_EQ(from.size(), experts);
  EXPECT_GT(steps.size(), 1u);  // K = 1 of 4 per step: experts come from several steps
  // Expert files are stored whole: each the same bytes as its step's.
  const fs::path restored = dir / "out" / ("global_step" + std::to_string(last));
  for (const auto& [le, s] : from) {
    const std::string f = "layer_" + std::to_string(le.first) + "_expert_" + std::to_string(le.second) + "_mp_rank_00_model_states.pt";
    EXPECT_TRUE(file_bytes((restored / f).string()) == file_bytes((chain.at(s) / ("global_step" + std::to_string(s)) / f).string()))
        << f << " is not step " << s << "'s";
  }
  // The optimizer shards' expert fragments and everything else, through the atomic tensors.
  ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + (dir / "out").string() + " --output " + (dir / "ur").string(), &out), 0) << out;
  const auto names = experts_of(dir / "ur");
  ASSERT_EQ(names.size(), experts * tensors);
  size_t compared = 0, dense = 0;
  for (const auto& e : fs::directory_iterator(dir / "ur" / "zero")) {
    if (!e.is_directory()) continue;
    const std::string param = e.path().filename().string();
    auto it = names.find(param);
    dense += it == names.end();
    const int64_t s = it == names.end() ? last : from.at(it->second);
    for (const char* state : {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"}) {
      const fs::path ours = e.path() / state, theirs = dir / ("u" + std::to_string(s)) / "zero" / param / state;
      EXPECT_TRUE(file_bytes(ours.string()) == file_bytes(theirs.string())) << param << "/" << state << " is not step " << s << "'s";
      ++compared;
    }
  }
  EXPECT_GT(dense, 0u);
  EXPECT_EQ(compared, 3 * (experts * tensors + dense));
}

TEST(PecMoeLayers, BlocksNamedCheckpointsRestoreEachExpertFromTheStepTheReportNames) {
  const fs::path dir = ucpkit::testing::scratch_dir("pec_moe_blocks");
  std::string out;
  std::map<int64_t, fs::path> chain;
  for (size_t i = 0; i < std::size(kSteps); ++i) {
    const int64_t s = kSteps[i];
    chain[s] = dir / ("step" + std::to_string(s));
    ASSERT_EQ(sh(kPy + " " + kSrc + "/tests/generator/gen_ds_checkpoint.py --output " + chain[s].string() +
                     " --model dsmoe --block-prefix blocks --dp 4 --ep 2 --layers 4 --experts 4 --hidden 16 --heads 2"
                     " --ffn 32 --vocab 64 --seq 8 --no-truth --step " + std::to_string(s) + " --seed " + std::to_string(11 + i),
                 &out), 0) << out;
  }
  expect_k1_restore(dir, chain, 8, 4);  // 2 MoE layers (blocks 1 and 3) x 4 experts; dense_h_to_4h / 4h_to_h weight, bias
  fs::remove_all(dir);
}

// The same on checkpoints DeepSpeed's real engine saved after steps 1, 2 and 3 of one run (v0.14.5,
// DP 2, EP 2, ZeRO-1; tests/generator/engine/moe_tutorial_v0.14.5: step 3 is the fixture itself, the
// run's saves after steps 1 and 2 are chain/, see PROVENANCE.md).
TEST(PecMoeLayers, RealEngineChainRestoresEachExpertFromTheStepTheReportNames) {
  const fs::path dir = ucpkit::testing::scratch_dir("pec_moe_engine");
  const fs::path fixture = fs::path(kSrc) / "tests/generator/engine/moe_tutorial_v0.14.5";
  expect_k1_restore(dir, {{1, fixture / "chain" / "step1"}, {2, fixture / "chain" / "step2"}, {3, fixture}}, 8, 2);
  fs::remove_all(dir);
}

// The same on DeepSpeed v0.19.5's engine (torch 2.6; tests/generator/engine/moe_tutorial_v0.19.5, the same
// model and run, saved by the v0.19 line: its optimizer shards hold the experts' fragments, no expp_rank files).
TEST(PecMoeLayers, RealEngineV019ChainRestoresEachExpertFromTheStepTheReportNames) {
  const fs::path dir = ucpkit::testing::scratch_dir("pec_moe_engine_v019");
  const fs::path fixture = fs::path(kSrc) / "tests/generator/engine/moe_tutorial_v0.19.5";
  expect_k1_restore(dir, {{1, fixture / "chain" / "step1"}, {2, fixture / "chain" / "step2"}, {3, fixture}}, 8, 2);
  fs::remove_all(dir);
}

}  // namespace

}  // namespace moe_layers_blocks_test
