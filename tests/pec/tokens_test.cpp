// pec/tokens.h: token counts per MoE layer and expert. The parsers of the three formats (JSON matrix,
// CSV long or matrix, router trace JSONL) and their refusals, the fixture's files (tests/pec/fixtures.py
// writes fixed.csv and fixed.jsonl with counts 10 * (e + 1) in layer 0 and e + 1 in layer 1), a tokens
// folder's file of a step, fit/zero/add, and the store's JSON form. (The first cases moved here from
// planning_test.cpp and step_sources_test.cpp.)
#include "pec/tokens.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace tokens_test {

using namespace ucpkit;
using namespace ucpkit::pec;
using ucpkit::testing::error_of;

namespace {
bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }
}  // namespace

TEST(PecTokens, JsonMatrix) {
  auto m = parse_tokens("[[1,2,3],[4,5,6]]", "t");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[1][2], 6);
  auto m2 = parse_tokens(R"({"tokens": [[7, 8]]})", "t");
  EXPECT_EQ(m2[0][1], 8);
}

TEST(PecTokens, CsvLongAndMatrix) {
  auto m = parse_tokens("moe_layer,expert,tokens\n0,1,10\n1,3,5\n0,1,2\n", "t");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0][1], 12);
  EXPECT_EQ(m[1][3], 5);
  auto m2 = parse_tokens("1,2\n3,4\n", "t");
  EXPECT_EQ(m2[1][0], 3);
}

TEST(PecTokens, RouterTraceJsonl) {
  auto m = parse_tokens(
      "{\"layer\": 0, \"topk_ids\": [[0, 1], [1, 2]]}\n{\"layer\": 1, \"tokens_per_expert\": [4, 0, 1]}\n"
      "{\"layer\": 0, \"experts\": [2]}\n",
      "t");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(m[1], (std::vector<int64_t>{4, 0, 1}));
}

TEST(PecTokens, RouterTraceByTransformerLayerMapsToMoeLayerOrder) {
  // Megatron numbers transformer layers; with MoE every other layer a trace reads 1, 3, 5.
  auto m = parse_tokens(
      "{\"layer_number\": 3, \"tokens_per_expert\": [0, 7]}\n"
      "{\"layer_number\": 1, \"topk_ids\": [[1, 0], [1, 1]]}\n"
      "{\"layer_number\": 5, \"counts\": [2, 2]}\n"
      "{\"layer_number\": 1, \"experts\": [0]}\n",
      "t");
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0], (std::vector<int64_t>{2, 3}));  // transformer layer 1
  EXPECT_EQ(m[1], (std::vector<int64_t>{0, 7}));  // transformer layer 3
  EXPECT_EQ(m[2], (std::vector<int64_t>{2, 2}));  // transformer layer 5
  // Ids that already are 0..L-1 stay as they are; `moe_layer` is never remapped.
  auto dense = parse_tokens("{\"layer\": 1, \"counts\": [1]}\n{\"layer\": 0, \"counts\": [2]}\n", "t");
  EXPECT_EQ(dense, (TokenMatrix{{2}, {1}}));
  auto moe = parse_tokens("{\"moe_layer\": 1, \"counts\": [5]}\n", "t");
  EXPECT_EQ(moe, (TokenMatrix{{0}, {5}}));
  EXPECT_THROW(parse_tokens("{\"moe_layer\": 0, \"counts\": [1]}\n{\"layer\": 3, \"counts\": [1]}\n", "t"), Error);
}

TEST(PecTokens, BadInputFailsClearly) {
  EXPECT_THROW(parse_tokens("[[1, -2]]", "t"), Error);
  EXPECT_THROW(parse_tokens("a,b\nx,y\n", "t"), Error);
  EXPECT_THROW(fit_tokens({{1, 2, 3}}, {2}, "t"), Error);
  auto f = fit_tokens({{1}, {2}}, {2, 3}, "t");  // experts past a layer's counts: zeros
  EXPECT_EQ(f[1], (std::vector<int64_t>{2, 0, 0}));
}

