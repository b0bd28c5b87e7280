// Native DeepSpeed MoE with the param groups of DeepSpeed's MoE tutorial (issue 33 item 1): one group of
// every parameter passed through deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer
// gives a dense group 'parameters' (norms and biases included, one weight decay) and an expert group
// 'ep_size_<EP>' (moe: True), not Megatron's decay / no-decay pair. The tools before issue 33 derived
// the groups from Megatron's rule and refused: "no no-decay param group for blocks.0.input_layernorm.weight".
// The groups now come from the files (reshard/model_info.cpp read_moe_groups). Truth: the generator
// writes the target layout itself from the same seeded values with the tutorial's grouping as DeepSpeed
// computes it (tests/generator/dsgen/dsmoe.py tutorial_groups, citing moe/utils.py), and
// tests/generator/compare_checkpoints.py compares ucp-load's files with it through Python's torch.load; the
// union -> load -> union round trip must give the same atomic tensors bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace moe_groups_tutorial_test {

namespace fs = std::filesystem;

namespace {

// UCPKIT_TEST_BIN (support/paths.h) runs these against other tools (the tools before issue 33 fail every load here).

int sh(const std::string& cmd, std::string* out = nullptr) { return ucpkit::testing::run_command(cmd, out); }

// A native-MoE checkpoint with blocks.N and the tutorial grouping, 4 blocks (MoE in blocks 1 and 3,
// 4 experts each), seed 7; `layout`: --dp --ep --zero --ds-line.
void generate(const fs::path& out, const std::string& layout) {
  std::string log;
  ASSERT_EQ(sh(kPy + " " + kSrc + "/tests/generator/gen_ds_checkpoint.py --output " + out.string() +
                   " --model dsmoe --block-prefix blocks --moe-param-groups tutorial --layers 4 --experts 4 --hidden 16"
                   " --heads 2 --ffn 32 --vocab 64 --seq 8 --seed 7 " + layout, &log), 0) << log;
}

// The param groups of a written step folder as Python's torch.load reads its optimizer shards: per
// group "<name> <moe> experts=<expert parameter names> ln=<whether blocks.0.input_layernorm.weight is
// in it>", the names the union of every DP rank's param_slice_mappings.
std::string group_summary(const fs::path& step) {
  std::string out;
  const std::string py =
      "import sys, glob, collections; sys.path.insert(0, '" + kSrc + "/tests/generator'); import dsgen, torch\n"
      "names = collections.defaultdict(set); groups = None\n"
      "for f in sorted(glob.glob(sys.argv[1] + '/*zero_pp_rank_*_optim_states.pt')):\n"
      "    o = torch.load(f, map_location='cpu')['optimizer_state_dict']; groups = o['base_optimizer_state']['param_groups']\n"
      "    for g, m in enumerate(o['param_slice_mappings']): names[g] |= set(m)\n"
      "print(';'.join('%s %s experts=%d ln=%d' % (g.get('name'), g.get('moe', False), "
      "sum('deepspeed_experts' in n for n in names[i]), 'blocks.0.input_layernorm.weight' in names[i]) "
      "for i, g in enumerate(groups)))\n";
  EXPECT_EQ(sh(kPy + " -c \"" + py + "\" " + step.string(), &out), 0) << out;
  return out;
}

struct Target {
  std::string name, load_args, gen_layout;
};

class MoeGroupsTutorial : public ::testing::TestWithParam<std::string> {};

// Source DP 2, EP 2, ZeRO-1 (the 0.14 line: model files without param_shapes, so the groups come from
// param_groups alone; the 0.19.5 line: with param_shapes). Targets: DP 4 (EP 2), ZeRO-2, EP 4.
TEST_P(MoeGroupsTutorial, UnionThenLoadToDp4Zero2AndEp4MatchesTheGeneratorAndRoundTrips) {
  const std::string line = GetParam();
  const fs::path dir = ucpkit::testing::scratch_dir("moe_groups_tutorial_" + line);
  const fs::path src = dir / "src";
  generate(src, "--dp 2 --ep 2 --zero 1 --ds-line " + line);
  std::string out;
  ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + src.string() + " --output " + (dir / "u1").string(), &out), 0) << out;
  EXPECT_EQ(sh(kPy + " " + kSrc + "/tests/to_universal/check_universal.py " + (dir / "u1").string() + " " + src.string(), &out), 0)
      << out;
  // --dtype: the 0.14 line's model file records no ds_config, and this script saved no Megatron args.
  const Target targets[] = {
      {"dp4", " --tp 1 --pp 1 --dp 4 --ep 2 --zero-stage 1 --dtype bf16", "--dp 4 --ep 2 --zero 1"},
      {"zero2", " --tp 1 --pp 1 --dp 2 --ep 2 --zero-stage 2 --dtype bf16", "--dp 2 --ep 2 --zero 2"},
      {"ep4", " --tp 1 --pp 1 --dp 4 --ep 4 --zero-stage 1 --dtype bf16", "--dp 4 --ep 4 --zero 1"},
  };
  for (const auto& t : targets) {
    SCOPED_TRACE(t.name);
    const fs::path target = dir / t.name, ref = dir / (t.name + "_ref"), u2 = dir / (t.name + "_u");
    ASSERT_EQ(sh(kBin + "/ucp-load -q --input " + (dir / "u1").string() + " --output " + target.string() + t.load_args, &out), 0)
        << out;
    generate(ref, t.gen_layout + " --ds-line " + line + " --no-truth");  // the same seed: the same values
    // Not compared: the ds_config ucp-load writes for the target, and the counters and RNG states it
    // keeps from the source (global_samples, rng_state), as tests/reshard/compare_target.py does.
    EXPECT_EQ(sh(kPy + " " + kSrc + "/tests/generator/compare_checkpoints.py " + target.string() + " " + ref.string() +
                     " --skip '*/ds_config' --skip '*/global_samples' --skip '*/rng_state'", &out), 0)
        << out;
    // The tutorial's two groups: every dense parameter (norms included) in 'parameters', every expert
    // parameter of the rank's EP slice (2 MoE layers x 4/EP experts x 4 tensors) in 'ep_size_<EP>'.
    const int ep = t.name == "ep4" ? 4 : 2;
    EXPECT_EQ(group_summary(target / "global_step100"), "parameters False experts=0 ln=1;ep_size_" + std::to_string(ep) +
                                                            " True experts=" + std::to_string(2 * (4 / ep) * 4) + " ln=0\n");
    ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + target.string() + " --output " + u2.string(), &out), 0) << out;
    // Both ways: the same atomic files, byte for byte (tests/reshard/same_universal.py).
    EXPECT_EQ(sh(kPy + " " + kSrc + "/tests/reshard/same_universal.py " + (dir / "u1").string() + " " + u2.string(), &out), 0)
        << out;
    EXPECT_EQ(sh(kPy + " " + kSrc + "/tests/reshard/same_universal.py " + u2.string() + " " + (dir / "u1").string(), &out), 0)
        << out;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Lines, MoeGroupsTutorial, ::testing::Values("0.14", "0.19.5"),
                         [](const auto& info) { return info.param == "0.14" ? std::string("v0_14") : std::string("v0_19_5"); });

