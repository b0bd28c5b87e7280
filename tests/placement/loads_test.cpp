// Load readers: every input format, moving average, and the errors bad input must give.
#include <gtest/gtest.h>

#include "core/error.h"
#include "placement/loads.h"
#include "support/errors.h"
#include "test_data.h"

namespace loads_test {

using namespace ucpkit;
using namespace ucpkit::placement;

TEST(Loads, JsonMatrix) {
  LoadMatrix m = parse_loads("[[1,2,3],[4,5,6]]", "x.json");
  EXPECT_EQ(m.layers, 2u);
  EXPECT_EQ(m.experts, 3u);
  EXPECT_EQ(m.at(1, 2), 6);
}

TEST(Loads, EplbExampleObject) {
  LoadMatrix m = parse_loads(R"({"weight": [[90, 132], [20, 107]], "num_replicas": 4})", "eplb.json");
  EXPECT_EQ(m.layers, 2u);
  EXPECT_EQ(m.at(1, 1), 107);
}

TEST(Loads, LogicalCountDumpSumsBufferAsThePtDumpIs) {
  // SGLang-style dump with a leading buffer dimension: [buffer][layer][expert], one entry per forward
  // pass; summed as the .pt dump is (issue 31), whatever --window says.
  std::string t = R"({"logical_count": [[[2, 4], [1, 0]], [[4, 8], [0, 3]], [[6, 12], [5, 5]]]})";
  for (size_t window : {0, 1, 2}) {
    LoadFileOptions o;
    o.window = window;
    LoadMatrix m = parse_loads(t, "dump.json", o);
    ASSERT_EQ(m.layers, 2u);
    EXPECT_EQ(m.at(0, 0), 2 + 4 + 6);
    EXPECT_EQ(m.at(0, 1), 4 + 8 + 12);
    EXPECT_EQ(m.at(1, 0), 1 + 0 + 5);
    EXPECT_EQ(m.at(1, 1), 0 + 3 + 5);
  }
  // A 2-D logical_count is taken as is; buffer entries of different shapes are refused by name.
  EXPECT_EQ(parse_loads(R"({"logical_count": [[3, 4]]})", "d.json").at(0, 1), 4);
  std::string msg = ucpkit::testing::error_of([] { parse_loads(R"({"logical_count": [[[1, 2]], [[1, 2], [3, 4]]]})", "d.json"); });
  EXPECT_NE(msg.find("d.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("logical_count"), std::string::npos) << msg;
}

TEST(Loads, IterationsPickAndAverage) {
  std::string t = R"({"iterations": {"10": [[1, 1]], "2": [[3, 5]]}})";
  EXPECT_EQ(parse_loads(t, "s.json").at(0, 0), 1);  // numeric order: 2 then 10; latest is 10
  LoadFileOptions o;
  o.snapshot = "2";
  EXPECT_EQ(parse_loads(t, "s.json", o).at(0, 1), 5);
  o.snapshot = "7";
  EXPECT_THROW(parse_loads(t, "s.json", o), Error);
}

TEST(Loads, Csv) {
  LoadMatrix m = parse_loads("layer,e0,e1\n0,1,2\n1,3,4\n", "l.csv");
  EXPECT_EQ(m.layers, 2u);
  EXPECT_EQ(m.experts, 2u);
  EXPECT_EQ(m.at(1, 0), 3);
  LoadMatrix plain = parse_loads("1,2\n3,4\n", "l.csv");
  EXPECT_EQ(plain.at(0, 1), 2);
}

TEST(Loads, MegatronRouterTrace) {
  std::string t =
      "{\"layer\": 0, \"iteration\": 1, \"top_indices\": [[0, 1], [1, 2]]}\n"
      "{\"layer\": 1, \"iteration\": 1, \"top_indices\": [2, 2, 0]}\n";
  LoadMatrix m = parse_loads(t, "trace.jsonl");
  EXPECT_EQ(m.layers, 2u);
  EXPECT_EQ(m.experts, 3u);
  EXPECT_EQ(m.at(0, 1), 2);
  EXPECT_EQ(m.at(1, 2), 2);
  LoadFileOptions o;
  o.experts = 8;
  EXPECT_EQ(parse_loads(t, "trace.jsonl", o).experts, 8u);
}

TEST(Loads, BadInputIsRejected) {
  EXPECT_THROW(parse_loads("[[1,2],[3]]", "ragged.json"), Error);
  EXPECT_THROW(parse_loads("[[1,-2]]", "neg.json"), Error);
  EXPECT_THROW(parse_loads("[[1,null]]", "nan.json"), Error);
  EXPECT_THROW(parse_loads("1,nan\n", "nan.csv"), Error);
  EXPECT_THROW(parse_loads("[]", "empty.json"), Error);
  EXPECT_THROW(parse_loads("{\"x\": 1}", "odd.json"), Error);
  EXPECT_THROW(parse_loads("[1,2,3]", "flat.json"), Error);
  try {
    parse_loads("[[1,-2]]", "neg.json");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("neg.json: layer 0 expert 1"), std::string::npos) << e.what();
  }
}

TEST(Loads, SharedDataFiles) {
  std::string smart = placement_test::shared_data("smartmoe_expert_loads.json");
  std::string eplb = placement_test::shared_data("eplb_example.json");
  if (smart.empty() || eplb.empty()) GTEST_SKIP() << "../shared/data not found (set UCPKIT_SOURCE)";
  LoadMatrix s = read_loads(smart);
  EXPECT_EQ(s.layers, 24u);
  EXPECT_EQ(s.experts, 32u);
  LoadFileOptions o;
  o.window = 0;
  LoadMatrix avg = read_loads(smart, o);
  EXPECT_EQ(avg.layers, 24u);
  LoadMatrix e = read_loads(eplb);
  EXPECT_EQ(e.layers, 2u);
  EXPECT_EQ(e.experts, 12u);
  EXPECT_EQ(e.at(0, 10), 183);
}

}  // namespace loads_test
