// Native DeepSpeed MoE whose blocks are not Megatron's `layers.N` (issue 33 items 2 and 4). An expert's
// MoE layer is DeepSpeed's moe_layer_id, the L of the expert file holding it (engine.py
// _save_moe_checkpoint), whatever the module names. The old tools recorded layer -1 for every expert of
// a `blocks.N` model and ucp-load then merged both MoE layers into layer_0_* files (exit 0). Checked
// against the generator's truth (tests/generator/dsgen/dsmoe.py rename_blocks, truth/meta.json), and
// the union -> load EP 4 -> union round trip bit for bit. Item 4: a native-MoE universal folder gets
// no latest_universal unless --tag-latest-universal asks (DeepSpeed's load_universal loads the wrong
// experts from it); ucp-union prints the ucp-load command instead.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/deepspeed/moe.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace moe_block_names_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::testing::file_bytes;

namespace {

// UCPKIT_TEST_BIN (support/paths.h) runs these against other tools (the tools before issue 33 fail every test here).

int sh(const std::string& cmd, std::string* out = nullptr) { return ucpkit::testing::run_command(cmd, out); }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  json j;
  in >> j;
  return j;
}

// A native-MoE checkpoint (DP 2, EP 2, 4 blocks: MoE blocks 1 and 3 with 4 experts each) from the generator.
fs::path generate(const fs::path& dir, const std::string& name, const std::string& extra) {
  const fs::path out = dir / name;
  std::string log;
  EXPECT_EQ(sh(kPy + " " + kSrc + "/tests/generator/gen_ds_checkpoint.py --output " + out.string() +
                   " --model dsmoe --dp 2 --ep 2 --layers 4 --experts 4 --hidden 16 --heads 2 --ffn 32 --vocab 64 --seq 8 " +
                   extra, &log), 0) << log;
  return out;
}

// ucp-union -q of `in` into `out` (options `extra` first); its exit code, stdout and stderr in `log`.
int union_of(const fs::path& in, const fs::path& out, std::string* log, const std::string& extra = "") {
  return sh(kBin + "/ucp-union -q " + extra + "--input " + in.string() + " --output " + out.string(), log);
}

// name -> (layer, global expert) of the manifest's native expert entries.
std::map<std::string, std::pair<int, int>> manifest_experts(const fs::path& universal) {
  std::map<std::string, std::pair<int, int>> out;
  const json manifest = read_json(universal / "manifest.json");  // the loop must not outlive it
  for (const auto& p : manifest["params"])
    if (p.contains("expert") && p["expert"].is_object())
      out[p["name"]] = {p["expert"]["layer"].get<int>(), p["expert"]["global_id"].get<int>()};
  return out;
}

// Every zero/<param>/<state>.pt of `a` is in `b` with the same bytes, and no more.
void expect_same_atomics(const fs::path& a, const fs::path& b) {
  const auto ta = ucpkit::testing::tree_bytes((a / "zero").string()), tb = ucpkit::testing::tree_bytes((b / "zero").string());
  size_t same = 0;
  for (const auto& [rel, bytes] : ta) {
    if (fs::path(rel).filename() == "optimizer_state.pt") continue;
    auto it = tb.find(rel);
    ASSERT_NE(it, tb.end()) << rel;
    EXPECT_TRUE(it->second == bytes) << rel << " differs";
    ++same;
  }
  EXPECT_EQ(ta.size(), tb.size());
  EXPECT_GT(same, 100u);
}

TEST(MoeBlockNames, UnionRecordsTheExpertFilesLayersAndLoadRoundTrips) {
  const fs::path dir = ucpkit::testing::scratch_dir("moe_block_names");
  const fs::path src = generate(dir, "blocks", "--block-prefix blocks");
  std::string out;
  ASSERT_EQ(union_of(src, dir / "u1", &out), 0) << out;
  // The layers against the generator's truth: its moe_layer is the moe_layer_id of the expert files.
  const auto experts = manifest_experts(dir / "u1");
  size_t checked = 0;
  std::set<int> layers;
  const json truth = read_json(src / "truth" / "meta.json");
  for (const auto& p : truth["params"]) {
    if (p["expert"].is_null()) continue;
    auto it = experts.find(p["name"].get<std::string>());
    ASSERT_NE(it, experts.end()) << p["name"];
    EXPECT_EQ(it->second.first, p["moe_layer"].get<int>()) << p["name"];
    EXPECT_EQ(it->second.second, p["expert"].get<int>()) << p["name"];
    layers.insert(it->second.first);
    ++checked;
  }
  EXPECT_EQ(checked, experts.size());
  EXPECT_EQ(layers, (std::set<int>{0, 1}));
  EXPECT_EQ(sh(kPy + " " + kSrc + "/tests/to_universal/check_universal.py " + (dir / "u1").string() + " " + src.string(), &out), 0)
      << out;
  // EP 2 -> 4: both MoE layers' expert files, each holding its own block's experts; back bit for bit.
  ASSERT_EQ(sh(kBin + "/ucp-load -q --input " + (dir / "u1").string() + " --output " + (dir / "ep4").string() +
                   " --tp 1 --pp 1 --dp 4 --ep 4 --zero-stage 1", &out), 0) << out;
  const fs::path step = dir / "ep4" / "global_step100";
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 4; ++e) {
      const fs::path f = step / ("layer_" + std::to_string(l) + "_expert_" + std::to_string(e) + "_mp_rank_00_model_states.pt");
      ASSERT_TRUE(fs::exists(f)) << f;
      const std::string block = l == 0 ? "blocks.1.mlp" : "blocks.3.mlp";
      EXPECT_NE(file_bytes(f.string()).find(block), std::string::npos) << f << " holds no " << block << " key";
    }
  ASSERT_EQ(union_of(dir / "ep4", dir / "u2", &out), 0)
      << out;
  EXPECT_EQ(manifest_experts(dir / "u2"), experts);
  expect_same_atomics(dir / "u1", dir / "u2");
  fs::remove_all(dir);
}

