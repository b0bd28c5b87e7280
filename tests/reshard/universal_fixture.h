// A universal checkpoint for the writer unit tests: ucp-union of a load fixture's dsgen source
// (tests/reshard/fixtures.py), made once per test process, with the paths of the generator's ground
// truth beside it.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "reshard/load.h"
#include "support/process.h"

namespace ucpkit::loadtest {

struct UnionedCase {
  std::filesystem::path universal;  // ucp-union's output
  std::filesystem::path src;        // the dsgen source checkpoint
  std::filesystem::path ref;        // dsgen's checkpoint of the case's target layout (same seed)
  std::filesystem::path truth;      // src/truth: meta.json and universal/zero/<name>/<state>.pt
};

// tests/reshard/cases.py's first CI case: GPT (tied vocabulary embedding, column / row split and
// replicated parameters), source TP 1 DP 2, target TP 2 DP 3 ZeRO-1 bf16.
inline constexpr const char* kGptCase = "gpt_tp1dp2_to_tp2dp3";

inline const UnionedCase& gpt_case() {
  static const UnionedCase c = [] {
    const std::string name = kGptCase;
    UnionedCase u;
    const std::filesystem::path fx = std::filesystem::path(UCPKIT_FIXTURES_DIR) / name;
    u.src = fx / "src";
    u.ref = fx / "ref";
    u.truth = u.src / "truth";
    u.universal = std::filesystem::path(ucpkit::testing::scratch_dir("unioned_" + name)) / "u";
    std::string out;
    if (ucpkit::testing::run_command(std::string(UCPKIT_BIN_DIR) + "/ucp-union -q --input " +
                                         ucpkit::testing::quote(u.src.string()) + " --output " +
                                         ucpkit::testing::quote(u.universal.string()),
                                     &out) != 0)
      ADD_FAILURE() << "ucp-union of " << name << " failed: " << out;
    return u;
  }();
  return c;
}

// ucp-union --to-names megatron-core of the GPT case's source, made once per test process.
inline const std::string& gpt_megatron_core_named() {
  static const std::string dir = [] {
    const std::string d = ucpkit::testing::scratch_dir("megatron_core_named") + "/mc";
    std::string out;
    if (ucpkit::testing::run_command(std::string(UCPKIT_BIN_DIR) + "/ucp-union -q --to-names megatron-core --input " +
                                         ucpkit::testing::quote(gpt_case().src.string()) + " --output " +
                                         ucpkit::testing::quote(d),
                                     &out) != 0)
      ADD_FAILURE() << "ucp-union --to-names megatron-core failed: " << out;
    return d;
  }();
  return dir;
}

// A copy of that folder, to change (`name`: the scratch folder's).
inline std::string gpt_megatron_core_named_copy(const std::string& name) {
  const std::string d = ucpkit::testing::scratch_dir("megatron_core_named_" + name) + "/mc";
  std::filesystem::copy(gpt_megatron_core_named(), d, std::filesystem::copy_options::recursive);
  return d;
}

// ucp-load's options for the GPT case's target (tests/reshard/cases.py): TP 2 DP 3 ZeRO-1 bf16 with the
// ZeRO optimizer, vocabulary multiple 8, two threads.
inline reshard::LoadOptions gpt_options(const std::string& input, const std::string& output) {
  reshard::LoadOptions o;
  o.input = input;
  o.output = output;
  o.target.tp = 2;
  o.target.dp = 3;
  o.target.zero_stage = 1;
  o.target.dtype = DType::BFloat16;
  o.optimizer = reshard::OptimizerKind::Zero;
  o.vocab_multiple = 8;
  o.threads = 2;
  return o;
}

}  // namespace ucpkit::loadtest
