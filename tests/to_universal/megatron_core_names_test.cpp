// ucp-union --to-names (issue 30 part B): Megatron-DeepSpeed checkpoints written by the generator
// (tests/formats/fixtures.py: GPT TP 2 x PP 2 with GPTModelPipe names, Llama GQA + SwiGLU TP 2 under
// BF16_Optimizer, native MoE DP 4 x EP 2) -> universal folder in Megatron-Core names, checked against the
// generator's truth with names and QKV order derived from Megatron-Core's code (check_mcore_names.py) ->
// back to Megatron-DeepSpeed names (the first universal folder byte for byte) -> ucp-load at the source
// layout, every file's tensors equal to the source's (tests/reshard/compare_target.py, optimizer moments
// included). Plus the Llama family's names and shapes against a real Megatron-Core save, and refusals.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <map>
#include <ostream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/megatron_core/mcore_data.h"
#include "io/torch/torch_file.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace megatron_core_names_test {

namespace fs = std::filesystem;
using ucpkit::testing::file_bytes;
using ucpkit::testing::quote;
using ucpkit::testing::run_command;
using ucpkit::testing::tree_bytes;

namespace {

// The fixtures of tests/formats (tests/to_universal/fixtures_from.txt).
const std::string kFormatsFx = UCPKIT_BUILD_DIR "/fixtures/formats";

// Runs `cmd` in `cwd` (the tools are called as users call them: relative paths, another folder).
int in(const fs::path& cwd, const std::string& cmd, std::string* out) {
  return run_command("cd " + quote(cwd.string()) + " && " + cmd, out);
}

std::string rel(const fs::path& p, const fs::path& from) { return quote(fs::relative(p, from).string()); }

struct Case {
  const char* fixture;  // tests/formats/fixtures.py
  const char* family;   // the shipped map ucp-union picks
  int dp;               // the source's DP (ucp-load needs it; the rest defaults to the source)
};

// Test listings name the fixture (not the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture; }

class MegatronCoreNames : public ::testing::TestWithParam<Case> {};

TEST_P(MegatronCoreNames, RoundTripIsBitExact) {
  const Case c = GetParam();
  const fs::path dir = ucpkit::testing::scratch_dir(std::string("mcnames_") + c.fixture);
  const fs::path src = fs::path(kFormatsFx) / c.fixture, truth = src / "truth";
  std::string out;
  // DeepSpeed checkpoint -> Megatron-Core names in one step; the family said on stderr.
  ASSERT_EQ(in(dir, kBin + "/ucp-union --input " + rel(src, dir) + " --output mc --to-names megatron-core", &out), 0)
      << out;
  EXPECT_NE(out.find(std::string("model family ") + c.family), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "latest_universal"));
  for (const auto& e : fs::directory_iterator(dir))  // no intermediate folder left beside the output
    EXPECT_TRUE(e.path().filename() == "mc") << e.path();
  // Names, values and the QKV order against the generator's truth (independent of our map files).
  EXPECT_EQ(run_command(kPy + " " + kSrc + "/tests/formats/megatron_core/check_mcore_names.py " +
                            quote((dir / "mc").string()) + " " + quote(truth.string()),
                        &out),
            0)
      << out;
  // ucp-info describes the folder from its manifest (no DeepSpeed model files to check) and verifies
  // every state's crc32.
  ASSERT_EQ(in(dir, kBin + "/ucp-info --verify --json mc", &out), 0) << out;
  EXPECT_NE(out.find("Megatron-Core names (ucp-union --to-names megatron-core)"), std::string::npos) << out;
  EXPECT_EQ(out.find("\"failed\""), std::string::npos) << out;
  // The two-step path (the universal folder first) writes the same folder.
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input " + rel(src, dir) + " --output ds", &out), 0) << out;
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input ds --output mc2 --to-names megatron-core", &out), 0) << out;
  EXPECT_TRUE(tree_bytes((dir / "mc").string()) == tree_bytes((dir / "mc2").string()));
  // Back to Megatron-DeepSpeed names: the first universal folder, every file byte for byte.
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input mc --output ds2 --to-names megatron-deepspeed", &out), 0) << out;
  const auto a = tree_bytes((dir / "ds").string()), b = tree_bytes((dir / "ds2").string());
  EXPECT_GT(a.size(), 20u);
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [path, bytes] : a) {
    auto it = b.find(path);
    ASSERT_NE(it, b.end()) << path;
    EXPECT_TRUE(bytes == it->second) << path << " differs";
  }
  // ucp-load at the source layout: every file's tensors equal to the source's.
  ASSERT_EQ(in(dir, kBin + "/ucp-load -q --input ds2 --output target --dp " + std::to_string(c.dp), &out), 0) << out;
  EXPECT_EQ(run_command(kPy + " " + kSrc + "/tests/reshard/compare_target.py " + quote((dir / "target").string()) + " " +
                            quote(src.string()) + " " + quote(truth.string()),
                        &out),
            0)
      << out;

  // Through Megatron-Core's torch_dist (issue 30 part A's writer and reader): ucp-load --format torch_dist
  // (at the source's TP / PP / EP / DP, from the common state this folder carries), ucp-union of that
  // save: every parameter's states carry the same elements (manifest crc32) under the same names and
  // shapes; back to Megatron-DeepSpeed names with --template: the first universal folder byte for byte.
  ASSERT_EQ(in(dir, kBin + "/ucp-load -q --input mc --output td --format torch_dist", &out), 0) << out;
  // DeepSpeed -> torch_dist in one pass (ucp-load --format torch_dist of the DeepSpeed checkpoint itself, or
  // of its Megatron-DeepSpeed universal folder): the names mapped on the way, said on stderr; the same
  // files byte for byte as the two runs (--to-names megatron-core, then ucp-load), written to the same path
  // (.metadata names the folder), at the source layout and at TP 1 x PP 1 x EP 1 x DP 2.
  for (const std::string& input : {rel(src, dir), std::string("ds")}) {
    const auto two_runs = tree_bytes((dir / "td").string());
    fs::rename(dir / "td", dir / "td_two_runs");
    ASSERT_EQ(in(dir, kBin + "/ucp-load --input " + input + " --output td --format torch_dist", &out), 0) << out;
    EXPECT_NE(out.find("Megatron-DeepSpeed names written as Megatron-Core's (model family " + std::string(c.family)),
              std::string::npos) << out;
    EXPECT_GT(two_runs.size(), 3u);
    EXPECT_TRUE(tree_bytes((dir / "td").string()) == two_runs) << input;
    fs::remove_all(dir / "td_two_runs");
  }
  const std::string mesh = " --tp 1 --pp 1 --ep 1 --dp 2";
  ASSERT_EQ(in(dir, kBin + "/ucp-load -q --input mc --output td2 --format torch_dist" + mesh, &out), 0) << out;
  fs::rename(dir / "td2", dir / "td2_two_runs");
  ASSERT_EQ(in(dir, kBin + "/ucp-load -q --input " + rel(src, dir) + " --output td2 --format torch_dist" + mesh, &out), 0)
      << out;
  EXPECT_TRUE(tree_bytes((dir / "td2").string()) == tree_bytes((dir / "td2_two_runs").string()));
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input td --output mctd", &out), 0) << out;
  const auto m1 = nlohmann::json::parse(file_bytes((dir / "mc/manifest.json").string()));
  const auto m2 = nlohmann::json::parse(file_bytes((dir / "mctd/manifest.json").string()));
  std::map<std::string, nlohmann::json> p2;
  for (const auto& p : m2["params"]) p2[p["name"].get<std::string>()] = p;
  EXPECT_EQ(m1["params"].size(), p2.size());
  for (const auto& p : m1["params"]) {
    const std::string name = p["name"];
    ASSERT_TRUE(p2.count(name)) << name;
    EXPECT_EQ(p["shape"], p2[name]["shape"]) << name;
    for (const auto& [state, f] : p["states"].items())
      EXPECT_EQ(f["crc32"], p2[name]["states"][state]["crc32"]) << name << " " << state;
  }
  EXPECT_EQ(in(dir, kBin + "/ucp-union -q --input mctd --output x --to-names megatron-deepspeed", &out), 1) << out;
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input mctd --output ds3 --to-names megatron-deepspeed --template ds", &out), 0)
      << out;
  EXPECT_TRUE(tree_bytes((dir / "ds").string()) == tree_bytes((dir / "ds3").string()));

  // torch_dist -> DeepSpeed in one pass (ucp-load --input <torch_dist> --template): no universal folder
  // written, each stored state read once; the same files byte for byte as the three runs above followed by
  // ucp-load, at the source layout (and there every tensor equal to the source checkpoint's) and at
  // TP 1 x PP 1 x DP 2.
  const std::string dp = std::to_string(c.dp);
  ASSERT_EQ(in(dir, kBin + "/ucp-load -q --input td --template ds --output one --dp " + dp, &out), 0) << out;
  ASSERT_EQ(in(dir, kBin + "/ucp-load -q --input ds3 --output three --dp " + dp, &out), 0) << out;
  EXPECT_TRUE(tree_bytes((dir / "one").string()) == tree_bytes((dir / "three").string()));
  EXPECT_EQ(run_command(kPy + " " + kSrc + "/tests/reshard/compare_target.py " + quote((dir / "one").string()) + " " +
                            quote(src.string()) + " " + quote(truth.string()),
                        &out),
            0)
      << out;
  const std::string other = " --tp 1 --pp 1 --dp 2";
  ASSERT_EQ(in(dir, kBin + "/ucp-load -q --input td --template ds --output one2" + other, &out), 0) << out;
  ASSERT_EQ(in(dir, kBin + "/ucp-load -q --input ds3 --output three2" + other, &out), 0) << out;
  const auto o1 = tree_bytes((dir / "one2").string()), o3 = tree_bytes((dir / "three2").string());
  EXPECT_GT(o1.size(), 2u);
  EXPECT_TRUE(o1 == o3);
  // The template may also be the Megatron-Core-named folder (its record gives the names).
  ASSERT_EQ(in(dir, kBin + "/ucp-load -q --input td --template mc --output one3 --dp " + dp, &out), 0) << out;
  EXPECT_TRUE(tree_bytes((dir / "one3").string()) == tree_bytes((dir / "three").string()));
}

