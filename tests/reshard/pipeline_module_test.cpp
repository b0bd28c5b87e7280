// A DeepSpeed PipelineModule that is not Megatron's (issue 33 item 3): an nn.Embedding, six blocks of
// LayerNorm + two Linears (no attention parameters), a function layer and an nn.Linear head, PP 2 DP 2,
// fp16, ZeRO-1, written by tests/reshard/pipeline_module_fixture.py as DeepSpeed v0.14.5 writes it (every
// fact cited there). ucp-load refused it before, even for the source layout, with
// "impossible layout: --pp 2 but the model has only 0 transformer layers". Now its stages are chosen as
// DeepSpeed's _partition_layers does for --partition-method (default 'parameters', DeepSpeed's).
// Truth: the fixture script writes each target layout itself, its stage bounds from the text of
// DeepSpeed's partition_uniform / partition_balanced (utils.py v0.14.5 :562-611, run with numpy), and
// compares every layer file, param_shapes and every optimizer shard's fp32 partition, Adam moments,
// step, paddings and slice mappings with torch.load.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/paths.h"
#include "support/process.h"

namespace pipeline_module_test {

namespace fs = std::filesystem;

namespace {

const std::string kFixture = kSrc + "/tests/reshard/pipeline_module_fixture.py";

int sh(const std::string& cmd, std::string* out = nullptr) { return ucpkit::testing::run_command(cmd, out); }

// The scratch folder holding src (the PP 2 DP 2 checkpoint) and u (its ucp-union), made once.
class PipelineModule : public ::testing::Test {
 protected:
  static fs::path dir_;
  static void SetUpTestSuite() {
    dir_ = ucpkit::testing::scratch_dir("pipeline_module");
    std::string out;
    ASSERT_EQ(sh("cd " + dir_.string() + " && " + kPy + " " + kFixture + " write src --pp 2 --dp 2", &out), 0) << out;
    ASSERT_EQ(out, "stages 0,1,2,3;4,5,6,8\n");  // DeepSpeed's partition_balanced of the layer sizes
    ASSERT_EQ(sh("cd " + dir_.string() + " && " + kBin + "/ucp-union -q --input src --output u", &out), 0) << out;
  }
  // ucp-load from the scratch folder with relative paths, as a job script runs it.
  static int load(const std::string& args, std::string* out) {
    return sh("cd " + dir_.string() + " && " + kBin + "/ucp-load " + args, out);
  }
  static int compare(const std::string& got, const std::string& ref, std::string* out) {
    return sh("cd " + dir_.string() + " && " + kPy + " " + kFixture + " compare " + got + " " + ref, out);
  }
};
fs::path PipelineModule::dir_;

TEST_F(PipelineModule, SourceLayoutGivesTheSourceFilesBackAndSaysTheDefaultTaken) {
  std::string out;
  ASSERT_EQ(load("--input u --output same --dp 2", &out), 0) << out;
  EXPECT_NE(out.find("partition_method parameters (DeepSpeed's PipelineModule default; --partition-method)"),
            std::string::npos) << out;
  ASSERT_EQ(compare("same", "src", &out), 0) << out;
  EXPECT_NE(out.find("14 files compared, 0 differences"), std::string::npos) << out;
}

// Straight from the native checkpoint (no universal folder): the same files.
TEST_F(PipelineModule, NativeInputToTheSourceLayoutGivesTheSourceFilesBack) {
  std::string out;
  ASSERT_EQ(load("--input src --output direct --dp 2 --partition-method parameters", &out), 0) << out;
  ASSERT_EQ(compare("direct", "src", &out), 0) << out;
}

struct Case {
  int pp, dp;
  std::string method;
};

class PipelineModuleTargets : public PipelineModule, public ::testing::WithParamInterface<Case> {};

// PP 3 'parameters' gives layers 0-2 | 3-4 | 5-8 and 'uniform' 0-2 | 3-5 | 6-8 (the function layer 7
// counted by uniform, as len(layer_specs)); PP 2 uniform 0-4 | 5-8 where parameters gives 0-3 | 4-8.
TEST_P(PipelineModuleTargets, LayerSplitIsDeepSpeedsAndValuesAreEqual) {
  const Case c = GetParam();
  const std::string name = "pp" + std::to_string(c.pp) + "_dp" + std::to_string(c.dp) + "_" + c.method;
  std::string out;
  ASSERT_EQ(sh("cd " + dir_.string() + " && " + kPy + " " + kFixture + " write ref_" + name + " --pp " +
                   std::to_string(c.pp) + " --dp " + std::to_string(c.dp) + " --partition-method " + c.method, &out),
            0) << out;
  ASSERT_EQ(load("-q --input u --output t_" + name + " --pp " + std::to_string(c.pp) + " --dp " + std::to_string(c.dp) +
                     " --partition-method " + c.method, &out), 0) << out;
  ASSERT_EQ(compare("t_" + name, "ref_" + name, &out), 0) << out;
  EXPECT_NE(out.find(" 0 differences"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Methods, PipelineModuleTargets,
                         ::testing::Values(Case{1, 2, "parameters"}, Case{3, 2, "parameters"}, Case{2, 2, "uniform"},
                                           Case{3, 1, "uniform"}, Case{4, 3, "parameters"}, Case{3, 2, "UNIFORM"}),
                         [](const auto& info) {
                           std::string m = info.param.method;
                           for (auto& ch : m) ch = ch == ':' ? '_' : ch;
                           return "pp" + std::to_string(info.param.pp) + "_dp" + std::to_string(info.param.dp) + "_" + m;
                         });

// type:<regex> needs the layers' class names, which the files do not hold: refused naming the option;
// never the old message about transformer layers.
TEST_F(PipelineModule, TypeMethodIsRefusedNamingTheOption) {
  std::string out;
  EXPECT_EQ(load("-q --input u --output typed --pp 2 --dp 2 --partition-method type:block", &out), 1) << out;
  EXPECT_NE(out.find("--partition-method type:block"), std::string::npos) << out;
  EXPECT_NE(out.find("class name is not known"), std::string::npos) << out;
  EXPECT_EQ(out.find("transformer layers"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ / "typed"));
}

TEST_F(PipelineModule, UnknownMethodIsAUsageError) {
  std::string out;
  EXPECT_EQ(load("-q --input u --output bad --pp 2 --dp 2 --partition-method profile", &out), 2) << out;
  EXPECT_NE(out.find("--partition-method profile"), std::string::npos) << out;
}

// 9 stages: DeepSpeed's balanced split gives the function layer 7 a stage of its own, which would
// build no parameter; refused naming the method and the stage.
TEST_F(PipelineModule, StageWithoutParametersIsRefused) {
  std::string out;
  EXPECT_EQ(load("-q --input u --output nine --pp 9 --dp 1", &out), 1) << out;
  EXPECT_NE(out.find("--partition-method parameters over --pp 9 gives stage 7 layers [7, 8)"), std::string::npos) << out;
  EXPECT_EQ(out.find("transformer layers"), std::string::npos) << out;
}

// A Megatron model keeps its own rule by default; type:<regex> on it is refused the same way, saying
// that rule (Megatron-DeepSpeed's GPTModelPipe partitions by type:transformer).
TEST(PipelineModuleMegatron, TypeMethodIsRefusedSayingTheDefaultRule) {
  const fs::path dir = ucpkit::testing::scratch_dir("pipeline_module_megatron");
  std::string out;
  ASSERT_EQ(sh("cd " + dir.string() + " && " + kPy + " " + kSrc + "/tests/generator/gen_ds_checkpoint.py --output gpt "
               "--pp 2 --dp 1 --layers 4 --hidden 16 --heads 2 --ffn 32 --vocab 64 --seq 8 --no-truth", &out), 0) << out;
  ASSERT_EQ(sh("cd " + dir.string() + " && " + kBin + "/ucp-union -q --input gpt --output u", &out), 0) << out;
  EXPECT_EQ(sh("cd " + dir.string() + " && " + kBin + "/ucp-load -q --input u --output t --dp 1 "
               "--partition-method type:transformer", &out), 1) << out;
  EXPECT_NE(out.find("--partition-method type:transformer"), std::string::npos) << out;
  EXPECT_NE(out.find("without --partition-method this Megatron model's transformer blocks are split evenly"),
            std::string::npos) << out;
  ASSERT_EQ(sh("cd " + dir.string() + " && " + kBin + "/ucp-load --input u --output t --dp 1", &out), 0) << out;
  EXPECT_NE(out.find("from the source (not given on the command line): tp 1, pp 2"), std::string::npos) << out;
  EXPECT_EQ(out.find("partition_method"), std::string::npos) << out;  // no default taken: Megatron's rule
}

}  // namespace

}  // namespace pipeline_module_test
