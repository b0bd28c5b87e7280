// --layers-map (issue 31 item 5): which decoder layers are MoE, from a spec or a model config, and one
// run writing SGLang's all-layer file (a row per decoder layer) and vLLM's MoE-layer file (a row per
// MoE layer), the dense rows of a per-decoder-layer load dump dropped. Shapes checked by reading the
// files back (JSON rows; the safetensors header's shapes), rows against the plan's phy2log.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/safetensors_file.h"
#include "placement/layers_map.h"
#include "support/errors.h"
#include "test_data.h"

namespace layers_map_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::placement;

namespace {

std::vector<int> range(int a, int b) {
  std::vector<int> v;
  for (int i = a; i <= b; ++i) v.push_back(i);
  return v;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("layers_map_" + std::to_string(::getpid()) + "_" + name);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(LayersMap, SpecAndModelConfigs) {
  LayersMap m = parse_layers_map("61:3-60");
  EXPECT_EQ(m.decoder_layers, 61);
  EXPECT_EQ(m.moe_layers, range(3, 60));
  EXPECT_EQ(parse_layers_map("8:1,3,5-6").moe_layers, (std::vector<int>{1, 3, 5, 6}));
  fs::path d = temp_dir("configs");
  // DeepSeek-V3's config.json keys (num_hidden_layers 61, first_k_dense_replace 3, moe_layer_freq 1):
  // 58 MoE layers, the count vLLM's DeepseekV2 model gives (num_hidden_layers - first_k_dense_replace).
  std::ofstream(d / "dsv3.json") << R"({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_routed_experts": 256})";
  m = parse_layers_map((d / "dsv3.json").string());
  EXPECT_EQ(m.decoder_layers, 61);
  EXPECT_EQ(m.moe_layers, range(3, 60));
  // Qwen-MoE: every decoder_sparse_step-th layer, minus mlp_only_layers.
  std::ofstream(d / "qwen.json") << R"({"num_hidden_layers": 6, "num_experts": 60, "decoder_sparse_step": 2,
    "mlp_only_layers": [3]})";
  EXPECT_EQ(parse_layers_map((d / "qwen.json").string()).moe_layers, (std::vector<int>{1, 5}));
  std::ofstream(d / "mixtral.json") << R"({"num_hidden_layers": 4, "num_local_experts": 8})";
  EXPECT_EQ(parse_layers_map((d / "mixtral.json").string()).moe_layers, range(0, 3));
  // Bad input: the option or the file named.
  for (const char* bad : {"61", "61:3-61", "61:5-3", "x:1", "4:"})
    EXPECT_NE(ucpkit::testing::error_of([&] { parse_layers_map(bad); }).find("--layers-map"), std::string::npos) << bad;
  std::ofstream(d / "dense.json") << R"({"num_hidden_layers": 4})";
  EXPECT_NE(ucpkit::testing::error_of([&] { parse_layers_map((d / "dense.json").string()); }).find("dense.json"),
            std::string::npos);
  fs::remove_all(d);
}