INSTANTIATE_TEST_SUITE_P(Families, MegatronCoreNames,
                         ::testing::Values(Case{"gpt_tp2pp2dp2_gpu", "gpt", 2},
                                           Case{"llama_tp2_bf16opt", "llama-gqa-swiglu", 1},
                                           Case{"llama_tp2pp2dp2", "llama-gqa-swiglu", 2},
                                           Case{"moe_line_0.14", "deepspeed-moe", 4},
                                           Case{"dsmoe_nobias_ep2dp2", "deepspeed-moe", 2}),
                         [](const auto& info) {
                           std::string s = info.param.family;
                           if (std::string(info.param.fixture) == "dsmoe_nobias_ep2dp2") s += "_no_linear_bias";
                           if (std::string(info.param.fixture) == "llama_tp2pp2dp2") s += "_tp2pp2";
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

std::map<std::string, nlohmann::json> names_and_shapes(const fs::path& universal) {
  std::map<std::string, nlohmann::json> m;
  const auto manifest = nlohmann::json::parse(file_bytes((universal / "manifest.json").string()));
  for (const auto& p : manifest["params"]) m[p["name"].get<std::string>()] = p["shape"];
  return m;
}

// The Llama GQA + SwiGLU map's Megatron-Core names and shapes are those of a real Megatron-Core save of the
// same sizes (tests/formats/megatron_core/data/llama_gqa_tp2_dp2_v016: hidden 16, 4 heads, 2 query groups,
// ffn 32, vocabulary 96, 2 layers; README there): its model keys as Megatron's own reader returns them
// (the truth manifest, stacked layers split per layer), and ucp-union's universal folder of that save.
TEST(MegatronCoreNamesReal, LlamaNamesAndShapesMatchARealMegatronCoreSave) {
  const fs::path dir = ucpkit::testing::scratch_dir("mcnames_llama_real");
  std::string out;
  ASSERT_EQ(run_command(kPy + " " + kSrc + "/tests/generator/gen_ds_checkpoint.py --output " + quote((dir / "src").string()) +
                            " --model llama --tp 2 --layers 2 --hidden 16 --heads 4 --kv-heads 2 --ffn 32 --vocab 96 --no-truth",
                        &out),
            0)
      << out;
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input src --output mc --to-names megatron-core", &out), 0) << out;
  const auto ours = names_and_shapes(dir / "mc");

  const fs::path real = fs::path(ucpkit::testing::kMcoreData) / "llama_gqa_tp2_dp2_v016";
  std::map<std::string, nlohmann::json> megatron;
  const auto truth = nlohmann::json::parse(file_bytes((real / "fully_reshardable.truth/manifest.json").string()));
  const std::string stacked = "decoder.layers.";
  for (const auto& [key, t] : truth["tensors"].items()) {
    if (key.rfind("optimizer.", 0) == 0) continue;
    if (key.rfind(stacked, 0) == 0 && !std::isdigit(static_cast<unsigned char>(key[stacked.size()]))) {
      auto shape = t["shape"];
      const int layers = shape[0];
      shape.erase(0);
      for (int l = 0; l < layers; ++l) megatron[stacked + std::to_string(l) + "." + key.substr(stacked.size())] = shape;
    } else {
      megatron[key] = t["shape"];
    }
  }
  EXPECT_EQ(ours, megatron);
  // ucp-union's own universal folder of that save (Megatron-Core names, docs/formats-megatron-core.md).
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input " + rel(real / "fully_reshardable", dir) + " --output fromreal", &out), 0)
      << out;
  EXPECT_EQ(ours, names_and_shapes(dir / "fromreal"));
}

TEST(MegatronCoreNamesRefusals, WrongInputsAndOptionsAreRefusedAndNothingIsWritten) {
  const fs::path dir = ucpkit::testing::scratch_dir("mcnames_refusals");
  const fs::path gpt = fs::path(kFormatsFx) / "gpt_tp2pp2dp2_gpu";
  std::string out;
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input " + rel(gpt, dir) + " --output ds", &out), 0) << out;
  // Usage errors: exit 2.
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input ds --output x --to-names hf", &out), 2) << out;
  EXPECT_NE(out.find("--to-names"), std::string::npos) << out;
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input ds --output x --model-map m.json", &out), 2) << out;
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input ds --output x --to-names megatron-core --dry-run", &out), 2) << out;
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input ds --output ds/x --to-names megatron-core", &out), 2) << out;
  EXPECT_FALSE(fs::exists(dir / "ds" / "x"));
  // A Megatron-DeepSpeed-named folder has no way back to take.
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input ds --output x --to-names megatron-deepspeed", &out), 1) << out;
  EXPECT_NE(out.find("already has Megatron-DeepSpeed names"), std::string::npos) << out;
  // A map that does not name every parameter (the Llama map has no position embedding): the file and
  // the parameter named.
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input ds --output x --to-names megatron-core --model-map " +
                        quote(kSrc + "/patterns/megatron-core/llama-gqa-swiglu.json"),
               &out),
            1)
      << out;
  EXPECT_NE(out.find("llama-gqa-swiglu.json: no rule maps parameter 'tied_modules.embed.position_embeddings.weight'"),
            std::string::npos)
      << out;
  // A Megatron-Core-named folder of a torch_dist save has no Megatron-DeepSpeed record.
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input " +
                        rel(fs::path(ucpkit::testing::kMcoreData) / "gpt_tp2_pp2/fully_reshardable", dir) + " --output real",
               &out),
            0)
      << out;
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input real --output x --to-names megatron-deepspeed", &out), 1) << out;
  EXPECT_NE(out.find("megatron_core_names"), std::string::npos) << out;
  EXPECT_NE(out.find("--template"), std::string::npos) << out;
  // --template belongs to the way back, and names a universal folder.
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input ds --output x --to-names megatron-core --template ds", &out), 2) << out;
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input real --output x --to-names megatron-deepspeed --template " +
                        rel(gpt, dir), &out),
            1)
      << out;
  EXPECT_NE(out.find("--template must be a universal folder"), std::string::npos) << out;
  // A template of another model: its Megatron-Core names are not the input's.
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input real --output x --to-names megatron-deepspeed --template ds", &out), 1)
      << out;
  // Twice to Megatron-Core names.
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input ds --output mc --to-names megatron-core", &out), 0) << out;
  EXPECT_EQ(in(dir, kBin + "/ucp-union --input mc --output x --to-names megatron-core", &out), 1) << out;
  EXPECT_NE(out.find("already has Megatron-Core names"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "x"));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".x."), std::string::npos) << e.path() << " left behind";
}

