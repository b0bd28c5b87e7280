// lib/pec/manifest: attribute_stored_once, the rule that makes a save's `stored` statistic the same
// whatever order its parallel jobs ran in, and the typed file entries' JSON forms (no I/O).
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "core/error.h"
#include "pec/manifest.h"

namespace manifest_test {

using namespace ucpkit::pec;

namespace {

FileEntry file(const std::string& path, std::vector<ChunkRef> chunks) {
  FileEntry f;
  f.path = path;
  f.chunks = std::move(chunks);
  return f;
}

std::vector<uint64_t> stored_of(const Manifest& m) {
  std::vector<uint64_t> v;
  for (const auto& f : m.non_expert)
    for (const auto& c : f.chunks) v.push_back(c.stored);
  for (const auto& e : m.experts)
    for (const auto& f : e.files)
      for (const auto& c : f.chunks) v.push_back(c.stored);
  return v;
}

// Object "a" is in a non-expert file and in two experts' files; "b" twice; "old" was in the store.
Manifest manifest_where(uint64_t a1, uint64_t a2, uint64_t a3, uint64_t b1, uint64_t b2) {
  Manifest m;
  m.non_expert.push_back(file("model.pt", {{"a", 100, a1}, {"old", 50, 0}}));
  m.experts.push_back({0, 0, {file("e0.pt", {{"b", 80, b1}, {"a", 100, a2}})}});
  m.experts.push_back({0, 1, {file("e1.pt", {{"a", 100, a3}, {"b", 80, b2}, {"old", 50, 0}})}});
  return m;
}

}  // namespace

// Every way the jobs could have raced (which of the chunks found the object new, or two of them)
// gives the same statistics: each written object once, at its first chunk in manifest order.
TEST(PecManifest, StoredBytesCountOnceAtTheFirstChunkWhateverJobWroteThem) {
  const std::vector<uint64_t> want = {40, 0, 30, 0, 0, 0, 0};
  for (const auto& [a1, a2, a3, b1, b2] : std::vector<std::array<uint64_t, 5>>{
           {40, 0, 0, 30, 0}, {0, 40, 0, 0, 30}, {0, 0, 40, 30, 0}, {40, 40, 0, 30, 30}, {0, 40, 40, 0, 30}}) {
    Manifest m = manifest_where(a1, a2, a3, b1, b2);
    attribute_stored_once(m);
    EXPECT_EQ(stored_of(m), want) << a1 << " " << a2 << " " << a3 << " " << b1 << " " << b2;
  }
}

TEST(PecManifest, ObjectsAlreadyStoredCountNothing) {
  Manifest m = manifest_where(0, 0, 0, 0, 0);
  attribute_stored_once(m);
  EXPECT_EQ(stored_of(m), std::vector<uint64_t>(7, 0));
}

// A shared file's ranges, cut list and range CRCs are types (issue 46) with one JSON form each: an
// entry survives the round trip, and a malformed one is an Error naming the manifest and the file.
TEST(PecManifest, RangesCutAndRangeCrcsRoundTripAndMalformedOnesAreNamed) {
  FileEntry f = file("mp_rank_00_model_states.pt", {{"0123456789abcdef0123456789abcdef", 100, 100}});
  f.size = 100;
  f.digest = "d";
  f.ranges = std::vector<ByteRange>{{"archive/data/3", 8, 64}, {"archive/data/4", 0, 16}};
  f.cut = CutList{5000, {{40, 64}, {200, 16}}};
  f.range_crcs = std::vector<RangeCrc>{{"archive/data/3", 8, 64, 0xdeadbeef}};
  const nlohmann::json j = file_to_json(f);
  EXPECT_EQ(j["ranges"], nlohmann::json::parse(R"([["archive/data/3", 8, 64], ["archive/data/4", 0, 16]])"));
  EXPECT_EQ(j["cut"], nlohmann::json::parse(R"({"file_size": 5000, "cut": [[40, 64], [200, 16]]})"));
  EXPECT_EQ(j["range_crcs"], nlohmann::json::parse(R"([["archive/data/3", 8, 64, 3735928559]])"));
  EXPECT_EQ(file_to_json(file_from_json(j, "m.json")), j);
  for (const auto& [key, bad] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"ranges", nlohmann::json::parse(R"([["archive/data/3", 8]])")},
           {"ranges", nlohmann::json::parse(R"({"a": 1})")},
           {"cut", nlohmann::json::parse(R"({"file_size": 5000, "cut": [[40, "x"]]})")},
           {"cut", nlohmann::json::parse(R"({"cut": []})")},
           {"range_crcs", nlohmann::json::parse(R"([["archive/data/3", 8, 64]])")}}) {
    nlohmann::json damaged = j;
    damaged[key] = bad;
    try {
      (void)file_from_json(damaged, "m.json");
      ADD_FAILURE() << key << " " << bad.dump() << " accepted";
    } catch (const ucpkit::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("m.json: mp_rank_00_model_states.pt"), std::string::npos) << what;
      EXPECT_NE(what.find("malformed"), std::string::npos) << what;
    }
  }
}

}  // namespace manifest_test
