// Target defaults without I/O (lib/reshard/target_defaults): what the caller leaves out is the source's,
// reported in from_source; a value the source does not record is a usage error naming the option;
// the layout record's difference text (lib/reshard/layout_record).
#include <gtest/gtest.h>

#include "core/error.h"
#include "reshard/layout_record.h"
#include "reshard/plan_models.h"
#include "reshard/target_defaults.h"

namespace target_defaults_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace {

// The message of the UsageError `f` throws ("" when it returns).
template <typename F>
std::string usage_error_of(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// A native-MoE source saved at TP 1 PP 1 EP 2, ZeRO-2, fp16.
ModelInfo moe_source() {
  ModelInfo m = test_models::tiny_model();
  m.native_moe = true;
  m.source_ep = 2;
  m.source_zero_stage = 2;
  m.source_dtype = DType::Float16;
  return m;
}

TargetGiven nothing_but_dp() {
  TargetGiven g;
  g.tp = g.pp = g.zero_stage = g.ep = g.dtype = false;
  return g;
}

TEST(TargetDefaults, LeftOutFieldsAreTheSourcesAndReported) {
  TargetLayout t;
  t.dp = 4;
  const auto from = apply_source_defaults(t, nothing_but_dp(), moe_source(), OutputFormat::DeepSpeed);
  EXPECT_EQ(t.ep, 2);
  EXPECT_EQ(t.zero_stage, 2);
  EXPECT_EQ(t.dtype, DType::Float16);
  EXPECT_EQ(from, nlohmann::json::parse(R"({"tp": 1, "pp": 1, "ep": 2, "zero_stage": 2, "dtype": "fp16"})"));
  EXPECT_EQ(describe_source_defaults(from), "from the source (not given on the command line): tp 1, pp 1, ep 2, "
                                            "zero_stage 2, dtype fp16");
  // Everything given: nothing changes, nothing reported.
  TargetLayout given;
  given.dp = 4;
  given.ep = 4;
  given.dtype = DType::BFloat16;
  const TargetLayout before = given;
  EXPECT_TRUE(apply_source_defaults(given, TargetGiven{}, moe_source(), OutputFormat::DeepSpeed).empty());
  EXPECT_EQ(given.to_json(), before.to_json());
  EXPECT_EQ(describe_source_defaults(nlohmann::json::object()), "");
}

TEST(TargetDefaults, DenseModelsTakeNoEp) {
  ModelInfo m = test_models::tiny_model();
  m.source_tp = 2;
  m.source_zero_stage = 1;
  m.source_dtype = DType::BFloat16;
  TargetLayout t;
  t.dp = 3;
  const auto from = apply_source_defaults(t, nothing_but_dp(), m, OutputFormat::DeepSpeed);
  EXPECT_FALSE(from.contains("ep"));
  EXPECT_EQ(t.ep, 1);
  EXPECT_EQ(t.tp, 2);
}

TEST(TargetDefaults, WhatTheSourceDoesNotRecordMustBeGiven) {
  ModelInfo m = moe_source();
  m.source_dtype.reset();
  TargetLayout t;
  t.dp = 4;
  EXPECT_NE(usage_error_of([&] { apply_source_defaults(t, nothing_but_dp(), m, OutputFormat::DeepSpeed); }).find("give --dtype"),
            std::string::npos);
  m.source_bf16_optimizer = true;  // BF16_Optimizer shards: bf16
  TargetLayout t2;
  t2.dp = 4;
  apply_source_defaults(t2, nothing_but_dp(), m, OutputFormat::DeepSpeed);
  EXPECT_EQ(t2.dtype, DType::BFloat16);
  m.source_zero_stage = 0;  // not recorded by the shards ...
  TargetLayout t3;
  t3.dp = 4;
  EXPECT_NE(usage_error_of([&] { apply_source_defaults(t3, nothing_but_dp(), m, OutputFormat::DeepSpeed); }).find("give --zero-stage"),
            std::string::npos);
  m.source_config_zero_stage = 0;  // ... but by the saved ds_config
  apply_source_defaults(t3, nothing_but_dp(), m, OutputFormat::DeepSpeed);
  EXPECT_EQ(t3.zero_stage, 0);
  // The source's EP must divide the DP asked for; the message says to give --ep.
  TargetLayout t4;
  t4.dp = 3;
  EXPECT_NE(usage_error_of([&] { apply_source_defaults(t4, nothing_but_dp(), moe_source(), OutputFormat::DeepSpeed); })
                .find("does not divide DP 3: give --ep"),
            std::string::npos);
}

TEST(TargetDefaults, WorldSizeGivesDp) {
  ModelInfo m = moe_source();
  m.source_tp = 2;
  TargetGiven g = nothing_but_dp();
  g.dp = false;
  g.world_size = 8;
  TargetLayout t;
  apply_source_defaults(t, g, m, OutputFormat::DeepSpeed);
  EXPECT_EQ(t.dp, 4);
  g.world_size = 7;
  TargetLayout t2;
  EXPECT_EQ(usage_error_of([&] { apply_source_defaults(t2, g, m, OutputFormat::DeepSpeed); }),
            "--world-size 7 is not a multiple of TP * PP = 2 * 1 (give --dp, or a world size that is)");
  g.world_size = 0;
  EXPECT_EQ(usage_error_of([&] { apply_source_defaults(t2, g, m, OutputFormat::DeepSpeed); }),
            "--dp or --world-size is required (see --help)");
  // Safetensors: only the dtype applies.
  TargetLayout t3;
  const auto from = apply_source_defaults(t3, g, m, OutputFormat::Safetensors);
  EXPECT_EQ(from, nlohmann::json::parse(R"({"dtype": "fp16"})"));
}

TEST(LayoutRecord, DifferenceNamesEveryChangedField) {
  const auto have = nlohmann::json::parse(R"({"tool": "ucp-load", "tp": 1, "ep": 2, "dtype": "fp16"})");
  EXPECT_EQ(layout_difference(have, have), "");
  auto want = have;
  want["tool"] = "other";  // not part of the layout
  EXPECT_EQ(layout_difference(have, want), "");
  want["ep"] = 4;
  want["dtype"] = "bf16";
  want["dp"] = 3;
  EXPECT_EQ(layout_difference(have, want), "dp not recorded (requested 3), dtype \"fp16\" (requested \"bf16\"), "
                                           "ep 2 (requested 4)");
}

}  // namespace

}  // namespace target_defaults_test