// ucp-load --input <torch_dist> --template: what is refused, with the cause named; nothing written.
TEST(MegatronCoreNamesRefusals, OnePassTorchDistLoadRefusalsNameTheCause) {
  const fs::path dir = ucpkit::testing::scratch_dir("mcnames_onepass_refusals");
  const fs::path gpt = fs::path(kFormatsFx) / "gpt_tp2pp2dp2_gpu";
  const std::string real = rel(fs::path(ucpkit::testing::kMcoreData) / "gpt_tp2_pp2/fully_reshardable", dir);
  std::string out;
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input " + rel(gpt, dir) + " --output ds", &out), 0) << out;
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input ds --output mc --to-names megatron-core", &out), 0) << out;
  // Without --template a torch_dist save has no DeepSpeed model files: the option that supplies them named.
  EXPECT_EQ(in(dir, kBin + "/ucp-load --input " + real + " --output x --dp 1", &out), 1) << out;
  EXPECT_NE(out.find("--template"), std::string::npos) << out;
  // Usage errors (exit 2): another format, --model-map alone, --exchange off, --device cuda.
  EXPECT_EQ(in(dir, kBin + "/ucp-load --input " + real + " --output x --template ds --format dcp", &out), 2) << out;
  EXPECT_EQ(in(dir, kBin + "/ucp-load --input ds --output x --dp 1 --model-map m.json", &out), 2) << out;
  EXPECT_EQ(in(dir, kBin + "/ucp-load --input mc --output x --format torch_dist --model-map m.json", &out), 2) << out;
  // --format torch_dist of a DeepSpeed checkpoint no shipped map names (a real engine's plain model): the
  // parameter left and the option named, exit 1, nothing left.
  EXPECT_EQ(in(dir, kBin + "/ucp-load --input " + rel(fs::path(kSrc) / "tests/generator/engine/dense_blocks_v0.19.5", dir) +
                        " --output x --format torch_dist", &out),
            1)
      << out;
  EXPECT_NE(out.find("no shipped Megatron-Core map"), std::string::npos) << out;
  EXPECT_NE(out.find("--model-map"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "x"));
  EXPECT_EQ(in(dir, kBin + "/ucp-load --input " + real + " --output x --dp 1 --template ds --exchange off", &out), 2)
      << out;
  // The input must be a torch_dist save; a Megatron-Core-named universal folder is pointed to ucp-union.
  EXPECT_EQ(in(dir, kBin + "/ucp-load --input mc --output x --dp 1 --template ds", &out), 1) << out;
  EXPECT_NE(out.find("--to-names megatron-deepspeed --template"), std::string::npos) << out;
  // The template must be a universal folder, of the same model (a parameter of the template missing in
  // the save is named).
  EXPECT_EQ(in(dir, kBin + "/ucp-load --input " + real + " --output x --dp 1 --template " + rel(gpt, dir), &out), 1)
      << out;
  EXPECT_NE(out.find("--template must be a universal folder"), std::string::npos) << out;
  EXPECT_EQ(in(dir, kBin + "/ucp-load --input " + real + " --output x --dp 1 --template ds", &out), 1) << out;
  EXPECT_NE(out.find("is missing"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "x"));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".x."), std::string::npos) << e.path() << " left behind";
}

}  // namespace

