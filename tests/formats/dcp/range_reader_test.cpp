// formats/dcp RangeReader (what ucp-load's torch_dist one pass reads through): every tensor of the
// committed real DCP checkpoints read as element ranges of odd sizes asked in a shuffled order, so that
// ranges end inside rows, inside chunks and inside the runs of column and 2-D shards, from items read in
// place (pread), zstd-transformed items and the safetensors flavour (decoded into memory), equals the
// full tensor the saving script recorded (<variant>.truth/tensors.safetensors, torch's own gather;
// scripts/fixtures/dcp_fixtures.sh). A flipped bit inside a chunk is caught by the chunk's record CRC-32 at
// finish(), whether its bytes were asked for or not, naming the data file; a sub-tensor at a leading
// index is that slice of the truth, and chunks spanning several leading indices are left to read_tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "formats/dcp/dcp_data.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/range_reader.h"
#include "formats/dcp/reader.h"
#include "io/safetensors_file.h"
#include "support/process.h"

namespace dcp_range_reader_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::dcp::RangeReader;
using formats::dcp::Reader;
using ucpkit::testing::slurp;

namespace {

const std::string& kData = ucpkit::testing::kDcpData;

// The tensor's bytes read as ranges of at most `most` elements (sizes drawn at random), asked for in
// a shuffled order.
std::vector<uint8_t> ranged(RangeReader& r, int64_t most, uint32_t seed) {
  const size_t es = dtype_size(r.dtype());
  std::vector<uint8_t> out(static_cast<size_t>(r.numel()) * es, 0xA5);
  std::mt19937 rng(seed);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t at = 0; at < r.numel();) {
    const int64_t n = std::min<int64_t>(r.numel() - at, std::uniform_int_distribution<int64_t>(1, most)(rng));
    ranges.push_back({at, n});
    at += n;
  }
  std::shuffle(ranges.begin(), ranges.end(), rng);
  for (const auto& [a, n] : ranges) r.copy(a, n, out.data() + static_cast<size_t>(a) * es);
  return out;
}

void expect_ranges_read_truth(const std::string& variant) {
  const std::string p = kData + "/" + variant + ".truth/tensors.safetensors";
  const auto truth = parse_safetensors(slurp(p), p);
  ASSERT_FALSE(truth.empty()) << variant;
  const std::string dir = kData + "/" + variant;
  const auto folder = formats::dcp::find_folder(dir);  // the safetensors flavour has no .metadata
  const Reader reader(dir, formats::dcp::read_folder_metadata(folder));
  for (const auto& [name, want] : truth)
    for (int64_t most : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 30}) {
      SCOPED_TRACE(variant + " " + name + " ranges of at most " + std::to_string(most));
      auto r = RangeReader::open(reader, name);
      ASSERT_TRUE(r);
      EXPECT_EQ(dtype_safetensors_name(r->dtype()), want.dtype);
      EXPECT_EQ(r->shape(), want.shape);
      const auto b = ranged(*r, most, static_cast<uint32_t>(most));
      ASSERT_EQ(b.size(), want.bytes.size());
      EXPECT_EQ(0, std::memcmp(b.data(), want.bytes.data(), b.size())) << "values differ";
      EXPECT_NO_THROW(r->finish());
    }
}

}  // namespace

TEST(DcpRangeReader, EveryFixtureInShuffledOddRangesEqualsTheTruth) {
  // rows (fsdp_w2), a 2-D mesh (twod_w4: column runs), FSDP2 x TP (_StridedShard), Adam state, plain
  // whole tensors, one item, torch 1.13 (bfloat16 column shards), zstd items and the safetensors
  // flavour (torch 2.14.1's save code: chunks decoded into memory).
  for (const char* v : {"fsdp_w2", "twod_w4", "fsdp_tp_optim_w4", "fsdp_optim_w2", "plain_w2", "single_item_w1",
                        "torch113_w2", "t214_zstd_w2", "t214_hf_w2"})
    expect_ranges_read_truth(v);
}

