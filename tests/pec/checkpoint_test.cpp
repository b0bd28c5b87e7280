// pec/checkpoint.h: open_checkpoint of the `ds` fixture (tests/pec/fixtures.py: native DeepSpeed MoE, DP 4,
// EP 2, 2 MoE layers of 4 experts) with its byte accounting, the segments and blobs pec-save stores
// (checked against the file's bytes cut by hand at the zip records' offsets), add_element_ranges on a
// hand-made tensor, the manifest's JSON forms of ranges and cut lists, and the refusals.
#include "pec/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tensor.h"
#include "io/zip/zip_directory.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace checkpoint_test {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ucpkit::pec;
using ucpkit::testing::error_of;
using ucpkit::testing::file_bytes;

namespace {
const std::string kStep = kFx + "/ds/step100";
const std::string kTag = kStep + "/global_step100";

std::string blob_text(const Blob& b) {
  const auto s = b.bytes();
  return std::string(s.begin(), s.end());
}

std::map<std::string, ucpkit::ZipRecord> records_of(const std::string& path) {
  const std::string b = file_bytes(path);
  return ucpkit::read_zip_directory({reinterpret_cast<const uint8_t*>(b.data()), b.size()}, path);
}

// A copy of the fixture's step folder to damage.
std::string copy_of_step(const std::string& name) {
  const std::string dir = ucpkit::testing::scratch_dir("checkpoint-" + name) + "/global_step100";
  fs::copy(kTag, dir, fs::copy_options::recursive);
  return dir;
}
}  // namespace

TEST(PecCheckpoint, NativeMoeCheckpointThroughItsLatestFile) {
  const SourceCheckpoint c = open_checkpoint(kStep, {});
  EXPECT_EQ(c.layout, SourceLayout::DeepSpeedMoe);
  EXPECT_EQ(c.root, kTag);
  EXPECT_EQ(c.tag, "global_step100");
  EXPECT_NE(c.pointer.find("latest"), std::string::npos) << c.pointer;
  EXPECT_EQ(c.shape.experts_per_layer, (std::vector<int>{4, 4}));
  EXPECT_EQ(c.shape.ep_size, 2);
  EXPECT_EQ(c.non_expert_files,
            (std::vector<std::string>{
                "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
                "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt",
                "expp_rank_0_mp_rank_00_optim_states.pt", "expp_rank_1_mp_rank_00_optim_states.pt",
                "mp_rank_00_model_states.pt"}));
  ASSERT_EQ(c.experts.size(), 8u);
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(kTag)) {
    on_disk += e.file_size();
    EXPECT_EQ(c.file_sizes.at(e.path().filename().string()), e.file_size());
  }
  // Every byte belongs to the non-expert state or to exactly one expert.
  EXPECT_EQ(c.total_bytes(), on_disk);
  uint64_t experts = 0;
  for (const auto& [key, parts] : c.experts) {
    const auto [l, e] = key;
    experts += c.expert_bytes(l, e);
    // Its own file whole, and fragments in the optimizer shards.
    const std::string own = "layer_" + std::to_string(l) + "_expert_" + std::to_string(e) +
                            "_mp_rank_00_model_states.pt";
    size_t whole = 0, ranged = 0;
    for (const auto& p : parts) {
      if (p.ranges.empty()) {
        ++whole;
        EXPECT_EQ(p.path, own);
        EXPECT_EQ(p.bytes, fs::file_size(kTag + "/" + own));
      } else {
        ++ranged;
        uint64_t n = 0;
        for (const auto& r : p.ranges) n += r.length;
        EXPECT_EQ(p.bytes, n);
        EXPECT_TRUE(c.expert_ranges.count(p.path)) << p.path;
      }
    }
    EXPECT_EQ(whole, 1u);
    EXPECT_GT(ranged, 0u);
  }
  EXPECT_EQ(experts, c.expert_bytes_total);
  EXPECT_EQ(c.expert_bytes(0, 4), 0u);  // no such expert
  EXPECT_EQ(c.expert_bytes(5, 0), 0u);
  // stored_bytes: a file without expert ranges whole; a shard less its ranges.
  EXPECT_EQ(c.stored_bytes("mp_rank_00_model_states.pt"), c.file_sizes.at("mp_rank_00_model_states.pt"));
  uint64_t non_expert = 0;
  for (const auto& rel : c.non_expert_files) {
    uint64_t cut = 0;
    if (c.expert_ranges.count(rel))
      for (const auto& r : c.expert_ranges.at(rel)) cut += r.length;
    EXPECT_EQ(c.stored_bytes(rel), c.file_sizes.at(rel) - cut) << rel;
    non_expert += c.stored_bytes(rel);
  }
  EXPECT_EQ(non_expert, c.non_expert_bytes_total);
  EXPECT_THROW((void)c.stored_bytes("no-such-file.pt"), std::out_of_range);
}