// Issue 32 (WEAK, cross-checks): a MoE layer missing from the counts was read as zeros, and a
// fractional count was rounded (2.5 -> 3). Both are refused, naming the file.
TEST(PecTokens, MissingLayerAndFractionalCountsAreRefused) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message([] {
              fit_tokens({{1, 2}}, {2, 2}, "t.json");
            }).rfind("t.json: token counts for 1 MoE layers", 0),
            0u);
  EXPECT_EQ(message([] {
              fit_tokens(parse_tokens("moe_layer,expert,tokens\n0,0,1\n2,0,1\n", "t.csv"), {1, 1, 1}, "t.csv");
            }).rfind("t.csv: no token counts for MoE layer 1", 0),
            0u);
  for (const char* text :
       {"[[1, 2.5]]", "2.5,1\n", "moe_layer,expert,tokens\n0,0,0.5\n", "{\"tokens\": [[1e0, 0.25]]}"})
    EXPECT_NE(message([&] { parse_tokens(text, "t"); }).find("is not a whole number"), std::string::npos) << text;
  EXPECT_EQ(parse_tokens("[[1.0, 2e0]]", "t"), (TokenMatrix{{1, 2}}));  // whole numbers written as decimals
}

TEST(PecTokens, FolderGivesTheFileOfTheStep) {
  const std::string d = ucpkit::testing::scratch_dir("tokens_folder");
  { std::ofstream(d + "/step100.json") << "[[1, 2]]"; }
  { std::ofstream(d + "/step200.csv") << "3,4\n"; }
  EXPECT_EQ(tokens_file_for_step(d + "/step100.json", 999), d + "/step100.json");  // a file: itself
  EXPECT_EQ(tokens_file_for_step(d, 100), d + "/step100.json");
  EXPECT_EQ(load_tokens(tokens_file_for_step(d, 200)), TokenMatrix({{3, 4}}));
  try {
    tokens_file_for_step(d, 300);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), d + ": no token counts for step 300 (step300.json, .csv or .jsonl)")) << e.what();
  }
  { std::ofstream(d + "/step100.jsonl") << "{}"; }
  try {
    tokens_file_for_step(d, 100);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "more than one token-count file for step 100")) << e.what();
  }
}

TEST(PecTokens, FixtureFilesInEveryFormatGiveTheSameCounts) {
  const TokenMatrix want = {{10, 20, 30, 40}, {1, 2, 3, 4}};
  EXPECT_EQ(load_tokens(kFx + "/tokens/fixed.csv"), want);
  EXPECT_EQ(load_tokens(kFx + "/tokens/fixed.jsonl"), want);
  // A step's JSON matrix, as Python's json reads it.
  const nlohmann::json j = nlohmann::json::parse(ucpkit::testing::file_bytes(kFx + "/tokens/step300.json"));
  EXPECT_EQ(load_tokens(kFx + "/tokens/step300.json"), j.get<TokenMatrix>());
  EXPECT_EQ(load_tokens(tokens_file_for_step(kFx + "/tokens", 300)), j.get<TokenMatrix>());
  EXPECT_NE(error_of([] { load_tokens(kFx + "/tokens/none.json"); }).find("none.json"), std::string::npos);
}

TEST(PecTokens, CsvHeadersCommentsAndBlankLines) {
  // Column names in any case and order; `global_expert` and `count` are accepted too.
  EXPECT_EQ(parse_tokens("# a comment\n\nTokens,Global_Expert,Layer\n5,1,0\n  \n7,0,1\n", "t"),
            (TokenMatrix{{0, 5}, {7}}));
  EXPECT_EQ(parse_tokens("layer,expert,count\n0,0,3\n", "t"), (TokenMatrix{{3}}));
  EXPECT_EQ(error_of([] { parse_tokens("layer,expert\n0,0\n", "t.csv"); }),
            "t.csv: CSV header needs layer, expert and tokens columns");
  EXPECT_EQ(error_of([] { parse_tokens("layer,expert,tokens\n0,0\n", "t.csv"); }),
            "t.csv: CSV row 2 has too few columns");
  EXPECT_EQ(error_of([] { parse_tokens("1,2\n3\n", "t.csv"); }),
            "t.csv: ragged matrix: MoE layer 1 has 1 counts, layer 0 has 2");
  EXPECT_EQ(error_of([] { parse_tokens("1,x2\n", "t.csv"); }), "t.csv: not a token count: 'x2'");
  EXPECT_EQ(error_of([] { parse_tokens("  \n", "t.csv"); }), "t.csv: empty token-count file");
  EXPECT_EQ(parse_tokens("# only a comment\n", "t"), TokenMatrix{});
}

