// A Hugging Face folder's damage (formats/hf/folder.h): files assembled by hand (damage cases only; the
// well-formed folders of the tests are transformers' own, tests/frameworks/hf_models.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "formats/detect.h"
#include "formats/hf/folder.h"
#include "io/safetensors_file.h"
#include "support/process.h"

namespace hf_folder_test {

namespace fs = std::filesystem;
using namespace ucpkit;

namespace {

void put(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

SafetensorsTensor f32(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return {"F32", shape, std::string(static_cast<size_t>(n) * 4, '\1')};
}

std::string error_of(const std::string& dir) {
  try {
    formats::hf::Folder f(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HfFolder, ShardsAreCheckedAgainstTheIndex) {
  const fs::path d = ucpkit::testing::scratch_dir("hf_folder_shards");
  put(d / "config.json", R"({"architectures": ["LlamaForCausalLM"]})");
  put(d / "model-00001-of-00002.safetensors", safetensors_bytes({{"a", f32({2})}, {"b", f32({3})}}));
  put(d / "model.safetensors.index.json",
      R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  EXPECT_TRUE(formats::hf::is_hf_folder(d.string()));
  EXPECT_EQ(formats::detect(d.string()).format, "hf");
  // A shard the index names is missing.
  EXPECT_NE(error_of(d.string()).find("model-00002-of-00002.safetensors: missing"), std::string::npos) << error_of(d.string());
  // A tensor in two shards.
  put(d / "model-00002-of-00002.safetensors", safetensors_bytes({{"b", f32({3})}, {"c", f32({1})}}));
  EXPECT_NE(error_of(d.string()).find("tensor b is in two shards"), std::string::npos) << error_of(d.string());
  // Every tensor in its place: read back.
  put(d / "model-00002-of-00002.safetensors", safetensors_bytes({{"c", f32({1})}}));
  const formats::hf::Folder f(d.string());
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.read("b").shape(), std::vector<int64_t>{3});
  // The index names a tensor its shard lacks.
  put(d / "model.safetensors.index.json",
      R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"}})");
  EXPECT_NE(error_of(d.string()).find("tensor d is missing"), std::string::npos) << error_of(d.string());
  // A shard outside the folder.
  put(d / "model.safetensors.index.json", R"({"weight_map": {"a": "../x.safetensors"}})");
  EXPECT_NE(error_of(d.string()).find("not a file in the folder"), std::string::npos) << error_of(d.string());
}

TEST(HfFolder, ConfigAndDtypes) {
  const fs::path d = ucpkit::testing::scratch_dir("hf_folder_config");
  put(d / "model.safetensors", safetensors_bytes({{"a", {"F8_E4M3", {2}, std::string(2, '\0')}}}));
  EXPECT_FALSE(formats::hf::is_hf_folder(d.string()));  // no config.json
  EXPECT_NE(error_of(d.string()).find("config.json: missing"), std::string::npos);
  put(d / "config.json", "{not json");
  EXPECT_NE(error_of(d.string()).find("config.json: not JSON"), std::string::npos);
  put(d / "config.json", "{}");
  EXPECT_NE(error_of(d.string()).find("model.safetensors"), std::string::npos) << error_of(d.string());  // an FP8 dtype
}

}  // namespace hf_folder_test