// Megatron's names keep their recorded transformer layers (1 and 3, as before): the order agrees.
TEST(MoeBlockNames, MegatronNamesKeepTheirTransformerLayers) {
  const fs::path dir = ucpkit::testing::scratch_dir("moe_block_names_megatron");
  const fs::path src = generate(dir, "megatron", "");
  std::string out;
  ASSERT_EQ(union_of(src, dir / "u", &out), 0) << out;
  std::set<int> layers;
  for (const auto& [name, le] : manifest_experts(dir / "u")) {
    EXPECT_EQ(name.find("language_model.encoder.layers." + std::to_string(le.first) + "."), 0u) << name;
    layers.insert(le.first);
  }
  EXPECT_EQ(layers, (std::set<int>{1, 3}));
  fs::remove_all(dir);
}

// The expert files say layer 0 holds layers.3's experts and layer 1 layers.1's (files swapped): the
// names and DeepSpeed's moe_layer_id order disagree, refused naming both files.
TEST(MoeBlockNames, NamesDisagreeingWithTheExpertFilesAreRefused) {
  const fs::path dir = ucpkit::testing::scratch_dir("moe_block_names_swapped");
  const fs::path src = generate(dir, "swapped", "");
  const fs::path step = src / "global_step100";
  for (int e = 0; e < 4; ++e) {
    const std::string a = "layer_0_expert_" + std::to_string(e) + "_mp_rank_00_model_states.pt";
    const std::string b = "layer_1_expert_" + std::to_string(e) + "_mp_rank_00_model_states.pt";
    fs::rename(step / a, step / "tmp.pt");
    fs::rename(step / b, step / a);
    fs::rename(step / "tmp.pt", step / b);
  }
  std::string out;
  EXPECT_EQ(union_of(src, dir / "u", &out), 1) << out;
  EXPECT_NE(out.find("layer_1_expert_0_mp_rank_00_model_states.pt: its experts are in layers.1"), std::string::npos) << out;
  EXPECT_NE(out.find("layer_0_expert_0_mp_rank_00_model_states.pt (an earlier MoE layer"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "u"));
  fs::remove_all(dir);
}

// Item 4: no latest_universal for a native-MoE universal folder unless asked; the ucp-load command
// is printed instead. A dense folder keeps its tag.
TEST(MoeBlockNames, NativeMoeUniversalGetsNoLatestUniversalUnlessAsked) {
  const fs::path dir = ucpkit::testing::scratch_dir("moe_latest_universal");
  const fs::path src = generate(dir, "ck", "");
  std::string out;
  ASSERT_EQ(union_of(src, src / "u", &out), 0) << out;
  EXPECT_FALSE(fs::exists(src / "latest_universal"));
  EXPECT_NE(out.find("ucp-union: warning: native-MoE universal folder: no latest_universal written"), std::string::npos) << out;
  EXPECT_NE(out.find("ucp-load --input " + (src / "u").string() + " --output <target_dir> --dp 2 --ep 2"), std::string::npos)
      << out;
  ASSERT_EQ(union_of(src, src / "t", &out, "--tag-latest-universal "), 0) << out;
  EXPECT_EQ(file_bytes((src / "latest_universal").string()), "t");
  EXPECT_EQ(out.find("no latest_universal written"), std::string::npos) << out;
  // Dense: tagged as ds_to_universal tags it, no warning.
  const fs::path dense = dir / "gpt";
  ASSERT_EQ(sh(kPy + " " + kSrc + "/tests/generator/gen_ds_checkpoint.py --output " + dense.string() +
                   " --model gpt --dp 2 --layers 2 --hidden 16 --heads 2 --ffn 32 --vocab 64 --seq 8 --no-truth", &out), 0)
      << out;
  ASSERT_EQ(union_of(dense, dense / "u", &out), 0) << out;
  EXPECT_EQ(file_bytes((dense / "latest_universal").string()), "u");
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  fs::remove_all(dir);
}

// The numbers themselves: Megatron's names keep N, any other naming (or a mix) gets the moe_layer_id.
TEST(MoeBlockNames, LayerNumbersComeFromTheExpertFiles) {
  using ucpkit::formats::deepspeed::expert_layer_numbers;
  using ucpkit::formats::deepspeed::ExpertFileLayer;
  EXPECT_EQ(expert_layer_numbers({{0, {"a", {1}, false}}, {1, {"b", {3}, false}}}), (std::map<int, int>{{0, 1}, {1, 3}}));
  EXPECT_EQ(expert_layer_numbers({{0, {"a", {}, true}}, {1, {"b", {}, true}}}), (std::map<int, int>{{0, 0}, {1, 1}}));
  EXPECT_EQ(expert_layer_numbers({{0, {"a", {1}, false}}, {1, {"b", {}, true}}}), (std::map<int, int>{{0, 0}, {1, 1}}));
  try {
    expert_layer_numbers({{0, {"a.pt", {1, 5}, false}}});
    ADD_FAILURE() << "two layers.N in one MoE layer accepted";
  } catch (const ucpkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a.pt: MoE layer 0's expert files hold parameters of layers.1 and layers.5"),
              std::string::npos) << e.what();
  }
}

}  // namespace

}  // namespace moe_block_names_test
