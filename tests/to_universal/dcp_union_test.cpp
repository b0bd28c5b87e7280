// ucp-union --input <DCP folder> and ucp-info <DCP folder>, through the tools, run from another working
// folder with relative paths: every committed real DCP checkpoint (tests/formats/dcp/data, written by
// torch 2.6's and torch 1.13's own DCP save; scripts/fixtures/dcp_fixtures.sh) becomes a universal folder whose
// state files hold the tensors the saving script recorded (<variant>.truth/tensors.safetensors: torch's
// own full_state_dict gather), bit for bit, with param_groups equal to its nontensor.json; damaged
// copies (truncated items, a length past the file, an unknown class, chunks that leave a gap, overlap
// or fall outside the tensor) fail with one line naming the file, exit 1, and leave nothing behind.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "formats/dcp/dcp_data.h"
#include "formats/universal/manifest.h"
#include "formats/universal/state_file.h"
#include "io/safetensors_file.h"
#include "io/torch/torch_file.h"
#include "support/paths.h"
#include "support/process.h"

namespace dcp_union_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using ucpkit::testing::slurp;

namespace {

const std::string& kData = ucpkit::testing::kDcpData;

// A copy of fixture `variant` at <scratch>/in/ck, and <scratch>/work, the folder the tools run in.
struct Case {
  std::string root, work, input;
};

Case case_of(const std::string& name, const std::string& variant) {
  Case c;
  c.root = ucpkit::testing::scratch_dir("dcp_union_" + name);
  c.work = c.root + "/work";
  fs::create_directories(c.work);
  c.input = c.root + "/in/ck";
  fs::create_directories(c.root + "/in");
  fs::copy(kData + "/" + variant, c.input, fs::copy_options::recursive);
  return c;
}

ucpkit::testing::SplitResult run_in(const Case& c, const std::string& tool, const std::string& args) {
  return ucpkit::testing::run_split_in(c.work, kBin + "/" + tool + " " + args, c.root);
}

std::map<std::string, SafetensorsTensor> truth_of(const std::string& variant) {
  const std::string p = kData + "/" + variant + ".truth/tensors.safetensors";
  return parse_safetensors(slurp(p), p);
}

void expect_same(const Tensor& t, const SafetensorsTensor& want) {
  EXPECT_EQ(dtype_safetensors_name(t.dtype()), want.dtype);
  EXPECT_EQ(t.shape(), want.shape);
  const auto b = t.contiguous().contiguous_bytes();
  ASSERT_EQ(b.size(), want.bytes.size());
  EXPECT_EQ(0, std::memcmp(b.data(), want.bytes.data(), b.size())) << "values differ";
}

// Every parameter's state files and step against the truth; every truth tensor used exactly once.
void expect_universal_matches_truth(const std::string& out, const std::string& variant) {
  const auto truth = truth_of(variant);
  const auto manifest = formats::universal::read_universal_manifest(out + "/manifest.json");
  EXPECT_EQ(manifest.source.format_name(), "dcp");
  std::set<std::string> used;
  for (const auto& p : manifest.params) {
    for (const auto& [state, f] : p.states) {
      SCOPED_TRACE(variant + " " + p.name + " " + state);
      const std::string key = state == "fp32" ? (truth.count("model." + p.name) ? "model." + p.name : p.name)
                                              : "optim.state." + p.name + "." + state;
      ASSERT_TRUE(truth.count(key)) << key;
      used.insert(key);
      const std::string path = out + "/" + f.file;
      const auto sf = formats::universal::read_state_file(load_torch(path), path);
      EXPECT_FALSE(sf.bare);
      if (f.source_dtype) {  // a bf16/fp16 tensor widened to float32 (issue 47): narrowed back, the truth's bits
        EXPECT_EQ(sf.param.dtype(), DType::Float32);
        expect_same(sf.param.to(*dtype_from_name(*f.source_dtype)), truth.at(key));
      } else {
        expect_same(sf.param, truth.at(key));
      }
      EXPECT_EQ(p.shape, truth.at(key).shape);
    }
    if (p.step) {
      const std::string key = "optim.state." + p.name + ".step";
      ASSERT_TRUE(truth.count(key)) << key;
      used.insert(key);
      const auto step = load_torch(out + "/zero/" + p.name + "/step.pt");
      ASSERT_TRUE(step && step->kind == pickle::Kind::Tensor);
      expect_same(step->as_tensor(), truth.at(key));
    }
  }
  // Buffers (issue 47: torch113_w2's int64 'plain' in a model-only save): each file as stored.
  for (const auto& b : manifest.buffers) {
    SCOPED_TRACE(variant + " buffer " + b.name);
    const std::string key = truth.count("model." + b.name) ? "model." + b.name : b.name;
    ASSERT_TRUE(truth.count(key)) << key;
    used.insert(key);
    const std::string path = out + "/" + b.tensor.file;
    expect_same(formats::universal::read_state_file(load_torch(path), path).param, truth.at(key));
    EXPECT_EQ(b.shape, truth.at(key).shape);
  }
  EXPECT_EQ(used.size(), truth.size()) << variant << ": truth tensors without a universal state";
}

}  // namespace

