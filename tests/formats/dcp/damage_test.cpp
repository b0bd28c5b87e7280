// formats/dcp: damaged copies of a real torch 2.6 DCP checkpoint (tests/formats/dcp/data/fsdp_w2) are
// refused with one Error line naming the file: an item cut short, an item past the end of its file, a
// chunk set that leaves a gap or overlaps, an unknown class in `.metadata`, a data file named outside
// the folder. (Hand-made damage of a real file; the undamaged file reads, reader_test.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/reader.h"
#include "support/errors.h"
#include "support/process.h"

namespace dcp_damage_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::dcp::check_chunks_cover;
using formats::dcp::Reader;
using ucpkit::testing::error_of;
using ucpkit::testing::slurp;

namespace {

const std::string kSource = ucpkit::testing::kDcpData + "/fsdp_w2";
const std::string kTensor = "tok_embeddings.weight";

std::string copy_of(const std::string& name) {
  const std::string d = ucpkit::testing::scratch_dir("dcp_damage_" + name) + "/ckpt";
  fs::copy(kSource, d, fs::copy_options::recursive);
  return d;
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

void expect_one_line_naming(const std::string& msg, const std::string& file, const std::string& cause) {
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find(cause), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

}  // namespace

TEST(DcpDamage, ItemPastTheEndOfItsFile) {
  const std::string d = copy_of("past_end");
  Reader r(d);
  const auto& item = r.metadata().item_of(kTensor, &r.metadata().find(kTensor)->chunks[0].offsets);
  const std::string file = d + "/" + item.storage.relative_path;
  fs::resize_file(file, item.storage.offset + item.storage.length - 1);
  expect_one_line_naming(error_of([&] { Reader(d).read_tensor(kTensor); }), file, "runs past the end of the file");
}

TEST(DcpDamage, TruncatedItemInsideItsFile) {
  // The item's zip loses its tail (central directory) as an interrupted write leaves it; the bytes
  // after it stay, so the range is in bounds and only the zip itself tells.
  const std::string d = copy_of("truncated");
  Reader r(d);
  const auto& item = r.metadata().item_of(kTensor, &r.metadata().find(kTensor)->chunks[0].offsets);
  const std::string file = d + "/" + item.storage.relative_path;
  std::string bytes = slurp(file);
  const size_t tail = 200;
  ASSERT_GT(item.storage.length, tail);
  std::fill_n(bytes.begin() + static_cast<long>(item.storage.offset + item.storage.length - tail), tail, '\0');
  spit(file, bytes);
  expect_one_line_naming(error_of([&] { Reader(d).read_tensor(kTensor); }), file, "zip");
}

TEST(DcpDamage, ChunksWithAGap) {
  const Reader r(kSource);
  auto e = *r.metadata().find(kTensor);
  e.chunks.pop_back();
  expect_one_line_naming(error_of([&] { check_chunks_cover(e, r.metadata().path); }), r.metadata().path,
                         "leave a gap");
}

TEST(DcpDamage, OverlappingChunks) {
  const Reader r(kSource);
  auto e = *r.metadata().find(kTensor);
  e.chunks[1].offsets[0] -= 1;  // one row read twice, the last row never
  expect_one_line_naming(error_of([&] { check_chunks_cover(e, r.metadata().path); }), r.metadata().path, "overlap");
  auto f = *r.metadata().find(kTensor);
  f.chunks[1].offsets[0] += 1;  // past the end of the tensor
  expect_one_line_naming(error_of([&] { check_chunks_cover(f, r.metadata().path); }), r.metadata().path,
                         "do not fit");
}

TEST(DcpDamage, UnknownClassInMetadata) {
  const std::string d = copy_of("unknown_class");
  std::string md = slurp(d + "/.metadata");
  const std::string from = "TensorStorageMetadata", to = "TensorStorageMetadatX";  // same length: still a valid pickle
  const size_t at = md.find(from);
  ASSERT_NE(at, std::string::npos);
  md.replace(at, from.size(), to);
  spit(d + "/.metadata", md);
  expect_one_line_naming(error_of([&] { Reader r(d); }), d + "/.metadata",
                         "unknown class torch.distributed.checkpoint.metadata.TensorStorageMetadatX");
}

TEST(DcpDamage, DataFileOutsideTheFolder) {
  const std::string d = copy_of("escape");
  std::string md = slurp(d + "/.metadata");
  const std::string from = "__0_0.distcp", to = "../0_0.distc";  // same length
  size_t at = md.find(from);
  ASSERT_NE(at, std::string::npos);
  md.replace(at, from.size(), to);
  spit(d + "/.metadata", md);
  const std::string msg = error_of([&] {
    Reader r(d);
    for (const auto& e : r.metadata().entries) r.read_tensor(e.fqn);
  });
  expect_one_line_naming(msg, d + "/.metadata", "not a relative path inside");
}

TEST(DcpDamage, DtypeWithoutAnEquivalentIsRefusedByName) {
  // Real torch 2.6 save of a float8_e4m3fn tensor (scripts/fixtures/dcp_fixtures.sh): not damage, but refused alike.
  const std::string d = ucpkit::testing::kDcpData + "/float8_w1";
  expect_one_line_naming(error_of([&] { Reader r(d); }), d + "/.metadata", "dtype torch.float8_e4m3fn is not supported");
}

}  // namespace dcp_damage_test