// What Megatron-Core's load_checkpoint reads from the common state and objects of a torch_dist save
// (docs/megatron-core-mapping.md "Megatron-Core's own load_checkpoint"), for a Megatron-DeepSpeed source,
// against a real Megatron-Core save of the same sizes (llama_gqa_tp2_dp2_v016, written by Megatron's
// save_checkpoint; its common state and objects as ucp-union keeps them): the same ._extra_state object
// keys with the same bytes, the same content metadata and param_state_sharding_type, per group the keys
// DistributedOptimizer.load_state_dict pairs groups by (distrib_optimizer.py:937-970) with the real save's
// wd_mult / lr_mult / is_expert_parallel / is_decoupled_lr, the scheduler keys Megatron reads, and the
// architecture args Megatron-Core names differently (num_query_groups etc.) equal to the real save's.
TEST(MegatronCoreNamesReal, LlamaCommonStateHasWhatMegatronCoreLoadReads) {
  const fs::path dir = ucpkit::testing::scratch_dir("mcnames_llama_common");
  std::string out;
  ASSERT_EQ(run_command(kPy + " " + kSrc + "/tests/generator/gen_ds_checkpoint.py --output " + quote((dir / "src").string()) +
                            " --model llama --tp 2 --layers 2 --hidden 16 --heads 4 --kv-heads 2 --ffn 32 --vocab 96 --no-truth",
                        &out),
            0)
      << out;
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input src --output mc --to-names megatron-core", &out), 0) << out;
  const fs::path real = fs::path(ucpkit::testing::kMcoreData) / "llama_gqa_tp2_dp2_v016";
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input " + rel(real / "fully_reshardable", dir) + " --output fromreal", &out), 0)
      << out;
  const auto ours = ucpkit::load_torch((dir / "mc/megatron_core/common_state.pt").string());
  const auto theirs = ucpkit::load_torch((dir / "fromreal/megatron_core/common_state.pt").string());

  // ._extra_state objects: same keys, each a torch.save of the same value ([None]).
  const auto decoded = [](const fs::path& file) {
    std::map<std::string, std::string> m;
    const auto root = ucpkit::load_torch(file.string());
    for (const auto& [k, v] : root->entries) {
      const auto* b = reinterpret_cast<const uint8_t*>(v->s.data());
      m[k->as_str()] = ucpkit::load_torch_bytes({b, v->s.size()}, k->as_str()).root->repr();
    }
    return m;
  };
  const auto o1 = decoded(dir / "mc/megatron_core/objects.pt"), o2 = decoded(dir / "fromreal/megatron_core/objects.pt");
  EXPECT_EQ(o2.size(), 8u);
  EXPECT_EQ(o1, o2);

  // content_metadata and the optimizer's sharding type.
  const auto cm = ours->get("content_metadata"), rcm = theirs->get("content_metadata");
  ASSERT_TRUE(cm && rcm);
  for (const char* k : {"distrib_optim_sharding_type", "distrib_optim_fully_reshardable_mem_efficient",
                        "singleton_local_shards", "chained_optim_avoid_prefix"})
    EXPECT_EQ(cm->at(k)->repr(), rcm->at(k)->repr()) << k;
  EXPECT_EQ(ours->at("optimizer")->at("param_state_sharding_type")->repr(),
            theirs->at("optimizer")->at("param_state_sharding_type")->repr());
  // Param groups: as many, each with the identifier keys; the structural ones equal to the real save's.
  const auto& g1 = ours->at("optimizer")->at("optimizer")->at("param_groups")->items;
  const auto& g2 = theirs->at("optimizer")->at("optimizer")->at("param_groups")->items;
  ASSERT_EQ(g1.size(), g2.size());
  for (size_t i = 0; i < g1.size(); ++i) {
    for (const char* k : {"wd_mult", "lr_mult", "is_expert_parallel", "is_decoupled_lr"})
      EXPECT_EQ(g1[i]->at(k)->repr(), g2[i]->at(k)->repr()) << "group " << i << " " << k;
    for (const char* k : {"max_lr", "min_lr", "step"}) EXPECT_TRUE(g1[i]->contains(k)) << "group " << i << " " << k;
  }
  // Scheduler: the keys OptimizerParamScheduler.load_state_dict reads, the real save's key set.
  std::set<std::string> s1, s2;
  for (const auto& [k, v] : ours->at("opt_param_scheduler")->entries) s1.insert(k->as_str());
  for (const auto& [k, v] : theirs->at("opt_param_scheduler")->entries) s2.insert(k->as_str());
  EXPECT_EQ(s1, s2);
  EXPECT_TRUE(ours->contains("num_floating_point_operations_so_far"));
  // Args Megatron-Core names differently from Megatron-DeepSpeed, equal to the real save's.
  const auto a1 = ours->at("args"), a2 = theirs->at("args");
  for (const char* k : {"num_query_groups", "group_query_attention", "kv_channels", "ffn_hidden_size", "num_layers",
                        "hidden_size", "num_attention_heads", "swiglu", "untie_embeddings_and_output_weights",
                        "use_distributed_optimizer", "ckpt_format", "padded_vocab_size"}) {
    ASSERT_TRUE(a1->attr(k)) << k;
    EXPECT_EQ(a1->attr(k)->repr(), a2->attr(k)->repr()) << k;
  }
}