TEST(PecCheckpoint, TagFolderGivenDirectlyHasNoPointerFile) {
  const SourceCheckpoint c = open_checkpoint(kTag + "/", {});
  EXPECT_EQ(c.tag, "global_step100");
  EXPECT_EQ(c.pointer, "");
  EXPECT_EQ(c.shape.experts_per_layer, (std::vector<int>{4, 4}));
}

TEST(PecCheckpoint, ExpertRangesLieInsideTheirRecordsAndNeverOverlap) {
  const SourceCheckpoint c = open_checkpoint(kStep, {});
  ASSERT_FALSE(c.expert_ranges.empty());
  for (const auto& [rel, ranges] : c.expert_ranges) {
    const auto records = records_of(kTag + "/" + rel);
    std::set<std::pair<uint64_t, uint64_t>> absolute;
    for (const auto& r : ranges) {
      ASSERT_TRUE(records.count(r.record)) << rel << " " << r.record;
      EXPECT_LE(r.offset + r.length, records.at(r.record).size) << rel << " " << r.record;
      EXPECT_GT(r.length, 0u);
      absolute.emplace(records.at(r.record).data_offset + r.offset, r.length);
    }
    uint64_t end = 0;
    for (const auto& [at, n] : absolute) {
      EXPECT_GE(at, end) << rel;  // disjoint
      end = at + n;
    }
  }
}

TEST(PecCheckpoint, NonExpertBlobsAreTheFilesWithTheExpertRangesCutOut) {
  const SourceCheckpoint c = open_checkpoint(kStep, {});
  // A file without expert ranges: whole, mapped, no cut.
  std::optional<CutList> cut;
  const SourceSegments whole = non_expert_segments(c, "mp_rank_00_model_states.pt", cut);
  EXPECT_FALSE(cut);
  EXPECT_EQ(whole.path, kTag + "/mp_rank_00_model_states.pt");
  const uint64_t size = fs::file_size(whole.path);
  EXPECT_EQ(whole.segments, (std::vector<std::pair<uint64_t, uint64_t>>{{0, size}}));
  EXPECT_EQ(whole.size, size);
  const Blob b = read_non_expert(c, "mp_rank_00_model_states.pt", cut);
  EXPECT_TRUE(b.file);
  EXPECT_TRUE(blob_text(b) == file_bytes(whole.path));

  // A shard: the cut list is its expert ranges at absolute offsets, the blob the rest.
  const std::string rel = c.expert_ranges.begin()->first;
  const std::string path = kTag + "/" + rel;
  const std::string bytes = file_bytes(path);
  const auto records = records_of(path);
  std::set<std::pair<uint64_t, uint64_t>> want_cut;
  for (const auto& r : c.expert_ranges.at(rel)) want_cut.emplace(records.at(r.record).data_offset + r.offset, r.length);
  const SourceSegments s = non_expert_segments(c, rel, cut);
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->file_size, bytes.size());
  // (adjacent ranges may be merged: compare the bytes they cover)
  std::string want_kept, got_kept;
  std::vector<bool> in_cut(bytes.size(), false);
  for (const auto& [at, n] : want_cut)
    for (uint64_t i = at; i < at + n; ++i) in_cut[i] = true;
  for (size_t i = 0; i < bytes.size(); ++i)
    if (!in_cut[i]) want_kept += bytes[i];
  std::vector<bool> got_in_cut(bytes.size(), false);
  for (const auto& [at, n] : cut->cut)
    for (uint64_t i = at; i < at + n; ++i) got_in_cut[i] = true;
  EXPECT_TRUE(in_cut == got_in_cut);
  for (const auto& [at, n] : s.segments) got_kept += bytes.substr(at, n);
  EXPECT_TRUE(got_kept == want_kept);
  EXPECT_EQ(s.size, want_kept.size());
  EXPECT_EQ(s.size, c.stored_bytes(rel));
  const Blob kept = read_non_expert(c, rel, cut);
  EXPECT_FALSE(kept.file);
  EXPECT_TRUE(blob_text(kept) == want_kept);
}

