// A checkpoint saved by DeepSpeed's real engine (v0.14.5, CPU, gloo; DP 2, EP 2, ZeRO-1, fp32) of a
// model that is not Megatron's (blocks.N, DeepSpeed MoE in blocks 1 and 3) with the MoE tutorial's
// param groups (tests/generator/engine/moe_tutorial_v0.14.5/PROVENANCE.md; issue 33 item 1). The tools
// before issue 33 refused it in ucp-load ("no no-decay param group for blocks.0.ln1.weight"). Truth:
// the weights the engine's ranks held after the last step (truth/weights_rank<R>.pt, written by the
// training script); the union -> load -> union round trip to DP 4, ZeRO-2 and EP 4 must give the same
// atomic tensors bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace moe_groups_engine_test {

namespace fs = std::filesystem;

namespace {

// UCPKIT_TEST_BIN (support/paths.h) runs these against other tools (the tools before issue 33 fail the loads here).
const std::string kFixture = kSrc + "/tests/generator/engine/moe_tutorial_v0.14.5";

int sh(const std::string& cmd, std::string* out = nullptr) { return ucpkit::testing::run_command(cmd, out); }

// Every truth weight equals the universal fp32 state of that name bit for bit, and every parameter of
// the manifest has one: prints "<n> weights equal".
std::string against_truth(const fs::path& universal) {
  std::string out;
  const std::string py =
      "import sys, json, glob, torch\n"
      "truth = {}\n"
      "for f in sorted(glob.glob(sys.argv[2] + '/truth/weights_rank*.pt')): truth.update(torch.load(f))\n"
      "names = [p['name'] for p in json.load(open(sys.argv[1] + '/manifest.json'))['params']]\n"
      "assert sorted(names) == sorted(truth), (sorted(set(names) ^ set(truth)))\n"
      "for n in names:\n"
      "    u = torch.load(sys.argv[1] + '/zero/' + n + '/fp32.pt')['param']\n"
      "    assert u.dtype == truth[n].dtype and u.shape == truth[n].shape and torch.equal(u, truth[n]), n\n"
      "print(len(names), 'weights equal')\n";
  EXPECT_EQ(sh(kPy + " -c \"" + py + "\" " + universal.string() + " " + kFixture, &out), 0) << out;
  return out;
}

TEST(MoeGroupsEngine, RealEngineTutorialCheckpointUnionMatchesTheEngineAndLoadsRoundTrip) {
  const fs::path dir = ucpkit::testing::scratch_dir("moe_groups_engine");
  std::string out;
  // As a job script runs it: relative paths, from another working directory.
  fs::create_directories(dir);
  ASSERT_EQ(sh("cd " + dir.string() + " && " + kBin + "/ucp-union -q --input " + kFixture + " --output u1", &out), 0) << out;
  // 17 dense tensors + 2 MoE layers x 4 experts x (weight, bias).
  EXPECT_EQ(against_truth(dir / "u1"), "33 weights equal\n");
  struct Target {
    std::string name, args, group;
  };
  const Target targets[] = {{"dp4", "--dp 4 --ep 2 --zero-stage 1", "ep_size_2"},
                            {"zero2", "--dp 2 --ep 2 --zero-stage 2", "ep_size_2"},
                            {"ep4", "--dp 4 --ep 4 --zero-stage 1", "ep_size_4"}};
  for (const auto& t : targets) {
    SCOPED_TRACE(t.name);
    ASSERT_EQ(sh("cd " + dir.string() + " && " + kBin + "/ucp-load -q --input u1 --output " + t.name +
                     " --tp 1 --pp 1 --dtype fp32 " + t.args, &out), 0) << out;
    // The engine's groups kept: names and the moe flag, from the written shard (Python's torch.load).
    const std::string py =
        "import sys; sys.path.insert(0, '" + kSrc + "/tests/generator'); import dsgen, torch; o = torch.load(sys.argv[1])['optimizer_state_dict']; "
        "print([(g['name'], g.get('moe', False)) for g in o['base_optimizer_state']['param_groups']])";
    EXPECT_EQ(sh(kPy + " -c \"" + py + "\" " + (dir / t.name / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").string(),
                 &out), 0) << out;
    EXPECT_EQ(out, "[('parameters', False), ('" + t.group + "', True)]\n");
    ASSERT_EQ(sh("cd " + dir.string() + " && " + kBin + "/ucp-union -q --input " + t.name + " --output " + t.name + "_u", &out), 0)
        << out;
    const std::string back = t.name + "_u";
    for (const auto& [a, b] : {std::pair<std::string, std::string>{"u1", back}, {back, "u1"}})
      EXPECT_EQ(sh(kPy + " " + kSrc + "/tests/reshard/same_universal.py " + (dir / a).string() + " " + (dir / b).string(), &out), 0)
          << out;
  }
  fs::remove_all(dir);
}

}  // namespace

}  // namespace moe_groups_engine_test