// Native MoE (mixed dense / MoE layers: Megatron-Core's per-layer keys): the ._extra_state objects written
// for a generated DeepSpeed MoE (2 layers, layer 1 MoE with 4 experts, EP 2) are the ShardedObjects of the
// real Megatron-Core MoE save moe_ep2 (same layer pattern and expert count; Megatron's own
// load_sharded_metadata listing in its truth manifest), less the shared expert's (the DeepSpeed model has
// none) and the common state.
TEST(MegatronCoreNamesReal, MoeExtraStateObjectsAreThoseOfARealMegatronCoreMoeSave) {
  const fs::path dir = ucpkit::testing::scratch_dir("mcnames_moe_objects");
  std::string out;
  ASSERT_EQ(run_command(kPy + " " + kSrc + "/tests/generator/gen_ds_checkpoint.py --output " + quote((dir / "src").string()) +
                            " --model dsmoe --layers 2 --experts 4 --dp 2 --ep 2 --no-truth",
                        &out),
            0)
      << out;
  ASSERT_EQ(in(dir, kBin + "/ucp-union -q --input src --output mc --to-names megatron-core", &out), 0) << out;
  std::set<std::string> ours, megatron;
  const auto objects = ucpkit::load_torch((dir / "mc/megatron_core/objects.pt").string());
  for (const auto& [k, v] : objects->entries) ours.insert(k->as_str());
  const fs::path real = fs::path(ucpkit::testing::kMcoreData) / "moe_ep2";
  const auto truth = nlohmann::json::parse(file_bytes((real / "fully_reshardable.truth/manifest.json").string()));
  for (const auto& o : truth["objects"]) {
    const std::string key = o["key"];
    if (key.find("_extra_state") != std::string::npos && key.find("shared_experts") == std::string::npos)
      megatron.insert(key);
  }
  EXPECT_EQ(megatron.size(), 14u);
  EXPECT_EQ(ours, megatron);
}

}  // namespace megatron_core_names_test
