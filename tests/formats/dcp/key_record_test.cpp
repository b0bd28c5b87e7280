// formats/dcp/key_record: the keys a DCP was saved under, kept through the universal form (issue 47).
// get_state_dict's default paths, their flat keys, the paths a real save's planner recorded (torch 2.15's
// dcp.save: ints kept for param_groups indices), a record's lookup and its checks; no I/O but the
// fixtures' .metadata.
#include <gtest/gtest.h>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/key_record.h"
#include "support/errors.h"

namespace dcp_key_record_test {

using namespace ucpkit::formats::dcp;
using nlohmann::json;

namespace {

Metadata metadata_of(const std::string& fixture) {
  return read_folder_metadata(find_folder(ucpkit::testing::kDcpData + "/" + fixture));
}

}  // namespace

TEST(DcpKeyRecord, DefaultPathsAreGetStateDictsLayout) {
  EXPECT_EQ(model_key_path("emb.weight"), json::array({"model", "emb.weight"}));
  EXPECT_EQ(state_key_path("emb.weight", "exp_avg"), json::array({"optim", "state", "emb.weight", "exp_avg"}));
  EXPECT_EQ(group_key_path(1, "lr"), json::array({"optim", "param_groups", 1, "lr"}));
  EXPECT_EQ(flat_key(group_key_path(1, "lr")), "optim.param_groups.1.lr");
  EXPECT_EQ(flat_key(json::array({"optimizer", "state.emb.weight.exp_avg"})), "optimizer.state.emb.weight.exp_avg");
  const auto parts = pickle_path(group_key_path(3, "lr"));
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_TRUE(parts[2]->is(ucpkit::pickle::Kind::Int));
  EXPECT_EQ(parts[3]->s, "lr");
}

TEST(DcpKeyRecord, RecordedPathsAreThePlannersWithTheirInts) {
  const Metadata titan = metadata_of("t215_loop_torchtitan_w2");
  EXPECT_EQ(recorded_path(titan, "emb.weight"), json::array({"emb.weight"}));
  EXPECT_EQ(recorded_path(titan, "optimizer.state.emb.weight.exp_avg"), json::array({"optimizer", "state.emb.weight.exp_avg"}));
  EXPECT_EQ(recorded_path(titan, "train_state.step"), json::array({"train_state", "step"}));
  const Metadata gsd = metadata_of("t215_loop_gsd_bf16_w2");
  EXPECT_EQ(recorded_path(gsd, "optim.param_groups.0.lr"), group_key_path(0, "lr"));
  EXPECT_EQ(recorded_path(gsd, "model.emb.weight"), model_key_path("emb.weight"));
  // torch 1.13 records no planner_data: the key split as get_state_dict's dicts nest it.
  EXPECT_EQ(recorded_path(metadata_of("torch113_w2"), "plain"), json::array({"plain"}));
}

// The planner's paths answer from an index (a pickled dict is searched in order: recorded_path over 100,000 keys was
// 50 s of ucp-info's 58): each key's own entry; of a key pickled twice, the first (as the dict's own lookup finds it).
TEST(DcpKeyRecord, PlannerPathIsTheDictsEntry) {
  const Metadata titan = metadata_of("t215_loop_torchtitan_w2");
  ASSERT_TRUE(titan.planner);
  ASSERT_GT(titan.planner->size(), 0u);
  for (size_t k = 0; k < titan.planner->size(); ++k) EXPECT_EQ(titan.planner->find(titan.planner->flat(k)), k);
  EXPECT_EQ(titan.planner->find("no.such.key"), std::nullopt);
  using ucpkit::pickle::Value;
  const auto pd = Value::dict();
  pd->entries.emplace_back(Value::str("k"), Value::tuple({Value::str("a")}));
  pd->entries.emplace_back(Value::str("k"), Value::tuple());
  bool all = true;
  Metadata md;
  md.planner = std::make_shared<PlannerPaths>(PlannerPaths::of(*pd, &all));
  EXPECT_FALSE(all);  // a key given twice is not DefaultSavePlanner's
  EXPECT_EQ(md.planner->size(), 1u);
  EXPECT_EQ(recorded_path(md, "k"), json::array({"a"}));
}

TEST(DcpKeyRecord, ARecordGivesTheSavedPathElseTheDefault) {
  json record = json::object();
  record_key(record, model_key_path("a"), model_key_path("a"));  // the same: nothing recorded
  EXPECT_TRUE(record.empty());
  record_key(record, model_key_path("a"), json::array({"a"}));
  record_key(record, model_key_path("train_state.step"), json::array({"train_state", "step"}));
  EXPECT_EQ(record.size(), 2u);
  EXPECT_EQ(saved_path(record, model_key_path("a")), json::array({"a"}));
  EXPECT_EQ(saved_path(record, model_key_path("train_state.step")), json::array({"train_state", "step"}));
  EXPECT_EQ(saved_path(record, model_key_path("b")), model_key_path("b"));
  EXPECT_EQ(ucpkit::testing::error_of([&] { check_key_record(record, "/u/manifest.json"); }), "");
  for (const json& bad : {json::array(), json({{"model.a", json::array()}}), json({{"model.a", json::array({"a", 1.5})}}),
                          json({{"model.a", "a"}})}) {
    const std::string msg = ucpkit::testing::error_of([&] { check_key_record(bad, "/u/manifest.json"); });
    EXPECT_EQ(msg.rfind("/u/manifest.json: malformed: source.dcp.keys", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace dcp_key_record_test
