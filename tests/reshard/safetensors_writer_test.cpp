// lib/reshard/safetensors_writer: the shard assignment without I/O (greedy in model order under the
// byte bound, a tensor larger than the bound alone in its shard), and the shards written for a real
// universal checkpoint read back by an independent Python reader (tests/reshard/read_safetensors.py)
// against dsgen's ground truth.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "reshard/model_info.h"
#include "reshard/safetensors_writer.h"
#include "reshard/universal_reader.h"
#include "reshard/universal_fixture.h"
#include "support/process.h"
#include "support/files.h"

namespace safetensors_writer_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

using ucpkit::testing::file_bytes;

namespace {

ModelInfo model_of(const std::vector<std::vector<int64_t>>& shapes) {
  ModelInfo m;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ParamInfo p;
    p.name = "p" + std::to_string(i);
    p.shape = shapes[i];
    m.params.push_back(p);
  }
  return m;
}

uint64_t bytes_of(const std::vector<int64_t>& shape, uint64_t element) {
  uint64_t n = element;
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// The defining properties of the greedy assignment, checked on any result: the shards list every
// parameter once, in model order; a shard over the bound holds one tensor with bytes; and a shard ends only
// when it holds bytes and the next tensor would take it over the bound.
void expect_greedy(const ModelInfo& m, uint64_t element, uint64_t bound, const std::vector<std::vector<int>>& shards) {
  std::vector<int> order;
  for (const auto& s : shards) {
    ASSERT_FALSE(s.empty());
    order.insert(order.end(), s.begin(), s.end());
  }
  std::vector<int> all(m.params.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  ASSERT_EQ(order, all);
  for (size_t k = 0; k < shards.size(); ++k) {
    uint64_t used = 0;
    size_t holding = 0;  // tensors with bytes (an empty one may join the shard before a large tensor)
    for (int i : shards[k]) {
      used += bytes_of(m.params[i].shape, element);
      holding += bytes_of(m.params[i].shape, element) > 0;
    }
    if (used > bound) EXPECT_EQ(holding, 1u) << "shard " << k << " over the bound with several tensors";
    if (k + 1 < shards.size()) {
      const uint64_t next = bytes_of(m.params[shards[k + 1][0]].shape, element);
      EXPECT_GT(used, 0u) << "shard " << k;
      EXPECT_GT(used + next, bound) << "shard " << k << " ended although tensor " << shards[k + 1][0] << " fitted";
    }
  }
}

}  // namespace

TEST(SafetensorsShards, WorkedExamples) {
  // bf16 (2 bytes): sizes 6, 6, 6 bytes under 12 -> {0, 1}, {2}.
  EXPECT_EQ(safetensors_shards(model_of({{3}, {3}, {3}}), DType::BFloat16, 12),
            (std::vector<std::vector<int>>{{0, 1}, {2}}));
  // fp32: 8, 40, 8 bytes under 16: the 40-byte tensor alone, its neighbours in shards of their own.
  EXPECT_EQ(safetensors_shards(model_of({{2}, {2, 5}, {2}}), DType::Float32, 16),
            (std::vector<std::vector<int>>{{0}, {1}, {2}}));
  // A tensor larger than the bound first: alone; then 4 + 4 + 8 = 16 fills the next exactly.
  EXPECT_EQ(safetensors_shards(model_of({{100}, {1}, {1}, {2}, {1}}), DType::Float32, 16),
            (std::vector<std::vector<int>>{{0}, {1, 2, 3}, {4}}));
  // Everything fits: one shard; empty tensors (0 bytes) never open a shard.
  EXPECT_EQ(safetensors_shards(model_of({{0}, {4, 4}, {0, 3}, {}}), DType::Float16, 1000),
            (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  EXPECT_EQ(safetensors_shards(model_of({{0}, {0}}), DType::Float16, 0), (std::vector<std::vector<int>>{{0, 1}}));
  EXPECT_TRUE(safetensors_shards(model_of({}), DType::Float32, 16).empty());
}

TEST(SafetensorsShards, GreedyOnRandomModels) {
  std::mt19937 rng(21);
  for (int round = 0; round < 300; ++round) {
    std::vector<std::vector<int64_t>> shapes(1 + rng() % 40);
    for (auto& s : shapes) {
      s.resize(rng() % 3);
      for (auto& d : s) d = static_cast<int64_t>(rng() % (round % 7 == 0 ? 3 : 50));
    }
    const ModelInfo m = model_of(shapes);
    const DType dt = round % 2 ? DType::Float32 : DType::BFloat16;
    const uint64_t bound = 1 + rng() % 400;
    SCOPED_TRACE("round " + std::to_string(round));
    expect_greedy(m, dt == DType::Float32 ? 4 : 2, bound, safetensors_shards(m, dt, bound));
  }
}

namespace {

// Writes the export of the GPT fixture's universal checkpoint and checks it: the byte count returned,
// the file names and count, 8-byte aligned tensor data, and every tensor equal to dsgen's ground truth
// converted by torch (tests/reshard/read_safetensors.py).
void export_and_read_back(DType dtype, const char* dtype_arg, uint64_t shard_bytes, bool expect_single) {
  const auto& c = loadtest::gpt_case();
  const ModelInfo model = read_model_info(c.universal.string());
  UniversalReader reader(model, c.universal.string(), true);
  const fs::path dir = fs::path(ucpkit::testing::scratch_dir(std::string("safetensors_") + dtype_arg)) / "out";
  fs::create_directories(dir);
  const uint64_t n = write_safetensors(model, reader, dtype, shard_bytes, dir.string(), 2);

  const auto shards = safetensors_shards(model, dtype, shard_bytes);
  ASSERT_EQ(shards.size() == 1, expect_single) << shards.size() << " shards";
  std::set<std::string> want = {"model.safetensors.index.json"};
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    want.insert(expect_single ? std::string("model.safetensors") : std::string(name));
  }
  std::set<std::string> got;
  uint64_t sizes = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    got.insert(e.path().filename().string());
    sizes += fs::file_size(e.path());
    if (e.path().extension() == ".safetensors") {
      const std::string raw = file_bytes(e.path());
      ASSERT_GE(raw.size(), 8u);
      uint64_t h = 0;
      for (int b = 0; b < 8; ++b) h |= static_cast<uint64_t>(static_cast<uint8_t>(raw[b])) << (8 * b);
      EXPECT_EQ((8 + h) % 8, 0u) << e.path() << ": tensor data not 8-byte aligned";
    }
  }
  EXPECT_EQ(got, want);  // no temporary file left either
  EXPECT_EQ(n, sizes);
  const auto index = nlohmann::json::parse(file_bytes(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), model.params.size());

  std::string out;
  EXPECT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR +
                                     "/tests/reshard/read_safetensors.py " + ucpkit::testing::quote(dir.string()) + " " +
                                     ucpkit::testing::quote((c.truth / "universal").string()) + " " + dtype_arg,
                                 &out),
            0)
      << out;
}

}  // namespace

