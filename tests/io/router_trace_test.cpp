// io/router_trace: every key both tools accept, layer numbering, iterations, bad records; and the
// same trace read by moe-replace's loads reader and pec's token reader gives the same counts.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/router_trace.h"
#include "pec/tokens.h"
#include "placement/loads.h"

namespace router_trace_test {

using namespace ucpkit;
using Matrix = std::vector<std::vector<int64_t>>;

TEST(RouterTrace, EveryRoutingKeyCountsTokenExpertAssignments) {
  for (const char* key : {"top_indices", "topk_ids", "experts", "indices", "expert_ids"}) {
    std::string k = key;
    auto t = io::parse_router_trace("{\"layer\": 0, \"" + k + "\": [[0, 2], [2, 1]]}\n{\"layer\": 1, \"" + k + "\": [3]}\n", "t.jsonl");
    ASSERT_EQ(t.layers, 2u) << key;
    ASSERT_EQ(t.experts, 4u) << key;
    EXPECT_EQ(t.total("t"), (Matrix{{1, 1, 2, 0}, {0, 0, 0, 1}})) << key;
  }
  for (const char* key : {"tokens_per_expert", "expert_counts", "counts"}) {
    auto t = io::parse_router_trace("{\"layer_idx\": 0, \"" + std::string(key) + "\": [4, 0, 1]}\n", "t.jsonl");
    EXPECT_EQ(t.total("t"), (Matrix{{4, 0, 1}})) << key;
  }
  auto pairs = io::parse_router_trace("{\"layer\": 0, \"expert\": 2, \"tokens\": 7}\n{\"layer\": 0, \"expert\": 2, \"tokens\": 1}\n", "t");
  EXPECT_EQ(pairs.total("t"), (Matrix{{0, 0, 8}}));
}

TEST(RouterTrace, IterationsStaySeparateAndNumExpertsWidens) {
  auto t = io::parse_router_trace(
      "{\"layer\": 0, \"iteration\": 20, \"top_indices\": [1]}\n"
      "{\"layer\": 0, \"step\": 10, \"top_indices\": [0, 0]}\n"
      "{\"layer\": 1, \"iteration\": 20, \"top_indices\": [1], \"num_experts\": 6}\n",
      "t");
  ASSERT_EQ(t.iterations.size(), 2u);
  EXPECT_EQ(t.experts, 6u);
  EXPECT_EQ(t.iterations.at(10), (Matrix{{2, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0}}));
  EXPECT_EQ(t.iterations.at(20), (Matrix{{0, 1, 0, 0, 0, 0}, {0, 1, 0, 0, 0, 0}}));
  EXPECT_EQ(t.total("t")[0][0], 2);
}

TEST(RouterTrace, TransformerLayerIdsMapOntoMoeLayersInOrder) {
  auto t = io::parse_router_trace("{\"layer_number\": 5, \"counts\": [1]}\n{\"layer_number\": 1, \"counts\": [2]}\n"
                                  "{\"layer_number\": 3, \"counts\": [3]}\n",
                                  "t");
  EXPECT_EQ(t.total("t"), (Matrix{{2}, {3}, {1}}));
  auto moe = io::parse_router_trace("{\"moe_layer\": 2, \"counts\": [1]}\n", "t");  // never remapped
  EXPECT_EQ(moe.total("t"), (Matrix{{0}, {0}, {1}}));
  auto none = io::parse_router_trace("{\"top_indices\": [0, 1, 1]}\n", "t");  // one-layer trace
  EXPECT_EQ(none.total("t"), (Matrix{{1, 2}}));
}

TEST(RouterTrace, BadRecordsNameTheLine) {
  const char* bad[] = {
      "{\"layer\": 0}\n",                                   // no routing
      "{\"layer\": 0, \"top_indices\": [1, \"x\"]}\n",      // non-integer id
      "{\"layer\": 0, \"top_indices\": [-1]}\n",            // negative id
      "{\"layer\": -2, \"top_indices\": [1]}\n",            // negative layer
      "{\"layer\": \"a\", \"top_indices\": [1]}\n",         // layer not an integer
      "{\"layer\": 0, \"counts\": [1e300]}\n",              // count out of range
      "{\"layer\": 0, \"counts\": [1.5]}\n",                // fractional count
      "{\"layer\": 0, \"counts\": 3}\n",                    // counts not a list
      "{\"layer\": 0, \"top_indices\": 5}\n",               // ids not a list
      "[1, 2]\n",                                           // not an object
      "{\"moe_layer\": 0, \"counts\": [1]}\n{\"layer\": 3, \"counts\": [1]}\n",  // mixed layer kinds
  };
  for (const char* text : bad) {
    try {
      io::parse_router_trace(std::string("\n") + text, "trace.jsonl");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("trace.jsonl: ", 0), 0u) << e.what();
    }
  }
}

TEST(RouterTrace, BothToolsReadTheSameTraceAlike) {
  // Keys each tool alone accepted before there was one parser: top_indices (moe-replace), topk_ids and
  // layer_number (pec-save).
  const std::string trace =
      "{\"layer_number\": 1, \"iteration\": 1, \"top_indices\": [[0, 1], [1, 2]]}\n"
      "{\"layer_number\": 3, \"iteration\": 1, \"topk_ids\": [2, 2, 0]}\n";
  placement::LoadFileOptions all;
  all.window = 0;
  const placement::LoadMatrix loads = placement::parse_loads(trace, "trace.jsonl", all);
  const pec::TokenMatrix tokens = pec::parse_tokens(trace, "trace.jsonl");
  ASSERT_EQ(loads.layers, tokens.size());
  for (size_t l = 0; l < loads.layers; ++l) {
    ASSERT_EQ(loads.experts, tokens[l].size());
    for (size_t e = 0; e < loads.experts; ++e) EXPECT_EQ(loads.at(l, e), static_cast<double>(tokens[l][e])) << l << "," << e;
  }
  EXPECT_EQ(tokens, (pec::TokenMatrix{{1, 2, 1}, {1, 0, 2}}));
}

}  // namespace router_trace_test