TEST(DcpUnion, EveryRealVariantBitExactAgainstTheRecordedTruth) {
  for (const std::string variant :
       {"fsdp_w2", "twod_w4", "fsdp_optim_w2", "fsdp_tp_optim_w4", "plain_w2", "ranklocal_w2", "single_item_w1",
        "torch113_w2"}) {
    SCOPED_TRACE(variant);
    const Case c = case_of("all_" + variant, variant);
    const auto r = run_in(c, "ucp-union", "--input ../in/ck --output out --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_GT(j.value("params", 0), 0);
    expect_universal_matches_truth(c.work + "/out", variant);
  }
}

TEST(DcpUnion, AdamStateAndParamGroupsFromGetStateDict) {
  const Case c = case_of("param_groups", "fsdp_optim_w2");
  const auto r = run_in(c, "ucp-union", "--input ../in/ck --output out");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto manifest = formats::universal::read_universal_manifest(c.work + "/out/manifest.json");
  ASSERT_EQ(manifest.params.size(), 12u);
  for (const auto& p : manifest.params) {
    EXPECT_EQ(p.states.size(), 3u) << p.name;  // fp32, exp_avg, exp_avg_sq
    EXPECT_TRUE(p.states.count("exp_avg") && p.states.count("exp_avg_sq")) << p.name;
    EXPECT_TRUE(p.step) << p.name;
  }
  // param_groups as nontensor.json recorded them (the saving script's json.dumps of each value).
  const auto want = nlohmann::json::parse(slurp(kData + "/fsdp_optim_w2.truth/nontensor.json"));
  const auto root = load_torch(c.work + "/out/zero/optimizer_state.pt");
  const auto groups = root->get("param_groups");
  ASSERT_TRUE(groups && groups->is_sequence());
  ASSERT_EQ(groups->items.size(), 1u);
  const auto g = groups->items[0];
  EXPECT_DOUBLE_EQ(g->get("lr")->as_float(), want["optim.param_groups.0.lr"].get<double>());
  EXPECT_DOUBLE_EQ(g->get("eps")->as_float(), want["optim.param_groups.0.eps"].get<double>());
  EXPECT_DOUBLE_EQ(g->get("weight_decay")->as_float(), want["optim.param_groups.0.weight_decay"].get<double>());
  const auto params = g->get("params");
  ASSERT_TRUE(params && params->is_sequence());
  std::string listed = "[";
  for (size_t k = 0; k < params->items.size(); ++k) listed += (k ? ", '" : "'") + params->items[k]->s + "'";
  EXPECT_EQ(listed + "]", want["optim.param_groups.0.params"].get<std::string>());
}

TEST(DcpInfo, DescribesFormatEraChunksWorldSizeAndOptimizer) {
  const Case c = case_of("info", "fsdp_tp_optim_w4");
  const auto r = run_in(c, "ucp-info", "../in/ck --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kind"], "dcp");
  EXPECT_EQ(j["dcp"]["folder"], "dcp");
  EXPECT_EQ(j["dcp"]["era"], "torch >= 2.3");
  EXPECT_EQ(j["dcp"]["world_size"], 4);
  EXPECT_EQ(j["dcp"]["optimizer"], true);
  EXPECT_EQ(j["dcp"]["optimizer_states"], (nlohmann::json{"exp_avg", "exp_avg_sq", "step"}));
  EXPECT_EQ(j["dcp"]["param_groups"], 1);
  EXPECT_EQ(j["tensors"], 12);
  EXPECT_EQ(j["ok"], true);
  const auto text = run_in(c, "ucp-info", "../in/ck");
  EXPECT_NE(text.out.find("world size 4"), std::string::npos) << text.out;

  const Case old = case_of("info_113", "torch113_w2");
  const auto o = nlohmann::json::parse(run_in(old, "ucp-info", "../in/ck --json").out);
  EXPECT_EQ(o["dcp"]["era"], "torch 1.13 (torch.distributed._shard.checkpoint)");
  EXPECT_EQ(o["dcp"]["world_size"], 2);
  EXPECT_EQ(o["dcp"]["optimizer"], false);

  const Case local = case_of("info_ranklocal", "ranklocal_w2");
  const auto l = nlohmann::json::parse(run_in(local, "ucp-info", "../in/ck --json").out);
  EXPECT_EQ(l["dcp"]["folder"], "dcp-rank-local");
  EXPECT_EQ(l["dcp"]["metadata_files"], 2);
  EXPECT_EQ(l["dcp"]["tensors_by_chunk_count"], (nlohmann::json{{"1", 12}}));  // replicas kept once
}