TEST(DcpRangeReader, SubTensorAtALeadingIndexIsThatSliceOfTheTruth) {
  // The first and last row of every tensor of 2+ dims: where every chunk holding the row holds only it
  // (a [2, n] tensor row-sharded over 2 ranks, a torch 1.13 column shard of one row...), the reader is
  // that row of the truth; where a chunk holds several rows (row blocks, 2-D mesh blocks) it is null.
  int checked = 0, left = 0;
  for (const char* variant : {"fsdp_w2", "twod_w4", "fsdp_tp_optim_w4", "fsdp_optim_w2", "plain_w2", "torch113_w2"}) {
    const Reader reader(kData + "/" + variant);
    const std::string p = kData + "/" + variant + ".truth/tensors.safetensors";
    for (const auto& [name, want] : parse_safetensors(slurp(p), p)) {
      if (want.shape.size() < 2) continue;
      const auto* e = reader.metadata().find(name);
      ASSERT_NE(e, nullptr);
      for (int64_t row : {int64_t{0}, want.shape[0] - 1}) {
        SCOPED_TRACE(std::string(variant) + " " + name + " row " + std::to_string(row));
        auto r = RangeReader::open(reader, name, {row});
        bool single = true;  // every chunk holding `row` holds only that row
        for (const auto& c : e->chunks)
          if (c.offsets[0] <= row && row < c.offsets[0] + c.sizes[0]) single = single && c.sizes[0] == 1;
        EXPECT_EQ(static_cast<bool>(r), single);
        if (!r) {
          ++left;
          continue;
        }
        const size_t row_bytes = want.bytes.size() / static_cast<size_t>(want.shape[0]);
        const auto b = ranged(*r, 5, 1);
        ASSERT_EQ(b.size(), row_bytes);
        EXPECT_EQ(0, std::memcmp(b.data(), want.bytes.data() + static_cast<size_t>(row) * row_bytes, row_bytes));
        EXPECT_NO_THROW(r->finish());
        ++checked;
      }
    }
  }
  EXPECT_GT(left, 0);
  EXPECT_GT(checked, 0);
}

TEST(DcpRangeReader, FlippedBitIsCaughtAtFinishWhetherAskedForOrNot) {
  const std::string root = ucpkit::testing::scratch_dir("dcp_range_flip");
  {  // every range asked for
    const std::string file = ucpkit::testing::flip_first_chunk(kData + "/fsdp_w2", "tok_embeddings.weight", root + "/asked");
    const Reader r(root + "/asked");
    auto rr = RangeReader::open(r, "tok_embeddings.weight");
    ASSERT_TRUE(rr);
    (void)ranged(*rr, 333, 7);
    ucpkit::testing::expect_crc_error([&] { rr->finish(); }, file);
  }
  {  // only the last element asked for: finish() reads the rest for the check
    const std::string file = ucpkit::testing::flip_first_chunk(kData + "/fsdp_w2", "tok_embeddings.weight", root + "/unasked");
    const Reader r(root + "/unasked");
    auto rr = RangeReader::open(r, "tok_embeddings.weight");
    ASSERT_TRUE(rr);
    std::vector<uint8_t> last(dtype_size(rr->dtype()));
    rr->copy(rr->numel() - 1, 1, last.data());
    ucpkit::testing::expect_crc_error([&] { rr->finish(); }, file);
  }
  {  // the clean checkpoint passes with only part of it asked for
    const Reader r(kData + "/fsdp_w2");
    auto rr = RangeReader::open(r, "tok_embeddings.weight");
    ASSERT_TRUE(rr);
    std::vector<uint8_t> some(dtype_size(rr->dtype()) * 10);
    rr->copy(rr->numel() / 2, 10, some.data());
    EXPECT_NO_THROW(rr->finish());
  }
}

// check_now() checks every chunk where it lies in the mapped data file, before any copy; afterwards copies (a range
// twice included, which finish() alone refuses) need no check. trust() forgets the CRC-32s unchecked.
TEST(DcpRangeReader, CheckNowCatchesAFlippedBitBeforeAnyCopyAndLeavesNothingForFinish) {
  const std::string root = ucpkit::testing::scratch_dir("dcp_range_check_now");
  const std::string file = ucpkit::testing::flip_first_chunk(kData + "/fsdp_w2", "tok_embeddings.weight", root + "/flipped");
  {
    const Reader r(root + "/flipped");
    auto rr = RangeReader::open(r, "tok_embeddings.weight");
    ASSERT_TRUE(rr);
    ucpkit::testing::expect_crc_error([&] { rr->check_now(); }, file);
  }
  {
    const Reader r(root + "/flipped");
    auto rr = RangeReader::open(r, "tok_embeddings.weight");
    ASSERT_TRUE(rr);
    rr->trust();  // another reader checked these items: nothing is summed
    (void)ranged(*rr, 333, 7);
    EXPECT_NO_THROW(rr->finish());
  }
  const Reader r(kData + "/fsdp_w2");
  auto rr = RangeReader::open(r, "tok_embeddings.weight");
  ASSERT_TRUE(rr);
  EXPECT_NO_THROW(rr->check_now());
  const auto once = ranged(*rr, 333, 7), twice = ranged(*rr, 128, 3);
  EXPECT_EQ(once, twice);
  EXPECT_NO_THROW(rr->finish());
}

TEST(DcpRangeReader, RangesOutsideTheTensorAreRefused) {
  const Reader r(kData + "/fsdp_w2");
  auto rr = RangeReader::open(r, "tok_embeddings.weight");
  ASSERT_TRUE(rr);
  std::vector<uint8_t> b(dtype_size(rr->dtype()) * 2);
  EXPECT_THROW(rr->copy(rr->numel() - 1, 2, b.data()), Error);
  EXPECT_THROW(rr->copy(-1, 1, b.data()), Error);
  EXPECT_THROW(RangeReader::open(r, "no.such.tensor"), Error);
}

}  // namespace dcp_range_reader_test