// Two dense groups, no param_shapes (the 0.14 line) and no Megatron args: which parameter is in which
// group is not in the files. Refused, naming the groups and what would say it; not guessed by Megatron's rule.
TEST(MoeGroupsFromFiles, TwoDenseGroupsWithoutParamShapesOutsideMegatronAreRefused) {
  const fs::path dir = ucpkit::testing::scratch_dir("moe_groups_refused");
  const fs::path src = dir / "src";
  generate(src, "--dp 2 --ep 2 --zero 1");
  std::string out;
  ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + src.string() + " --output " + (dir / "u").string(), &out), 0) << out;
  // A second dense group in the universal folder's param_groups (a decay / no-decay split as a user's
  // script might make it): nothing in the files says which dense parameter is in which.
  const std::string py =
      "import sys; sys.path.insert(0, '" + kSrc + "/tests/generator'); import dsgen, torch; f = sys.argv[1]; "
      "sd = torch.load(f, map_location='cpu'); pg = sd['param_groups']; "
      "pg.insert(1, dict(pg[0], name='no_decay', weight_decay=0.0)); torch.save(sd, f)";
  ASSERT_EQ(sh(kPy + " -c \"" + py + "\" " + (dir / "u" / "zero" / "optimizer_state.pt").string(), &out), 0) << out;
  EXPECT_EQ(sh(kBin + "/ucp-load -q --input " + (dir / "u").string() + " --output " + (dir / "t").string() +
                   " --tp 1 --pp 1 --dp 2 --ep 2 --zero-stage 1 --dtype bf16", &out), 1)
      << out;
  EXPECT_NE(out.find("2 dense and 1 expert param groups ('parameters', 'no_decay', 'ep_size_2' (moe)) and no param_shapes in "),
            std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "t"));
  fs::remove_all(dir);
}

}  // namespace

}  // namespace moe_groups_tutorial_test