TEST(WriteSafetensors, ShardedBf16EqualsGroundTruth) {
  export_and_read_back(DType::BFloat16, "bf16", 20000, false);
}

TEST(WriteSafetensors, SingleFileFp32EqualsGroundTruth) {
  export_and_read_back(DType::Float32, "fp32", uint64_t{1} << 40, true);
}

TEST(WriteSafetensors, Fp16EachTensorOverTheBound) {
  // A bound of one byte: every tensor alone in its shard.
  const auto& c = loadtest::gpt_case();
  const ModelInfo model = read_model_info(c.universal.string());
  EXPECT_EQ(safetensors_shards(model, DType::Float16, 1).size(), model.params.size());
  export_and_read_back(DType::Float16, "fp16", 1, false);
}

// Buffers (issue 47) come after the parameters, each at its own dtype's size whatever the parameters'
// dtype: an int64 counter is 8 bytes an element under --dtype bf16, a bool mask 1.
TEST(SafetensorsShards, BuffersFollowTheParametersInTheirOwnDtype) {
  ModelInfo m = model_of({{4, 4}, {4}});
  m.buffers.push_back({"norm.num_batches_tracked", {}, "int64", {"zero/n/fp32.pt", 0u}});
  m.buffers.push_back({"mask", {16}, "bool", {"zero/mask/fp32.pt", 0u}});
  EXPECT_EQ(safetensors_shards(m, DType::BFloat16, uint64_t{1} << 40), (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  EXPECT_EQ(safetensors_name(m, 2), "norm.num_batches_tracked");
  EXPECT_EQ(safetensors_dtype(m, 2, DType::BFloat16), DType::Int64);
  EXPECT_EQ(safetensors_dtype(m, 1, DType::BFloat16), DType::BFloat16);
  EXPECT_EQ(safetensors_bytes(m, 0, DType::BFloat16), 32u);
  EXPECT_EQ(safetensors_bytes(m, 2, DType::BFloat16), 8u);
  EXPECT_EQ(safetensors_bytes(m, 3, DType::BFloat16), 16u);
  // A bound of 40 bytes: [p0 32 B, p1 8 B], [counter 8 B, mask 16 B]; of 47: the counter's 8 B no longer fit.
  EXPECT_EQ(safetensors_shards(m, DType::BFloat16, 40), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(safetensors_shards(m, DType::BFloat16, 47), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(safetensors_shards(m, DType::BFloat16, 48), (std::vector<std::vector<int>>{{0, 1, 2}, {3}}));
}

}  // namespace safetensors_writer_test