TEST(PecCheckpoint, ExpertPartsReadTheirFileOrTheirRangesInOrder) {
  const SourceCheckpoint c = open_checkpoint(kStep, {});
  for (const auto& p : c.experts.at({1, 3})) {
    const std::string path = kTag + "/" + p.path;
    const std::string bytes = file_bytes(path);
    std::string want;
    if (p.ranges.empty()) {
      want = bytes;
    } else {
      const auto records = records_of(path);
      for (const auto& r : p.ranges) want += bytes.substr(records.at(r.record).data_offset + r.offset, r.length);
    }
    const SourceSegments s = expert_part_segments(c, p);
    EXPECT_EQ(s.path, path);
    EXPECT_EQ(s.size, p.bytes);
    EXPECT_EQ(s.size, want.size());
    EXPECT_TRUE(blob_text(read_expert_part(c, p)) == want) << p.path;
  }
}

TEST(PecCheckpoint, FoldersWithoutExpertsOrWithAMissingOrTruncatedExpertAreRefused) {
  const std::string empty = ucpkit::testing::scratch_dir("checkpoint-empty");
  EXPECT_NE(error_of([&] { open_checkpoint(empty, {}); }).find(empty), std::string::npos);

  // No expert files: a dense checkpoint.
  const std::string dense = copy_of_step("dense");
  for (const auto& e : fs::directory_iterator(dense))
    if (e.path().filename().string().rfind("layer_", 0) == 0) fs::remove(e.path());
  const std::string d = error_of([&] { open_checkpoint(dense, {}); });
  EXPECT_NE(d.find("no expert files"), std::string::npos) << d;
  EXPECT_NE(d.find("not an MoE checkpoint"), std::string::npos) << d;

  // A truncated expert file: refused naming it, before anything is stored.
  const std::string cut = copy_of_step("truncated");
  const std::string victim = cut + "/layer_1_expert_2_mp_rank_00_model_states.pt";
  fs::resize_file(victim, fs::file_size(victim) / 2);
  const std::string t = error_of([&] { open_checkpoint(cut, {}); });
  EXPECT_NE(t.find(victim), std::string::npos) << t;

  // An empty model states file is no torch file.
  const std::string zero = copy_of_step("empty-file");
  std::ofstream(zero + "/layer_0_expert_0_mp_rank_00_model_states.pt", std::ios::trunc);
  const std::string z = error_of([&] { open_checkpoint(zero, {}); });
  EXPECT_NE(z.find("layer_0_expert_0_mp_rank_00_model_states.pt"), std::string::npos) << z;
}

