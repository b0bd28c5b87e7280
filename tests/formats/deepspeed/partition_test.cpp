// DeepSpeed's PipelineModule partition methods (lib/formats/deepspeed/partition). Truth: every
// expected bound below was printed by DeepSpeed's own partition_uniform / partition_balanced, their
// text taken verbatim from deepspeed/runtime/utils.py at v0.14.5 and at v0.19.6 (edaa7221; the same
// results) and run with numpy by scripts/verify/ds_engine/partition_examples.py; _partition_layers' choice of
// weights is module.py v0.19.6 :396-421. The layer sizes are checked against Python's torch.load of
// the generator's layer files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/deepspeed/partition.h"
#include "support/files.h"
#include "support/process.h"

namespace deepspeed_partition_test {

using namespace ucpkit;
using namespace ucpkit::formats::deepspeed;
namespace fs = std::filesystem;

namespace {

using V = std::vector<int64_t>;

TEST(DeepSpeedPartition, UniformIsDeepSpeedsPartitionUniform) {
  EXPECT_EQ(partition_uniform(10, 4), (V{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(3, 4), (V{0, 1, 2, 3, 3}));
  EXPECT_EQ(partition_uniform(4, 4), (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(partition_uniform(7, 2), (V{0, 4, 7}));
  EXPECT_EQ(partition_uniform(13, 3), (V{0, 5, 9, 13}));
  EXPECT_EQ(partition_uniform(1, 1), (V{0, 1}));
  EXPECT_EQ(partition_uniform(0, 2), (V{0, 0, 0}));
}

// The dynamic program minimises largest - smallest part (not the largest part): [1..8] over 4 gives
// 10, 11, 7, 8 rather than 10, 11, 15; ties go to the later split.
TEST(DeepSpeedPartition, BalancedIsDeepSpeedsPartitionBalanced) {
  EXPECT_EQ(partition_balanced(V(10, 1), 4), (V{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_balanced({5, 1, 1, 1, 1, 5}, 2), (V{0, 3, 6}));
  EXPECT_EQ(partition_balanced({3, 4, 5}, 4), (V{0, 1, 2, 3, 3}));
  EXPECT_EQ(partition_balanced({0, 10, 10, 10, 10, 0}, 2), (V{0, 3, 6}));
  EXPECT_EQ(partition_balanced({0, 100, 5, 5, 5, 5, 5, 5, 100, 0}, 3), (V{0, 2, 8, 10}));
  EXPECT_EQ(partition_balanced(V(7, 7), 3), (V{0, 3, 5, 7}));
  EXPECT_EQ(partition_balanced({1, 2, 3, 4, 5, 6, 7, 8}, 4), (V{0, 4, 6, 7, 8}));
  EXPECT_EQ(partition_balanced({0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 2), (V{0, 5, 11}));
  EXPECT_EQ(partition_balanced({10, 0, 0, 0, 10}, 2), (V{0, 4, 5}));
}

std::vector<PipelineLayer> layers(const std::vector<std::pair<int64_t, std::string>>& l) {
  std::vector<PipelineLayer> out;
  for (const auto& [n, t] : l) out.push_back({n, t.empty() ? std::nullopt : std::optional<std::string>(t)});
  return out;
}

TEST(DeepSpeedPartition, LayersByEachMethod) {
  // A GPT-like PipelineModule: embedding, four blocks, a norm, the tied head (TiedLayerSpec is a
  // LayerSpec, so _count_layer_params counts the head's copy too).
  const auto l = layers({{640, "EmbeddingPipe"}, {1000, "TransformerBlock"}, {1000, "TransformerBlock"},
                         {1000, "TransformerBlock"}, {1000, "TransformerBlock"}, {20, "LayerNorm"}, {640, "EmbeddingPipe"}});
  EXPECT_EQ(partition_layers(parse_partition_method("uniform"), l, 2), (V{0, 4, 7}));
  EXPECT_EQ(partition_layers(parse_partition_method("parameters"), l, 2), (V{0, 3, 7}));
  EXPECT_EQ(partition_layers(parse_partition_method("type:transformer"), l, 2), (V{0, 3, 7}));  // printed by the script
  EXPECT_EQ(partition_layers(parse_partition_method("Type:TRANSFORMERBLOCK"), l, 2), (V{0, 3, 7}));  // lowercased, icase
  EXPECT_EQ(partition_balanced({640, 1000, 1000, 1000, 1000, 20, 640}, 2), (V{0, 3, 7}));
}

TEST(DeepSpeedPartition, MethodsAndRefusals) {
  EXPECT_EQ(to_string(parse_partition_method("PARAMETERS")), "parameters");
  EXPECT_EQ(to_string(parse_partition_method("type:Block:x")), "type:block");  // method.split(':')[1]
  EXPECT_THROW(parse_partition_method("profile"), UsageError);
  try {
    parse_partition_method("balanced");
    ADD_FAILURE();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--partition-method balanced: DeepSpeed's partition methods are parameters, uniform"),
              std::string::npos) << e.what();
  }
  // type: needs class names, which layer files do not hold: refused naming the layer, not guessed.
  const auto unnamed = layers({{10, "EmbeddingPipe"}, {10, ""}});
  try {
    partition_layers(parse_partition_method("type:transformer"), unnamed, 2);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1's class name is not known"), std::string::npos) << e.what();
  }
  EXPECT_EQ(partition_layers(parse_partition_method("parameters"), unnamed, 2), (V{0, 1, 2}));
  EXPECT_THROW(partition_layers(parse_partition_method("type:attention"), layers({{1, "Block"}, {1, "Norm"}, {1, "Head"}}), 2),
               Error);  // DeepSpeed: RuntimeError("Partitioning 'attention' found no valid layers to partition.")
}

// Per-layer sizes from a generated PipelineModule checkpoint (GPT, PP 2, TP 2), against torch.load.
TEST(DeepSpeedPartition, LayerFileParamsSumTheLayerFilesTensors) {
  const fs::path dir = ucpkit::testing::scratch_dir("partition_layer_files");
  std::string out;
  ASSERT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR +
                                             "/tests/generator/gen_ds_checkpoint.py --output " + dir.string() +
                                             " --model gpt --pp 2 --tp 2 --layers 4 --hidden 16 --heads 2 --ffn 32 --vocab 64 "
                                             "--seq 8 --no-truth", &out), 0) << out;
  const fs::path step = dir / "global_step100";
  for (int tp = 0; tp < 2; ++tp) {
    const std::string py =
        "import sys, glob, re; sys.path.insert(0, '" + std::string(UCPKIT_SOURCE_DIR) + "/tests/generator'); import dsgen, torch\n"
        "for f in sorted(glob.glob(sys.argv[1] + '/layer_*-model_0" + std::to_string(tp) + "-model_states.pt')):\n"
        "    print(int(re.search(r'layer_(\\\\d+)', f).group(1)), sum(t.numel() for t in torch.load(f).values()))\n";
    ASSERT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " -c \"" + py + "\" " + step.string(), &out), 0) << out;
    std::string ours;
    for (const auto& [layer, n] : layer_file_params(step.string(), tp, [](int, const std::string&) { return true; }))
      ours += std::to_string(layer) + " " + std::to_string(n) + "\n";
    EXPECT_EQ(ours, out) << "tp " << tp;
    EXPECT_GT(ours.size(), 20u);
  }
  // A key the caller says is a buffer is not counted.
  const auto all = layer_file_params(step.string(), 0, [](int, const std::string&) { return true; });
  const auto some = layer_file_params(step.string(), 0, [](int, const std::string& k) { return k.find("bias") == std::string::npos; });
  ASSERT_EQ(all.size(), some.size());
  int64_t fewer = 0;
  for (const auto& [l, n] : all) fewer += n - some.at(l);
  EXPECT_GT(fewer, 0);
  fs::remove_all(dir);
}

// --layer-types FILE: one class name a line, surrounding spaces and a '\r' dropped; an empty line, no line
// or no file is an Error naming the file (and line). With the names of tests/generator/engine/
// pipe_module_v0.19.5 (layer_types.txt), type:Block over 3 stages is what DeepSpeed's own PipelineModule
// built there (partitions.json: [0, 3, 4, 6]).
TEST(DeepSpeedPartition, LayerTypesFileAndTypeMethod) {
  const fs::path dir = ucpkit::testing::scratch_dir("partition_layer_types");
  fs::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  };
  EXPECT_EQ(read_layer_types(write("ok.txt", "Embed\r\n  Block \nBlock\nBlock\nBlock\nHead")),
            (std::vector<std::string>{"Embed", "Block", "Block", "Block", "Block", "Head"}));
  const std::string engine = std::string(UCPKIT_SOURCE_DIR) + "/tests/generator/engine/pipe_module_v0.19.5/layer_types.txt";
  std::vector<PipelineLayer> layers;
  for (const auto& n : read_layer_types(engine)) layers.push_back({1, n});
  EXPECT_EQ(partition_layers(parse_partition_method("type:Block"), layers, 3), (std::vector<int64_t>{0, 3, 4, 6}));
  try {
    read_layer_types(write("blank.txt", "Embed\n\nHead\n"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blank.txt:2: empty line"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_layer_types(write("empty.txt", "")), Error);
  EXPECT_THROW(read_layer_types((dir / "missing.txt").string()), Error);
  fs::remove_all(dir);
}

}  // namespace

}  // namespace deepspeed_partition_test
