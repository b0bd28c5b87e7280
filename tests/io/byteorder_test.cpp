// The "byteorder" record of torch >= 2.1 files (issue 32, cause 2): a file saved on a big-endian host
// holds byte-swapped storages and byteorder = "big"; torch's loader swaps them back
// (torch/serialization.py `_load`). Before, ucpkit ignored the record and read every value swapped.
// Truth: the same tensors saved by real torch on this (little-endian) host (make_big_endian.py).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"
#include "support/process.h"

namespace byteorder_test {

using ucpkit::load_torch_file;

namespace {

std::string make_files() {
  static const std::string dir = [] {
    const std::string d = ucpkit::testing::scratch_dir("byteorder");
    std::string out;
    const int rc = ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR +
                                                "/tests/io/make_big_endian.py " + ucpkit::testing::quote(d), &out);
    EXPECT_EQ(rc, 0) << out;
    return d;
  }();
  return dir;
}

std::string bytes_of(const ucpkit::pickle::ValuePtr& v) {
  const auto b = v->as_tensor().contiguous_bytes();
  return std::string(b.begin(), b.end());
}

}  // namespace

TEST(ByteOrder, BigEndianStoragesReadAsTorchLoadsThem) {
  const std::string d = make_files();
  const auto little = load_torch_file(d + "/little.pt");
  const auto big = load_torch_file(d + "/big.pt");
  for (const char* k : {"f32", "bf16", "f16", "i64", "i32", "u8", "b"}) {
    SCOPED_TRACE(k);
    ASSERT_TRUE(little.root->get(k) && big.root->get(k));
    EXPECT_EQ(bytes_of(big.root->get(k)), bytes_of(little.root->get(k)));
  }
}

TEST(ByteOrder, AnUnknownByteOrderIsRefusedNamingTheFile) {
  const std::string d = make_files();
  const std::string e = ucpkit::testing::error_of([&] { load_torch_file(d + "/odd.pt"); });
  EXPECT_NE(e.find("odd.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("byte order"), std::string::npos) << e;
}

}  // namespace byteorder_test