TEST(LayersMap, LoadsPerDecoderLayerKeepTheMoeRows) {
  LayersMap m = parse_layers_map("5:1,3-4");
  LoadMatrix w{5, 2, {0, 0, 1, 2, 0, 0, 3, 4, 5, 6}};
  LoadMatrix moe = moe_rows(w, m, "w.json");
  ASSERT_EQ(moe.layers, 3u);
  EXPECT_EQ(moe.values, (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(moe_rows(moe, m, "w.json").values, moe.values);  // already per MoE layer
  LoadMatrix four{4, 2, std::vector<double>(8, 1)};
  EXPECT_NE(ucpkit::testing::error_of([&] { moe_rows(four, m, "w.json"); }).find("w.json"), std::string::npos);
}

// One run, both engines' shapes: DeepSeek-V3-like 61 decoder layers, 58 MoE layers, a dump with a row
// per decoder layer (zeros on the dense ones, as SGLang's recorder keeps them).
TEST(LayersMap, OneRunWritesSglangAllLayersAndVllmMoeLayers) {
  const std::string tool = placement_test::tool_dir() + "/moe-replace";
  if (!fs::exists(tool)) GTEST_SKIP() << "moe-replace not built";
  fs::path d = temp_dir("cli");
  nlohmann::json rows = nlohmann::json::array();
  for (int l = 0; l < 61; ++l) {
    nlohmann::json row = nlohmann::json::array();
    for (int e = 0; e < 8; ++e) row.push_back(l < 3 ? 0 : (e * 37 + l * 11) % 97 + 1);
    rows.push_back(row);
  }
  std::ofstream(d / "dump.json") << nlohmann::json{{"logical_count", rows}}.dump();
  auto run = [&](const std::string& extra) {
    std::string cmd = tool + " --input " + (d / "dump.json").string() +
                      " --nodes 2 --gpus-per-node 2 --slots-per-gpu 3 --output " + (d / "plan.json").string() +
                      " --sglang-expert-location " + (d / "sglang.json").string() + " --vllm-eplb-state " +
                      (d / "vllm.safetensors").string() + " -q " + extra + " > " + (d / "log").string() + " 2>&1";
    return WEXITSTATUS(std::system(cmd.c_str()));
  };
  ASSERT_EQ(run("--layers-map 61:3-60"), 0);
  nlohmann::json plan = nlohmann::json::parse(std::ifstream(d / "plan.json"));
  nlohmann::json sg = nlohmann::json::parse(std::ifstream(d / "sglang.json"));
  ASSERT_EQ(plan["layers"].size(), 58u);
  ASSERT_EQ(sg["physical_to_logical_map"].size(), 61u);
  for (int l = 0; l < 61; ++l) {
    const auto& row = sg["physical_to_logical_map"][l];
    ASSERT_EQ(row.size(), 12u);
    if (l < 3) {
      for (int p = 0; p < 12; ++p) EXPECT_EQ(row[p], p % 8);  // SGLang's trivial map
    } else {
      EXPECT_EQ(row, plan["layers"][l - 3]["phy2log"]) << l;
    }
  }
  std::ifstream in(d / "vllm.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto tensors = parse_safetensors(bytes, "vllm.safetensors");
  EXPECT_EQ(tensors.at("physical_to_logical_map").shape, (std::vector<int64_t>{58, 12}));
  EXPECT_EQ(tensors.at("logical_replica_count").shape, (std::vector<int64_t>{58, 8}));
  // Bad input: exit 2 for the spec, 1 for loads of neither shape; nothing written.
  fs::remove(d / "plan.json");
  fs::remove(d / "sglang.json");
  EXPECT_EQ(run("--layers-map 61:3-70"), 2);
  EXPECT_EQ(run("--layers-map 40:3-20"), 1);
  EXPECT_FALSE(fs::exists(d / "plan.json"));
  EXPECT_FALSE(fs::exists(d / "sglang.json"));
  fs::remove_all(d);
}

// The PP split of vLLM's get_pp_indices (vllm/distributed/utils.py), written as its Python is: the
// documented examples, and every stage's MoE rows are the plan's rows of its MoE layers, in order.
TEST(LayersMap, PipelineStagesSplitAsTheEnginesDo) {
  auto sizes = [](int D, int P) {
    LayersMap m;
    m.decoder_layers = D;
    for (int i = 0; i < D; ++i) m.moe_layers.push_back(i);
    std::vector<int> out;
    for (const auto& st : pp_stages(m, P)) out.push_back(st.end_layer - st.first_layer);
    return out;
  };
  EXPECT_EQ(sizes(61, 2), (std::vector<int>{31, 30}));
  EXPECT_EQ(sizes(61, 4), (std::vector<int>{15, 15, 16, 15}));
  EXPECT_EQ(sizes(22, 4), (std::vector<int>{5, 6, 6, 5}));
  EXPECT_EQ(sizes(5, 3), (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(sizes(4, 3), (std::vector<int>{1, 2, 1}));
  EXPECT_EQ(sizes(32, 4), (std::vector<int>{8, 8, 8, 8}));
  for (int D = 1; D <= 70; ++D)
    for (int P = 1; P <= std::min(D, 9); ++P) {
      // partitions = [D // P] * P; for i in range(2, D % P + 2): partitions[-i] += 1
      std::vector<int> want(P, D / P);
      for (int i = 2; i < D % P + 2; ++i) want[(P - i % P) % P]++;
      ASSERT_EQ(sizes(D, P), want) << D << " layers, " << P << " stages";
    }
  const LayersMap v3 = parse_layers_map("61:3-60");
  const auto st = pp_stages(v3, 4);
  int row = 0, layer = 0;
  for (const auto& s : st) {
    EXPECT_EQ(s.first_layer, layer);
    EXPECT_EQ(s.first_moe_row, row);
    for (size_t i = 0; i < s.moe_layers.size(); ++i) EXPECT_EQ(v3.moe_layers[static_cast<size_t>(row) + i], s.moe_layers[i]);
    row = s.end_moe_row;
    layer = s.end_layer;
  }
  EXPECT_EQ(row, 58);
  EXPECT_EQ(layer, 61);
  EXPECT_EQ(st[0].moe_layers.size(), 12u);  // layers 0-2 are dense
  // VLLM_PP_LAYER_PARTITION / SGLANG_PP_LAYER_PARTITION
  const auto manual = pp_stages(v3, 2, parse_pp_partition("32,29"));
  EXPECT_EQ(manual[0].end_layer, 32);
  EXPECT_EQ(manual[1].end_moe_row - manual[1].first_moe_row, 29);
  EXPECT_THROW(pp_stages(v3, 2, {31, 31}), UsageError);
  EXPECT_THROW(pp_stages(v3, 3, {30, 31}), UsageError);
  EXPECT_THROW(pp_stages(v3, 0), UsageError);
  EXPECT_THROW(pp_stages(v3, 62), UsageError);
  for (const char* bad : {"", "3,", ",3", "0,61", "a,b", "-1,62"}) EXPECT_THROW(parse_pp_partition(bad), UsageError) << bad;
}

}  // namespace layers_map_test
