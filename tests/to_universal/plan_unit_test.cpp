// Unit tests of lib/ucp's plain-data parts (issue 21: ucp/ was tested only end to end): the extract
// plan's JSON form, folder names and pickle values as JSON (the shard-agreement walk over partitions is in
// shard_agreement_test.cpp).
// Expected values are written out by hand from the documented forms, not computed by the code.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/pickle/value.h"
#include "to_universal/plan.h"
#include "to_universal/value_json.h"

namespace ucpkit::to_universal {
namespace plan_unit_test {
namespace {

using pickle::Value;

ExtractPlan two_param_plan() {
  ExtractPlan p;
  p.source = ucpkit::formats::universal::UniversalSource::from_json({{"tp", 2}, {"dp", 2}, {"zero_stage", 1}}, "plan.json");
  p.patterns_json = nlohmann::json::object();
  p.patterns_origin = "builtin";
  p.files = {"a.pt", "b.pt"};
  p.model_files = {"m0.pt"};
  p.optimizer_state_file = "a.pt";
  ParamPlan w;
  w.name = "w";
  w.tp_shapes = {{2, 3}, {2, 3}};
  w.fragments = {{{0, 0, 0, 6, 0}}, {{1, 0, 0, 4, 0}, {1, 1, 4, 2, 1}}};
  w.states = {"fp32", "exp_avg"};
  w.step_file = 0;
  w.step_group = 0;
  ParamPlan e;
  e.name = "layers.0.mlp.experts.3.w";
  e.tp_shapes = {{5}};
  e.fragments = {{{1, 2, 10, 5, 1}}};
  e.states = {"fp32"};
  e.moe_layer = 0;
  e.expert = 3;
  e.pp_stage = 1;
  p.params = {w, e};
  return p;
}

TEST(UcpPlan, JsonFormHasTheDocumentedKeysAndFragmentTuples) {
  const nlohmann::json j = two_param_plan().to_json();
  EXPECT_EQ(j["format"], "ucpkit-extract-plan");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["files"], nlohmann::json::parse(R"(["a.pt","b.pt"])"));
  // Fragments are [file, group, offset, numel, part], per TP rank.
  EXPECT_EQ(j["params"][0]["fragments"], nlohmann::json::parse("[[[0,0,0,6,0]],[[1,0,0,4,0],[1,1,4,2,1]]]"));
  EXPECT_EQ(j["params"][0]["step"], nlohmann::json::parse("[0,0]"));
  EXPECT_FALSE(j["params"][0].contains("expert"));
  EXPECT_EQ(j["params"][1]["expert"], nlohmann::json::parse("[0,3]"));
  EXPECT_EQ(j["params"][1]["pp_stage"], 1);
}

TEST(UcpPlan, JsonRoundTripKeepsEveryField) {
  const ExtractPlan a = two_param_plan();
  const ExtractPlan b = ExtractPlan::from_json(a.to_json());
  EXPECT_EQ(b.to_json(), a.to_json());
  ASSERT_EQ(b.params.size(), 2u);
  EXPECT_EQ(b.params[1].expert, 3);
  EXPECT_EQ(b.params[1].moe_layer, 0);
  EXPECT_EQ(b.params[0].fragments[1][1].offset, 4);
  EXPECT_EQ(b.params[0].fragments[1][1].part, 1);
}

TEST(UcpPlan, NumelAddsEveryTpSlice) {
  EXPECT_EQ(two_param_plan().params[0].numel(), 12);
  EXPECT_EQ(two_param_plan().params[0].bytes_in(), 12u * 4 * 2);
}

TEST(UcpPlan, ParamFolderReplacesSlashesAndRefusesDotNames) {
  EXPECT_EQ(param_folder("a.b/c"), "a.b_c");
  EXPECT_EQ(param_folder("x"), "x");
  EXPECT_THROW(param_folder(""), Error);
  EXPECT_THROW(param_folder("."), Error);
  EXPECT_THROW(param_folder(".."), Error);
}

TEST(UcpValueJson, PlainValuesBecomeJsonAndTensorsAKindName) {
  auto d = Value::dict();
  d->set_item("lr", Value::real(0.5));
  d->set_item("betas", Value::tuple({Value::real(0.9), Value::real(0.95)}));
  d->set_item("name", Value::str("adam"));
  d->set_item("none", Value::none());
  d->set_item("shape", Value::torch_size({2, 3}));
  const nlohmann::json j = value_to_json(d);
  EXPECT_EQ(j["lr"], 0.5);
  EXPECT_EQ(j["betas"], nlohmann::json::parse("[0.9,0.95]"));
  EXPECT_EQ(j["name"], "adam");
  EXPECT_TRUE(j["none"].is_null());
  EXPECT_EQ(j["shape"], nlohmann::json::parse("[2,3]"));
}

}  // namespace
}  // namespace plan_unit_test
}  // namespace ucpkit::to_universal