// A DCP save that metadata.json names torch_dist but that holds no Megatron-Core state: ucp-union
// reads it as Megatron-Core (to_universal/from_torch_dist.h, issue 30) and refuses it naming its
// .metadata (no common state), writing nothing.
TEST(DcpInfo, TorchDistFolderIsNamedAndUnionNeedsItsMegatronCoreState) {
  const Case c = case_of("torch_dist", "fsdp_w2");
  std::ofstream(c.input + "/metadata.json") << R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
    "common_backend": "torch", "common_backend_version": 1})";
  const auto info = nlohmann::json::parse(run_in(c, "ucp-info", "../in/ck --json").out);
  EXPECT_EQ(info["kind"], "torch_dist");
  EXPECT_EQ(info["dcp"]["sharded_backend"], "torch_dist");
  const auto r = run_in(c, "ucp-union", "--input ../in/ck --output out");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("../in/ck/.metadata: no common state"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(c.work + "/out"));
}

// ------------------------------------------------------------------ damage, through ucp-union

namespace {

void replace_all(const std::string& path, const std::string& from, const std::string& to) {
  std::string b = slurp(path);
  size_t n = 0;
  for (size_t at = b.find(from); at != std::string::npos; at = b.find(from, at + to.size()), ++n) b.replace(at, from.size(), to);
  ASSERT_GT(n, 0u) << "pattern not found in " << path;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
}

// ucp-union on the damaged copy: exit 1, one error line naming `file` (as the tool was given it) and
// `cause`, no output and no staging folder left in the working folder.
void expect_refused(const Case& c, const std::string& file, const std::string& cause) {
  const auto r = run_in(c, "ucp-union", "--input ../in/ck --output out");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.rfind("ucp-union: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(cause), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_empty(c.work)) << "left behind in " << c.work;
}

// Pickled torch.Size tuples of `.metadata` (protocol 4: BININT1 a, BININT1 b, TUPLE2).
std::string size2(int a, int b) { return std::string{'K', static_cast<char>(a), 'K', static_cast<char>(b), '\x86'}; }

}  // namespace

TEST(DcpUnionDamage, DataFileCutShort) {
  const Case c = case_of("cut", "fsdp_optim_w2");
  fs::resize_file(c.input + "/__0_0.distcp", fs::file_size(c.input + "/__0_0.distcp") - 300);
  expect_refused(c, "../in/ck/__0_0.distcp", "runs past the end of the file");
}

TEST(DcpUnionDamage, ItemWhoseZipLostItsTail) {
  const Case c = case_of("zip_tail", "fsdp_optim_w2");
  std::string b = slurp(c.input + "/__1_0.distcp");
  std::fill_n(b.end() - 200, 200, '\0');  // the last item's central directory, as an interrupted write leaves it
  std::ofstream(c.input + "/__1_0.distcp", std::ios::binary | std::ios::trunc) << b;
  expect_refused(c, "../in/ck/__1_0.distcp", "zip");
}

TEST(DcpUnionDamage, UnknownClassInMetadata) {
  const Case c = case_of("class", "fsdp_optim_w2");
  replace_all(c.input + "/.metadata", "ChunkStorageMetadata", "ChunkStorageMetadatX");
  expect_refused(c, "../in/ck/.metadata", "unknown class torch.distributed.checkpoint.metadata.ChunkStorageMetadatX");
}

TEST(DcpUnionDamage, ChunksLeaveAGap) {
  const Case c = case_of("gap", "fsdp_optim_w2");
  replace_all(c.input + "/.metadata", size2(16, 8), size2(15, 8));  // both row blocks of [32, 8] lose a row
  expect_refused(c, "../in/ck/.metadata", "leave a gap");
}

TEST(DcpUnionDamage, ChunksOverlap) {
  const Case c = case_of("overlap", "fsdp_optim_w2");
  replace_all(c.input + "/.metadata", size2(16, 0), size2(15, 0));  // second block starts a row early
  expect_refused(c, "../in/ck/.metadata", "overlap");
}

TEST(DcpUnionDamage, ChunkOutsideTheTensor) {
  const Case c = case_of("outside", "fsdp_optim_w2");
  replace_all(c.input + "/.metadata", size2(16, 0), size2(17, 0));
  expect_refused(c, "../in/ck/.metadata", "do not fit its size");
}

TEST(DcpUnionDamage, MissingRankOfARankLocalSave) {
  const Case c = case_of("rank_missing", "ranklocal_w2");
  fs::rename(c.input + "/rank_0", c.input + "/rank_2");
  expect_refused(c, "../in/ck", "without the metadata of rank 0");
}

TEST(DcpInfo, UniversalFolderMadeFromDcpIsDescribedAndItsChecksumsChecked) {
  const Case c = case_of("info_universal", "fsdp_optim_w2");
  ASSERT_EQ(run_in(c, "ucp-union", "--input ../in/ck --output out").rc, 0);
  const auto r = run_in(c, "ucp-info", "out --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kind"], "universal");
  EXPECT_EQ(j["tensors"], 12);
  EXPECT_EQ(j["dcp"]["world_size"], 2);
  EXPECT_EQ(j["states"], (nlohmann::json{"exp_avg", "exp_avg_sq", "fp32"}));
  // A manifest crc32 that no longer matches its state file is a failed check, exit 1.
  auto m = nlohmann::json::parse(slurp(c.work + "/out/manifest.json"));
  m["params"][0]["states"]["exp_avg"]["crc32"] = "00000000";
  std::ofstream(c.work + "/out/manifest.json", std::ios::trunc) << m.dump(1);
  const auto bad = run_in(c, "ucp-info", "out");
  EXPECT_EQ(bad.rc, 1) << bad.err;
  EXPECT_NE(bad.err.find("exp_avg.pt: crc32"), std::string::npos) << bad.err;
}

