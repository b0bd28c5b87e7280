// io/torch append_torch_file (a torch.save zip written into a larger file at its current offset, as
// the DCP writer writes each tensor item once) and its reading side, MappedFile::slice +
// load_torch_mapped (the zip read in place, nothing copied). The bytes appended are those
// save_torch_file writes for the same value (whose torch.load compatibility tests/io's real-torch
// tests check), at any offset, between other bytes; read back in place they give the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "io/torch/torch_file.h"
#include "support/process.h"

namespace append_torch_file_test {

using namespace ucpkit;
using pickle::Value;

namespace {

std::string slurp_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

Tensor sample(int64_t rows) {
  std::vector<float> v(static_cast<size_t>(rows) * 3);
  for (size_t k = 0; k < v.size(); ++k) v[k] = 0.5f * static_cast<float>(k) - 7.0f;
  return Tensor::from_vector(DType::Float32, {rows, 3}, v);
}

}  // namespace

TEST(AppendTorchFile, SameBytesAsSaveTorchFileAtAnyOffsetAndReadInPlace) {
  const std::string dir = ucpkit::testing::scratch_dir("append_torch_file");
  const Tensor a = sample(5), b = sample(1000);
  save_torch_file(dir + "/a.pt", Value::of_tensor(a));
  save_torch_file(dir + "/b.pt", Value::of_tensor(b));
  const std::string want_a = slurp_file(dir + "/a.pt"), want_b = slurp_file(dir + "/b.pt");
  const std::string head = "13 odd bytes.";  // an offset no alignment hides
  {
    AtomicFile f(dir + "/items.bin");
    f.write(head.data(), head.size());
    EXPECT_EQ(append_torch_file(f, Value::of_tensor(a)), want_a.size());
    EXPECT_EQ(append_torch_file(f, Value::of_tensor(b)), want_b.size());
    f.write("tail", 4);
    f.commit();
  }
  const std::string got = slurp_file(dir + "/items.bin");
  ASSERT_EQ(got.size(), head.size() + want_a.size() + want_b.size() + 4);
  EXPECT_EQ(got.substr(head.size(), want_a.size()), want_a);
  EXPECT_EQ(got.substr(head.size() + want_a.size(), want_b.size()), want_b);

  const auto file = MappedFile::open(dir + "/items.bin");
  const auto item = MappedFile::slice(file, head.size() + want_a.size(), want_b.size(), "items.bin (item b)");
  const TorchFile tf = load_torch_mapped(item);
  ASSERT_TRUE(tf.root && tf.root->kind == pickle::Kind::Tensor);
  const Tensor t = tf.root->as_tensor();
  EXPECT_TRUE(t.storage()->is_mapped());  // a view of the map, not a copy
  EXPECT_GE(t.storage()->bytes().data(), item->data());
  EXPECT_LE(t.storage()->bytes().data() + t.nbytes(), item->data() + item->size());
  EXPECT_TRUE(t.equal(b));
  EXPECT_THROW(MappedFile::slice(file, got.size() - 2, 3, "past the end"), Error);
}

}  // namespace append_torch_file_test
