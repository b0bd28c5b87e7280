// Checkpoints saved by DeepSpeed's real engine (issue 33; tests/generator/engine/<name>_v<ver>/PROVENANCE.md):
// a dense GPT-like `blocks.N` model, a 2-stage PipelineModule (LayerSpecs Embed, Block x4, Head) and the
// MoE tutorial model, on DeepSpeed v0.14.5 (torch 1.13) and v0.19.5 (torch 2.6), CPU, gloo, fp32.
// Truth, independent of ucpkit:
//   * truth/state_rank<R>.pt: the state the engine's ranks held after the last step (weights, fp32 master,
//     Adam moments, step), recorded by scripts/verify/ds_engine/train_engine.py through DeepSpeed's accessors;
//   * partitions.json: DeepSpeed's own PipelineModule partition of the pipe model's layer list for
//     parameters, uniform, type:Block and type:head|embed over PP 1-4 (module.parts), with the layer class
//     names as DeepSpeed's _find_layer_type names them (layer_types.txt).
// ucp-union must equal the truth; ucp-load to another DP, another ZeRO stage, (MoE) EP 4 and (pipe) another
// PP must round-trip bit for bit; the pipe stages must be DeepSpeed's for every method, type:<regex>
// through --layer-types. Run as a job script runs them: relative paths, from another working folder,
// defaults (tp, pp, zero stage, dtype) left to the source. Engine resumes are outside CI
// (scripts/verify/ds_engine/resume_compare.sh, docs/deepspeed-models.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace engine_fixtures_test {

namespace fs = std::filesystem;