TEST(DcpUnion, DryRunSaysWhatAndWritesNothingExtractPointsToUnion) {
  const Case c = case_of("dry_run", "fsdp_optim_w2");
  const auto r = run_in(c, "ucp-union", "--input ../in/ck --output out --dry-run --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["input_kind"], "dcp");
  EXPECT_EQ(j["params"], 12);
  EXPECT_EQ(j["atomic_files"], 48);  // fp32, exp_avg, exp_avg_sq and step of each
  EXPECT_TRUE(fs::is_empty(c.work));
  const auto e = run_in(c, "ucp-extract", "--input ../in/ck --output work");
  EXPECT_EQ(e.rc, 2) << e.err;
  EXPECT_NE(e.err.find("--input ../in/ck is a dcp checkpoint: ucp-union converts it"), std::string::npos) << e.err;
  EXPECT_TRUE(fs::is_empty(c.work));
}

// One thread, two threads and two MPI ranks write the same universal folder byte for byte.
TEST(DcpUnion, SameBytesForAnyThreadCountAndUnderMpi) {
  const Case c = case_of("same_bytes", "fsdp_tp_optim_w4");
  ASSERT_EQ(run_in(c, "ucp-union", "--input ../in/ck --output one --threads 1").rc, 0);
  ASSERT_EQ(run_in(c, "ucp-union", "--input ../in/ck --output two --threads 2").rc, 0);
  std::string out;
  EXPECT_EQ(ucpkit::testing::run_command("diff -r " + c.work + "/one " + c.work + "/two", &out), 0) << out;
  if (ucpkit::testing::run_command("command -v mpirun") != 0) GTEST_SKIP() << "no mpirun";
  const auto r = ucpkit::testing::run_split_in(
      c.work,
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe " + kBin +
          "/ucp-union -q --json --input ../in/ck --output mpi2",
      c.root);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\"mpi_ranks\": 2"), std::string::npos) << r.out;
  EXPECT_EQ(ucpkit::testing::run_command("diff -r " + c.work + "/one " + c.work + "/mpi2", &out), 0) << out;
}

// A flipped bit inside a tensor item's data (the zip stays well-formed): --verify (the default) checks
// every item's record CRC-32 and refuses it naming the data file; --no-verify converts it as stored.
TEST(DcpUnionDamage, FlippedBitCaughtByTheRecordCrc) {
  const Case c = case_of("crc", "fsdp_optim_w2");
  const auto truth = truth_of("fsdp_optim_w2");
  const auto& want = truth.at("model.tok_embeddings.weight").bytes;  // rows 0..15 are rank 0's first item
  const std::string rows(want.begin(), want.begin() + 16 * 8 * 4);
  std::string b = slurp(c.input + "/__0_0.distcp");
  const size_t at = b.find(rows);
  ASSERT_NE(at, std::string::npos);
  b[at + 100] ^= 0x01;
  std::ofstream(c.input + "/__0_0.distcp", std::ios::binary | std::ios::trunc) << b;
  expect_refused(c, "../in/ck/__0_0.distcp", "CRC");
  const auto r = run_in(c, "ucp-union", "--input ../in/ck --output out --no-verify");
  EXPECT_EQ(r.rc, 0) << r.err;
}

}  // namespace dcp_union_test
