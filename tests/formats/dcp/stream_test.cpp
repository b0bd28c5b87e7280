// formats/dcp Reader::stream_tensor (what ucp-union --input <DCP folder> writes through): every tensor of
// every committed real DCP checkpoint streamed in small windows of odd sizes, so that windows end inside
// rows, inside chunks and inside the runs of column and 2-D shards, equals the full tensor the saving
// script recorded (<variant>.truth/tensors.safetensors, torch's own gather; scripts/fixtures/dcp_fixtures.sh).
// Windows asked for out of order are refused; a flipped bit inside a chunk is caught by the chunk's
// record CRC-32 while it is streamed, naming the data file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "formats/dcp/dcp_data.h"
#include "formats/dcp/reader.h"
#include "io/safetensors_file.h"
#include "support/process.h"

namespace dcp_stream_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::dcp::Reader;
using ucpkit::testing::slurp;

namespace {

const std::string& kData = ucpkit::testing::kDcpData;

// The bytes of `t` asked for in windows of `window_elems` elements (the last one shorter).
std::vector<uint8_t> streamed(const Tensor& t, uint64_t window_elems) {
  std::vector<uint8_t> out(t.nbytes());
  const uint64_t w = window_elems * dtype_size(t.dtype());
  for (uint64_t at = 0; at < out.size(); at += w)
    t.storage()->generate(at, std::span<uint8_t>(out.data() + at, std::min<uint64_t>(w, out.size() - at)));
  return out;
}

void expect_streams_truth(const std::string& variant) {
  const std::string p = kData + "/" + variant + ".truth/tensors.safetensors";
  const auto truth = parse_safetensors(slurp(p), p);
  ASSERT_FALSE(truth.empty()) << variant;
  for (const auto& [name, want] : truth)
    for (uint64_t window : {1ull, 3ull, 7ull, 1000ull}) {
      SCOPED_TRACE(variant + " " + name + " window " + std::to_string(window));
      const Reader r(kData + "/" + variant);  // a fresh reader: every stream starts from the file
      const Tensor t = r.stream_tensor(name);
      EXPECT_EQ(dtype_safetensors_name(t.dtype()), want.dtype);
      EXPECT_EQ(t.shape(), want.shape);
      const auto b = streamed(t, window);
      ASSERT_EQ(b.size(), want.bytes.size());
      EXPECT_EQ(0, std::memcmp(b.data(), want.bytes.data(), b.size())) << "values differ";
    }
}

}  // namespace

TEST(DcpStream, EveryFixtureInOddWindowsEqualsTheTruth) {
  // rows (fsdp_w2), a 2-D mesh (twod_w4: column runs), FSDP2 x TP (_StridedShard), Adam state, plain
  // whole tensors, one item, torch 1.13 (bfloat16 column shards).
  for (const char* v : {"fsdp_w2", "twod_w4", "fsdp_tp_optim_w4", "fsdp_optim_w2", "plain_w2", "single_item_w1", "torch113_w2"})
    expect_streams_truth(v);
}

TEST(DcpStream, WindowsOutOfOrderAreRefused) {
  const Reader r(kData + "/fsdp_w2");
  const Tensor t = r.stream_tensor("tok_embeddings.weight");
  std::vector<uint8_t> w(16);
  t.storage()->generate(0, w);
  EXPECT_THROW(t.storage()->generate(0, w), Error);  // asked for twice
  const Tensor u = r.stream_tensor("tok_embeddings.weight");
  EXPECT_THROW(u.storage()->generate(16, w), Error);  // skips bytes
}

TEST(DcpStream, FlippedBitInsideAChunkIsCaughtWhileStreaming) {
  const std::string d = ucpkit::testing::scratch_dir("dcp_stream_flip") + "/ckpt";
  // Flip one bit inside the largest tensor's first chunk: the bytes of the item's storage lie in the
  // map where stream_tensor copies them from.
  const std::string file = ucpkit::testing::flip_first_chunk(kData + "/fsdp_w2", "tok_embeddings.weight", d);
  const Reader r(d);
  const Tensor t = r.stream_tensor("tok_embeddings.weight");  // decoding checks headers, not the data yet
  ucpkit::testing::expect_crc_error([&] { (void)streamed(t, 1u << 20); }, file);
}

}  // namespace dcp_stream_test
