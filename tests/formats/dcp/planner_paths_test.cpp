// lib/formats/dcp/planner_paths: DefaultSavePlanner's planner_data held flat: paths found by their flat fqn (keys and
// list indices, tuples and lists, a repeated key refused), as pickle values and back, merged first-wins; written into
// a `.metadata` and read back the same by both readers (the one-pass one and the general unpickler's).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "formats/dcp/metadata.h"
#include "formats/dcp/planner_paths.h"
#include "formats/dcp/save_plan.h"
#include "formats/dcp/writer.h"

namespace dcp_planner_paths_test {

using namespace ucpkit::formats::dcp;
using ucpkit::pickle::Value;
using Part = PlannerPaths::Part;
using S = std::vector<std::string>;

namespace {

// torchtitan's keys and get_state_dict's, a list path, a path of five parts and one of none.
PlannerPaths sample() {
  PlannerPaths p;
  EXPECT_TRUE(p.add("model.a.weight", std::vector<Part>{{"model"}, {"a.weight"}}));
  EXPECT_TRUE(p.add("optim.param_groups.1.lr", std::vector<Part>{{"optim"}, {"param_groups"}, {{}, 1, true}, {"lr"}}));
  EXPECT_TRUE(p.add("emb.weight", std::vector<Part>{{"emb.weight"}}));
  EXPECT_TRUE(p.add("l.0", std::vector<Part>{{"l"}, {{}, 0, true}}, true));
  EXPECT_TRUE(p.add("a.b.c.d.e", std::vector<Part>{{"a"}, {"b"}, {"c"}, {"d"}, {"e"}}));
  EXPECT_TRUE(p.add("empty", std::vector<Part>{}));
  return p;
}

}  // namespace

TEST(DcpPlannerPaths, PathsFoundByTheirFlatKeyARepeatRefused) {
  PlannerPaths p = sample();
  ASSERT_EQ(p.size(), 6u);
  EXPECT_EQ(p.find("optim.param_groups.1.lr"), 1u);
  EXPECT_EQ(p.find("optim.param_groups.1"), std::nullopt);
  EXPECT_EQ(p.strings("optim.param_groups.1.lr"), (S{"optim", "param_groups", "1", "lr"}));
  EXPECT_EQ(p.strings("no.such.key"), S{});
  EXPECT_TRUE(p.part(1, 2).is_index);
  EXPECT_EQ(p.part(1, 2).index, 1);
  EXPECT_EQ(p.part(0, 1).key, "a.weight");
  EXPECT_TRUE(p.is_list(3));
  EXPECT_FALSE(p.is_list(0));
  EXPECT_FALSE(p.add("emb.weight", std::vector<Part>{{"other"}}));  // the first stays
  EXPECT_EQ(p.size(), 6u);
  EXPECT_EQ(p.strings("emb.weight"), S{"emb.weight"});
}

TEST(DcpPlannerPaths, AsPickleValuesAndBackAndMergedFirstWins) {
  const PlannerPaths p = sample();
  const auto v = p.value();
  EXPECT_EQ(v->at("optim.param_groups.1.lr")->repr(), "('optim', 'param_groups', 1, 'lr')");
  EXPECT_EQ(v->at("l.0")->repr(), "['l', 0]");
  bool all = false;
  EXPECT_TRUE(PlannerPaths::of(*v, &all) == p);
  EXPECT_TRUE(all);
  // A custom planner's entries (a float in a path, a key that is not a str) are left out, and said to be.
  v->entries.emplace_back(Value::str("f"), Value::tuple({Value::real(1.5)}));
  v->entries.emplace_back(Value::integer(3), Value::tuple({Value::str("x")}));
  EXPECT_TRUE(PlannerPaths::of(*v, &all) == p);
  EXPECT_FALSE(all);
  PlannerPaths merged;
  merged.add("emb.weight", std::vector<Part>{{"first"}});
  merged.add_all(p);
  EXPECT_EQ(merged.size(), 6u);
  EXPECT_EQ(merged.strings("emb.weight"), S{"first"});
  EXPECT_EQ(merged.strings("a.b.c.d.e"), (S{"a", "b", "c", "d", "e"}));
}

// The plan listing the entries in the paths' order (each flat key fetched from the entry's memo entry) and in
// another (looked up by its text): the same paths come back.
TEST(DcpPlannerPaths, WrittenIntoMetadataAndReadBackTheSameByBothReaders) {
  const auto p = std::make_shared<const PlannerPaths>(sample());
  for (const bool reversed : {false, true}) {
    SavePlan plan;
    WriteResult written;
    for (size_t j = 0; j < p->size(); ++j) {
      const size_t k = reversed ? p->size() - 1 - j : j;
      Entry e;
      e.fqn = std::string(p->flat(k));
      e.is_bytes = true;
      plan.entries.push_back(e);
      written.storage.push_back({"__0_0.distcp", 8 * j, 8});
      written.order.push_back({j, PlannedItem::kBytes});
    }
    WriteOptions options;
    options.planner = p;
    const std::string bytes = metadata_pickle(plan, written, options, "/ck");
    const std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    for (const Metadata& md : {parse_metadata(span, "m"), parse_metadata_general(span, "m")}) {
      ASSERT_TRUE(md.planner) << reversed;
      EXPECT_TRUE(*md.planner == *p) << reversed;
      EXPECT_FALSE(md.other_planner_data);
      EXPECT_EQ(md.items_of(std::string(p->flat(2))).size(), 1u);
    }
  }
}

}  // namespace dcp_planner_paths_test