TEST(PecTokens, CountsOutsideZeroToTwoToThe53AreRefused) {
  EXPECT_EQ(parse_tokens("[[9007199254740992]]", "t"), (TokenMatrix{{9007199254740992}}));  // 2^53
  for (const char* text : {"[[1e300]]", "[[-1]]", "9007199254740994\n", "inf\n", "nan\n"}) {
    const std::string e = error_of([&] { parse_tokens(text, "t"); });
    EXPECT_TRUE(contains(e, "is not a number in [0, 2^53]")) << text << ": " << e;
  }
  EXPECT_EQ(error_of([] { parse_tokens("[[1, \"2\"]]", "t"); }), "t: token counts must be non-negative numbers");
  EXPECT_EQ(error_of([] { parse_tokens("[1, 2]", "t"); }), "t: expected a JSON matrix [moe_layer][global_expert]");
  EXPECT_EQ(error_of([] { parse_tokens("[[1, 2], [3]]", "t"); }),
            "t: ragged matrix: MoE layer 1 has 1 counts, layer 0 has 2");
  EXPECT_TRUE(contains(error_of([] { parse_tokens("[[1, 2]", "t"); }), "t: bad JSON"));
  // Long-form rows of the same expert add up, exactly (int64) past 2^53.
  EXPECT_EQ(parse_tokens("layer,expert,tokens\n0,0,9007199254740992\n0,0,1\n", "t"), (TokenMatrix{{9007199254740993}}));
}

TEST(PecTokens, FitPadsExpertsAndRefusesWhatTheModelLacks) {
  EXPECT_EQ(fit_tokens({{1, 2}, {3}}, {2, 4}, "t"), (TokenMatrix{{1, 2}, {3, 0, 0, 0}}));
  EXPECT_EQ(fit_tokens({{}}, {0}, "t"), (TokenMatrix{{}}));  // a layer without experts needs no counts
  EXPECT_EQ(error_of([] {
              fit_tokens({{1}, {2}, {3}}, {1, 1}, "t.json");
            }),
            "t.json: token counts for 3 MoE layers, the checkpoint has 2");
  EXPECT_EQ(error_of([] {
              fit_tokens({{1, 2, 3}}, {2}, "t.json");
            }),
            "t.json: MoE layer 0 has counts for 3 experts, the checkpoint has 2");
  EXPECT_EQ(error_of([] { fit_tokens({{1}, {}}, {1, 2}, "t.json"); }), "t.json: no token counts for MoE layer 1");
}

TEST(PecTokens, ZeroAndAdd) {
  EXPECT_EQ(zero_tokens({2, 0, 3}), (TokenMatrix{{0, 0}, {}, {0, 0, 0}}));
  EXPECT_EQ(zero_tokens({}), TokenMatrix{});
  EXPECT_EQ(add_tokens({{1, 2}, {3}}, {{10, 20}, {30}}), (TokenMatrix{{11, 22}, {33}}));
  // Shapes differ: the sum has the larger one, missing entries count 0.
  EXPECT_EQ(add_tokens({{1}}, {{0, 5}, {7}}), (TokenMatrix{{1, 5}, {7}}));
  EXPECT_EQ(add_tokens({{1, 2}, {3}}, {}), (TokenMatrix{{1, 2}, {3}}));
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(error_of([&] { add_tokens({{big}}, {{1}}); }), "token counts: token counts add up beyond the int64 range");
}

TEST(PecTokens, JsonFormRoundTripsAndNullIsUnknown) {
  const TokenMatrix t = {{1, 2, 3}, {4}};
  EXPECT_EQ(tokens_to_json(t), nlohmann::json::parse("[[1, 2, 3], [4]]"));
  EXPECT_EQ(tokens_from_json(tokens_to_json(t), "m.json"), t);  // a store's matrix may be ragged
  EXPECT_EQ(tokens_from_json(nullptr, "m.json"), TokenMatrix{});
  EXPECT_EQ(tokens_from_json(nlohmann::json::parse(R"({"tokens": [[5]]})"), "m.json"), (TokenMatrix{{5}}));
  EXPECT_EQ(error_of([] { tokens_from_json(nlohmann::json::parse("[[1.5]]"), "m.json"); }),
            "m.json: token count 1.5 is not a whole number");
  EXPECT_EQ(error_of([] { tokens_from_json(nlohmann::json::parse("3"), "m.json"); }),
            "m.json: expected a JSON matrix [moe_layer][global_expert]");
}

}  // namespace tokens_test