TEST(PecCheckpoint, ElementRangesOfAHandMadeTensor) {
  auto storage = ucpkit::Storage::zeros(ucpkit::DType::Float32, 10);  // 40 bytes
  storage->key = "3";
  const ucpkit::Tensor t(storage, 2, {5}, {1});
  std::map<std::string, ucpkit::ZipRecord> records;
  records["arch/data/3"].data_offset = 100;
  records["arch/data/3"].size = 40;
  std::vector<ByteRange> out;
  add_element_ranges({&t, &t}, records, "arch/", 1, 3, "p.pt", "w", out);
  ASSERT_EQ(out.size(), 2u);  // one per tensor, appended
  EXPECT_EQ(out[0].record, "arch/data/3");
  EXPECT_EQ(out[0].offset, (2u + 1u) * 4u);  // (storage offset + elem) * element size
  EXPECT_EQ(out[0].length, 3u * 4u);
  // Exactly to the end of the record is fine; one element more runs past it.
  add_element_ranges({&t}, records, "arch/", 3, 5, "p.pt", "w", out);
  EXPECT_EQ(out.back().offset + out.back().length, 40u);
  const std::string past = error_of([&] { add_element_ranges({&t}, records, "arch/", 3, 6, "p.pt", "w", out); });
  EXPECT_EQ(past, "p.pt: fragment of w runs past its storage");
  const std::string none = error_of([&] { add_element_ranges({&t}, records, "other/", 0, 1, "p.pt", "w", out); });
  EXPECT_EQ(none, "p.pt: no record for storage 3");
}

TEST(PecCheckpoint, RangesAndCutListsJsonFormsAndMalformedOnes) {
  const std::vector<ByteRange> r = {{"a/data/0", 8, 16}, {"a/data/1", 0, 4}};
  const json j = ranges_to_json(r);
  EXPECT_EQ(j, json::parse(R"([["a/data/0", 8, 16], ["a/data/1", 0, 4]])"));
  const auto back = ranges_from_json(j, "m.json");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].record, "a/data/1");
  EXPECT_EQ(back[0].offset, 8u);
  EXPECT_EQ(back[0].length, 16u);
  EXPECT_EQ(ranges_to_json({}), json::array());
  for (const char* bad : {R"({"a": 1})", R"([["a", 1]])", R"([[1, 2, 3]])", R"([["a", "1", 2]])"}) {
    const std::string e = error_of([&] { ranges_from_json(json::parse(bad), "m.json"); });
    EXPECT_EQ(e.rfind("m.json: malformed ranges", 0), 0u) << bad << ": " << e;
  }

  const CutList c{5000, {{40, 64}, {200, 16}}};
  const json cj = cut_to_json(c);
  EXPECT_EQ(cj, json::parse(R"({"file_size": 5000, "cut": [[40, 64], [200, 16]]})"));
  const CutList cb = cut_from_json(cj, "m.json");
  EXPECT_EQ(cb.file_size, 5000u);
  EXPECT_EQ(cb.cut, c.cut);
  for (const char* bad : {R"([1])", R"({"cut": []})", R"({"file_size": 1, "cut": [[1]]})",
                          R"({"file_size": 1, "cut": [[1, "x"]]})", R"({"file_size": 1})"}) {
    const std::string e = error_of([&] { cut_from_json(json::parse(bad), "m.json"); });
    EXPECT_EQ(e.rfind("m.json: malformed cut list", 0), 0u) << bad << ": " << e;
  }
}

// A damaged manifest's negative or fractional offset, length or size is named as malformed (nlohmann's
// get<uint64_t>() took -1 as 18446744073709551615 and 1.5 as 1).
TEST(PecCheckpoint, NegativeOrFractionalOffsetsAndLengthsAreMalformed) {
  for (const char* bad : {R"([["a", -1, 2]])", R"([["a", 1, -2]])", R"([["a", 1.5, 2]])"}) {
    const std::string e = error_of([&] { ranges_from_json(json::parse(bad), "m.json"); });
    EXPECT_EQ(e.rfind("m.json: malformed ranges", 0), 0u) << bad << ": " << e;
  }
  for (const char* bad : {R"({"file_size": -1, "cut": []})", R"({"file_size": 9, "cut": [[-1, 2]]})"}) {
    const std::string e = error_of([&] { cut_from_json(json::parse(bad), "m.json"); });
    EXPECT_EQ(e.rfind("m.json: malformed cut list", 0), 0u) << bad << ": " << e;
  }
}

}  // namespace checkpoint_test