namespace {

const std::string kEngine = kSrc + "/tests/generator/engine/";
const std::string kState = kSrc + "/tests/reshard/engine_state.py";

int sh(const std::string& cmd, std::string* out = nullptr) { return ucpkit::testing::run_command(cmd, out); }

struct Target {
  std::string name, args;  // ucp-load's arguments beyond --input / --output
  std::string groups;      // MoE: the engine's param groups (name, moe) in the written shard ("": not checked)
};
struct Case {
  std::string fixture;  // tests/generator/engine/<fixture>
  std::string truth;    // the engine's state record folder in it
  std::string union_line;
  std::vector<Target> targets;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.fixture; }

class EngineFixture : public ::testing::TestWithParam<Case> {};

TEST_P(EngineFixture, UnionEqualsTheEngineStateAndLoadsRoundTrip) {
  const Case& c = GetParam();
  const fs::path dir = ucpkit::testing::scratch_dir("engine_fixture_" + c.fixture);
  fs::create_directories(dir);
  const std::string cd = "cd " + dir.string() + " && ";
  std::string out;
  ASSERT_EQ(sh(cd + kBin + "/ucp-union -q --input " + kEngine + c.fixture + " --output u", &out), 0) << out;
  ASSERT_EQ(sh(cd + kPy + " " + kState + " union u " + kEngine + c.fixture + "/" + c.truth, &out), 0) << out;
  EXPECT_EQ(out, c.union_line);
  std::string back;
  for (const auto& t : c.targets) {
    SCOPED_TRACE(t.name);
    ASSERT_EQ(sh(cd + kBin + "/ucp-load -q --input u --output " + t.name + " " + t.args, &out), 0) << out;
    ASSERT_EQ(sh(cd + kBin + "/ucp-union -q --input " + t.name + " --output " + t.name + "_u", &out), 0) << out;
    back += " " + t.name + "_u";
    if (!t.groups.empty()) {  // the tutorial's groups kept, the expert group renamed for the target EP
      const std::string py =
          "import sys; sys.path.insert(0, '" + kSrc + "/tests/generator'); import dsgen, torch; "
          "o = torch.load(sys.argv[1])['optimizer_state_dict']; "
          "print([(g['name'], g.get('moe', False)) for g in o['base_optimizer_state']['param_groups']])";
      EXPECT_EQ(sh(cd + kPy + " -c \"" + py + "\" " + t.name + "/global_step3/zero_pp_rank_0_mp_rank_00_optim_states.pt", &out),
                0) << out;
      EXPECT_EQ(out, t.groups);
    }
  }
  if (!c.targets.empty()) {  // tests/reshard/same_universal.py both ways for every target, in one process
    EXPECT_EQ(sh(cd + kPy + " " + kState + " roundtrip u" + back, &out), 0) << out;
    EXPECT_NE(out.find(std::to_string(c.targets.size()) + " round trips the same\n"), std::string::npos) << out;
  }
  fs::remove_all(dir);
}

const std::string kDense = "19 params x 3 states equal, step [3.0]\n";
const std::string kMoe = "33 params x 3 states equal, step [3.0]\n";
const std::vector<Target> kDenseTargets = {{"dp4", "--dp 4"}, {"zero2", "--dp 2 --zero-stage 2"}, {"dp4_zero2", "--dp 4 --zero-stage 2"}};
// The pipe engine takes ZeRO 0-1 only (pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
// parallelism"): another DP and another PP.
const std::vector<Target> kPipeTargets = {{"dp4", "--dp 4"}, {"pp1_dp2", "--pp 1 --dp 2"}, {"pp3", "--pp 3 --dp 1"}};
const std::vector<Target> kMoeTargets = {{"dp4", "--dp 4", "[('parameters', False), ('ep_size_2', True)]\n"},
                                         {"zero2", "--dp 2 --zero-stage 2", "[('parameters', False), ('ep_size_2', True)]\n"},
                                         {"ep4", "--dp 4 --ep 4", "[('parameters', False), ('ep_size_4', True)]\n"}};

INSTANTIATE_TEST_SUITE_P(
    RealEngine, EngineFixture,
    ::testing::Values(Case{"dense_blocks_v0.14.5", "truth", kDense, kDenseTargets},
                      Case{"dense_blocks_v0.19.5", "truth", kDense, kDenseTargets},
                      Case{"pipe_module_v0.14.5", "truth", kDense, kPipeTargets},
                      Case{"pipe_module_v0.19.5", "truth", kDense, kPipeTargets},
                      Case{"moe_tutorial_v0.14.5", "state", kMoe, {}},  // loads: MoeGroupsEngine.*
                      Case{"moe_tutorial_v0.19.5", "truth", kMoe, kMoeTargets}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string n = info.param.fixture;
      for (auto& ch : n)
        if (ch == '.') ch = '_';
      return n;
    });

// Every partition DeepSpeed's own PipelineModule made of the pipe model's layer list (partitions.json):
// ucp-load's stages hold the same layers, for parameters, uniform and, with --layer-types, type:<regex>.
class EnginePipePartitions : public ::testing::TestWithParam<std::string> {};

TEST_P(EnginePipePartitions, StagesAreDeepSpeedsForEveryMethod) {
  const std::string fixture = kEngine + GetParam();
  const fs::path dir = ucpkit::testing::scratch_dir("engine_partitions_" + GetParam());
  fs::create_directories(dir);
  fs::copy_file(fixture + "/layer_types.txt", dir / "layer_types.txt");
  const std::string cd = "cd " + dir.string() + " && ";
  std::string out;
  ASSERT_EQ(sh(cd + kBin + "/ucp-union -q --input " + fixture + " --output u", &out), 0) << out;
  // entry i of partitions.json -> "<method> <pp>" (the method has no space)
  ASSERT_EQ(sh(kPy + " -c \"import json, sys; [print(c['method'], c['pp']) for c in json.load(open(sys.argv[1]))]\" " +
                   fixture + "/partitions.json", &out), 0) << out;
  std::istringstream lines(out);
  std::string method;
  int pp = 0, i = 0;
  for (; lines >> method >> pp; ++i) {
    SCOPED_TRACE(method + " pp " + std::to_string(pp));
    std::string o;
    ASSERT_EQ(sh(cd + kBin + "/ucp-load -q --input u --output p" + std::to_string(i) + " --pp " + std::to_string(pp) +
                     " --dp 1 --partition-method '" + method + "' --layer-types layer_types.txt", &o), 0) << o;
  }
  ASSERT_EQ(i, 16);
  ASSERT_EQ(sh(cd + kPy + " " + kState + " parts " + fixture + "/partitions.json p", &out), 0) << out;
  EXPECT_EQ(out, "16 partitions equal DeepSpeed's\n");
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(RealEngine, EnginePipePartitions, ::testing::Values("pipe_module_v0.14.5", "pipe_module_v0.19.5"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "pipe_module_v0.14.5" ? std::string("v0_14_5") : std::string("v0_19_5");
                         });

// type:<regex> without --layer-types: refused naming the missing fact and the option, nothing written; a
// layer types file that does not fit is refused naming the file (and the line).
TEST(EnginePipeLayerTypes, MissingOrWrongLayerTypesAreRefusedByName) {
  const fs::path dir = ucpkit::testing::scratch_dir("engine_layer_types");
  fs::create_directories(dir);
  const std::string cd = "cd " + dir.string() + " && ";
  std::string out;
  ASSERT_EQ(sh(cd + kBin + "/ucp-union -q --input " + kEngine + "pipe_module_v0.19.5 --output u", &out), 0) << out;
  EXPECT_EQ(sh(cd + kBin + "/ucp-load -q --input u --output t --pp 3 --dp 1 --partition-method type:Block", &out), 1) << out;
  EXPECT_NE(out.find("--partition-method type:block: layer 0's class name is not known"), std::string::npos) << out;
  EXPECT_NE(out.find("give --layer-types FILE"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "t"));
  std::ofstream(dir / "short.txt") << "Embed\nBlock\nBlock\n";
  EXPECT_EQ(sh(cd + kBin + "/ucp-load -q --input u --output t --pp 3 --dp 1 --partition-method type:Block --layer-types short.txt",
               &out), 1) << out;
  EXPECT_NE(out.find("short.txt: names 3 layers, but the checkpoint has layer files up to layer 5"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "t"));
  std::ofstream(dir / "blank.txt") << "Embed\nBlock\n\nBlock\nBlock\nHead\n";
  EXPECT_EQ(sh(cd + kBin + "/ucp-load -q --input u --output t --pp 3 --dp 1 --partition-method type:Block --layer-types blank.txt",
               &out), 1) << out;
  EXPECT_NE(out.find("blank.txt:3: empty line"), std::string::npos) << out;
  EXPECT_EQ(sh(cd + kBin + "/ucp-load -q --input u --output t --pp 3 --dp 1 --partition-method type:Block --layer-types none.txt",
               &out), 1) << out;
  EXPECT_NE(out.find("none.txt: cannot read"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "t"));
  fs::remove_all(dir);
}

}  // namespace

// The file names of the pipe fixture's layout written again: DeepSpeed's plain PipelineModule runs on
// PipeDataParallelTopology, which has no model axis, so its layer files are layer_LL-model_states.pt
// (pipe/module.py v0.14.5:565-573, topology get_rank_repr); ucp-load must write them the same, from the
// universal folder and directly from the checkpoint, and the usual -model_TT- form at TP 2.
TEST(EnginePipeFileNames, SourceLayoutWritesDeepSpeedsNames) {
  const fs::path dir = ucpkit::testing::scratch_dir("engine_pipe_file_names");
  fs::create_directories(dir);
  const std::string cd = "cd " + dir.string() + " && ";
  const std::string fixture = kEngine + "pipe_module_v0.14.5";
  auto names = [](const fs::path& tag) {
    std::vector<std::string> n;
    for (const auto& e : fs::directory_iterator(tag)) n.push_back(e.path().filename().string());
    std::sort(n.begin(), n.end());
    return n;
  };
  const auto want = names(fs::path(fixture) / "global_step3");
  std::string out;
  ASSERT_EQ(sh(cd + kBin + "/ucp-union -q --input " + fixture + " --output u", &out), 0) << out;
  ASSERT_EQ(sh(cd + kBin + "/ucp-load -q --input u --output a --dp 1", &out), 0) << out;
  EXPECT_EQ(names(dir / "a" / "global_step3"), want);
  ASSERT_EQ(sh(cd + kBin + "/ucp-load -q --input " + fixture + " --output b --dp 1", &out), 0) << out;
  EXPECT_EQ(names(dir / "b" / "global_step3"), want);
  ASSERT_EQ(sh(cd + kBin + "/ucp-load -q --input u --output c --tp 2 --pp 2 --dp 1", &out), 0) << out;
  EXPECT_TRUE(fs::exists(dir / "c" / "global_step3" / "layer_00-model_01-model_states.pt"));
}

}  // namespace engine_fixtures_test
