// formats/megatron_core: damaged copies of a real Megatron-Core torch_dist checkpoint
// (tests/formats/megatron_core/data/gpt_tp2_pp2/fully_reshardable) are refused with one Error line
// naming the file: metadata.json without sharded_backend, another backend, no metadata.json, a
// tracker naming a missing iteration, keys the model does not know (a model root, a ShardedObject,
// an optimizer state; renamed in place in `.metadata`, same length, so the pickle stays valid), a
// dp_reshardable per_bucket_numel{,_unpadded} that disagrees with the buckets (ucp-union, exit 1).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>

#include "core/crc32.h"
#include "formats/dcp/dcp_data.h"
#include "formats/megatron_core/dp_bucket_layout.h"
#include "formats/megatron_core/mcore_data.h"
#include "formats/megatron_core/reader.h"
#include "io/zip/zip_records.h"
#include "support/errors.h"
#include "support/process.h"

namespace megatron_core_damage_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::megatron_core::buffer_numels;
using formats::megatron_core::Checkpoint;
using ucpkit::testing::error_of;
using ucpkit::testing::slurp;

namespace {

const std::string kSource = ucpkit::testing::kMcoreData + "/gpt_tp2_pp2/fully_reshardable";
const std::string kDpSource = ucpkit::testing::kMcoreData + "/gpt_tp2_pp2/dp_reshardable";
const std::string kLlamaDp = ucpkit::testing::kMcoreData + "/llama_gqa_tp2_dp2_v016/dp_reshardable";

std::string copy_of(const std::string& name, const std::string& source = kSource) {
  const std::string d = ucpkit::testing::scratch_dir("mcore_damage_" + name) + "/iter_0000002";
  fs::copy(source, d, fs::copy_options::recursive);
  return d;
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Renames every occurrence of `from` in `.metadata` to `to` (same length).
void rename_in_metadata(const std::string& dir, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string md = slurp(dir + "/.metadata");
  size_t n = 0;
  for (size_t at = md.find(from); at != std::string::npos; at = md.find(from, at + to.size()), ++n)
    md.replace(at, from.size(), to);
  ASSERT_GT(n, 0u) << from;
  spit(dir + "/.metadata", md);
}

void expect_one_line_naming(const std::string& msg, const std::string& file, const std::string& cause) {
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find(cause), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

}  // namespace

TEST(McoreDamage, UndamagedCopyReads) {
  const std::string d = copy_of("none");
  EXPECT_EQ(Checkpoint(d).params().size(), 23u);
  const std::string root = fs::path(d).parent_path().string();
  expect_one_line_naming(error_of([&] { Checkpoint{root}; }), root,
                         "no metadata.json and no latest_checkpointed_iteration.txt");
}

TEST(McoreDamage, MetadataJsonWithoutShardedBackend) {
  const std::string d = copy_of("no_backend");
  spit(d + "/metadata.json", R"({"sharded_backend_version": 1})");
  expect_one_line_naming(error_of([&] { Checkpoint{d}; }), d + "/metadata.json", "missing field sharded_backend");
}

TEST(McoreDamage, OtherShardedBackend) {
  const std::string d = copy_of("zarr");
  spit(d + "/metadata.json", R"({"sharded_backend": "zarr", "sharded_backend_version": 1})");
  expect_one_line_naming(error_of([&] { Checkpoint{d}; }), d + "/metadata.json", "is not read (only torch_dist)");
}

TEST(McoreDamage, NoMetadataJson) {
  const std::string d = copy_of("no_config");
  fs::remove(d + "/metadata.json");
  expect_one_line_naming(error_of([&] { Checkpoint{d}; }), d, "no metadata.json");
}

TEST(McoreDamage, TrackerNamesMissingIteration) {
  const std::string d = copy_of("tracker");
  const std::string root = fs::path(d).parent_path().string();
  spit(root + "/latest_checkpointed_iteration.txt", "7\n");
  expect_one_line_naming(error_of([&] { Checkpoint{root}; }), root + "/latest_checkpointed_iteration.txt",
                         "names iter_0000007, which holds no metadata.json");
  spit(root + "/latest_checkpointed_iteration.txt", "2\n");
  EXPECT_EQ(Checkpoint(root).dir(), root + "/iter_0000002");
}

TEST(McoreDamage, UnknownModelRoot) {
  const std::string d = copy_of("unknown_root");
  rename_in_metadata(d, "embedding.word_embeddings", "embeddinX.word_embeddings");
  expect_one_line_naming(error_of([&] { Checkpoint{d}; }), d + "/.metadata", "unknown key embeddinX.word_embeddings.weight");
}

TEST(McoreDamage, UnknownShardedObject) {
  const std::string d = copy_of("unknown_object");
  rename_in_metadata(d, "linear_proj._extra_state", "linear_proj._extra_stXte");
  expect_one_line_naming(error_of([&] { Checkpoint{d}; }), d + "/.metadata", "a ShardedObject the model does not know");
}

TEST(McoreDamage, UnknownOptimizerState) {
  const std::string d = copy_of("unknown_state");
  rename_in_metadata(d, "optimizer.state.exp_avg_sq.", "optimizer.state.exp_avg_sX.");
  expect_one_line_naming(error_of([&] { Checkpoint{d}; }), d + "/.metadata",
                         "optimizer state other than param, exp_avg, exp_avg_sq");
}

// The dp_reshardable bucket `g`, `state` renamed (same length) to a fully_reshardable-looking key.
void bucket_as_state(const std::string& dir, int g, const std::string& state) {
  const std::string from = "optimizer.distributed.dp_group_idx_" + std::to_string(g) +
                           ".gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0." + state;
  std::string to = "optimizer.state." + state + ".decoder.g" + std::to_string(g);
  to += std::string(from.size() - to.size() - 7, 'x') + ".weight";
  rename_in_metadata(dir, from, to);
}

TEST(McoreDamage, BothOptimizerFormats) {
  const std::string d = copy_of("both_formats", kDpSource);
  bucket_as_state(d, 0, "exp_avg_sq");  // exp_avg_sq first: exp_avg's name is a prefix of it
  expect_one_line_naming(error_of([&] { Checkpoint{d}; }), d + "/.metadata",
                         "both fully_reshardable and dp_reshardable optimizer tensors");
}

TEST(McoreDamage, ContentMetadataNamesTheOtherFormat) {
  const std::string d = copy_of("content_metadata", kDpSource);
  for (int g = 0; g < 4; ++g)
    for (const char* state : {"exp_avg_sq", "exp_avg", "param"}) bucket_as_state(d, g, state);
  // the common state (content_metadata: dp_reshardable) is the item in rank 0's data file
  expect_one_line_naming(error_of([&] { Checkpoint{d}; }), d + "/__0_0.distcp",
                         "content_metadata names distrib_optim_sharding_type dp_reshardable but the tensors are fully_reshardable");
}

TEST(McoreDamage, MissingCommonState) {
  const std::string d = copy_of("no_common");
  rename_in_metadata(d, "common_state/shard_0_1", "rng_stateXXX/shard_0_1");
  // rng_stateXXX is no known object either; the common state is looked up first
  expect_one_line_naming(error_of([&] { Checkpoint{d}; }), d + "/.metadata", "no common state");
}

namespace {

// In the copy `dir`, the ShardedObject item `fqn`'s pickled BININT2 `from` becomes `to` (hand-edited
// in place, once), its zip record's CRC-32 stored again so that only the value is damaged.
void patch_object_int(const std::string& dir, const std::string& fqn, uint16_t from, uint16_t to) {
  std::string path;
  uint64_t offset = 0, length = 0;
  {
    const auto& item = Checkpoint(dir).dcp().metadata().item_of(fqn, nullptr).storage;
    path = dir + "/" + item.relative_path;
    offset = item.offset;
    length = item.length;
  }
  std::string bytes = slurp(path);
  ASSERT_LE(offset + length, bytes.size());
  const std::span<uint8_t> item(reinterpret_cast<uint8_t*>(bytes.data()) + offset, length);
  const ZipRecord* pkl = nullptr;
  const auto records = read_zip_directory(item, path);
  for (const auto& [name, r] : records)
    if (name.ends_with("/data.pkl")) pkl = &r;
  ASSERT_NE(pkl, nullptr);
  const std::span<uint8_t> data = item.subspan(pkl->data_offset, pkl->size);
  const std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
  const std::string was = {'M', static_cast<char>(from & 0xff), static_cast<char>(from >> 8)};
  const size_t at = text.find(was);
  ASSERT_NE(at, std::string::npos) << fqn;
  ASSERT_EQ(text.find(was, at + 1), std::string::npos) << fqn;
  data[at + 1] = static_cast<uint8_t>(to & 0xff);
  data[at + 2] = static_cast<uint8_t>(to >> 8);
  store_zip_crc(
      length, *pkl, crc32_update(0, data), [&](uint64_t o, size_t n, uint8_t* out) { std::memcpy(out, &item[o], n); },
      [&](uint64_t o, uint32_t crc) {
        for (int b = 0; b < 4; ++b) item[o + b] = static_cast<uint8_t>(crc >> (8 * b));
      });
  spit(path, bytes);
}

// ucp-union of the damaged copy `dir`: exit 1, one line naming the item's data file, the item and `cause`.
void expect_union_refused(const std::string& dir, const std::string& file, const std::string& fqn,
                          const std::string& cause) {
  const std::string root = fs::path(dir).parent_path().string();
  const auto r = ucpkit::testing::run_split_in(
      root, std::string(UCPKIT_BIN_DIR) + "/ucp-union --input " + dir + " --output " + root + "/u",
      ucpkit::testing::scratch_dir("mcore_damage_io"));
  EXPECT_EQ(r.rc, 1) << r.err;
  std::string err = r.err;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  expect_one_line_naming(err, dir + "/" + file, fqn + ": " + cause);
  EXPECT_FALSE(fs::exists(root + "/u"));
  // ucp-info's plan check runs the same recomputation: it agrees with the union (issue 47)
  const auto info = ucpkit::testing::run_split_in(root, std::string(UCPKIT_BIN_DIR) + "/ucp-info --json " + dir,
                                                  ucpkit::testing::scratch_dir("mcore_damage_io"));
  const auto j = nlohmann::json::parse(info.out);
  bool plan_failed = false;
  for (const auto& c : j["checks"])
    if (c["name"] == "plan")
      plan_failed = c["status"] == "failed" && c["error"].get<std::string>().find(cause) != std::string::npos;
  EXPECT_TRUE(plan_failed) << info.out;
}

}  // namespace

// llama_gqa_tp2_dp2_v016's dp group 1 bucket: the layout ends at 4160 (= the stored length), padded
// to lcm(dp 2, 128): per_bucket_numel [4224], per_bucket_numel_unpadded [4160] as saved.
TEST(McoreDamage, PerBucketNumelOtherThanTheBucketsIsRefusedByUnion) {
  const std::string fqn = "optimizer.distributed.dp_group_idx_1.per_bucket_numel/shard_0_1";
  const std::string d = copy_of("per_bucket_numel", kLlamaDp);
  patch_object_int(d, fqn, 4224, 4352);
  EXPECT_EQ(buffer_numels(*Checkpoint(d).read_object(fqn)).value()[0].numel, std::vector<int64_t>{4352});
  expect_union_refused(d, "__1_1.distcp", fqn,
                       "numel of bucket 0 of buffer 0: expected 4224 (the recomputed layout's end 4160 padded to a "
                       "multiple of 128), stored 4352");
}

TEST(McoreDamage, PerBucketNumelUnpaddedOtherThanTheStoredLengthIsRefusedByUnion) {
  const std::string fqn = "optimizer.distributed.dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1";
  const std::string d = copy_of("per_bucket_numel_unpadded", kLlamaDp);
  patch_object_int(d, fqn, 4160, 4096);
  expect_union_refused(d, "__0_0.distcp", fqn,
                       "numel of bucket 0 of buffer 0: expected 4160 (the stored bucket's length), stored 4096");
}

}  // namespace megatron_core_damage_test
