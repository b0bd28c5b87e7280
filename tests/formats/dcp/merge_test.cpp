// formats/dcp merge: rank-local saves -> one reshardable DCP folder. The real torch 2.6 rank-local save
// (tests/formats/dcp/data/ranklocal_w2: save_state_dict(no_dist=True) per rank, each part a full copy)
// merges into one folder whose every tensor equals the truth; parts holding different tensors (as
// pipeline stages would) merge into the union; parts that disagree are refused naming the part's
// metadata, and nothing is written. Whether real torch loads the merged folder at another world size
// is checked by scripts/verify/dcp_verify.sh (docs/formats-dcp.md, "Writing").
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/merge.h"
#include "formats/dcp/reader.h"
#include "formats/dcp/rewrite.h"
#include "io/safetensors_file.h"
#include "support/errors.h"
#include "support/process.h"

namespace dcp_merge_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::formats::dcp;
using ucpkit::testing::error_of;
using ucpkit::testing::slurp;

namespace {

const std::string& kData = ucpkit::testing::kDcpData;

// Every tensor of `dir` is the truth's, bit for bit, and the tensor sets are equal.
void expect_truth(const std::string& dir, const std::string& variant) {
  const std::string tp = kData + "/" + variant + ".truth/tensors.safetensors";
  const auto truth = parse_safetensors(slurp(tp), tp);
  const Reader r(dir);
  size_t tensors = 0;
  for (const Entry& e : r.metadata().entries) {
    if (e.is_bytes) continue;
    ++tensors;
    const auto it = truth.find(e.fqn);
    ASSERT_NE(it, truth.end()) << e.fqn;
    const Tensor t = r.read_tensor(e.fqn);
    EXPECT_EQ(t.shape(), it->second.shape) << e.fqn;
    const auto b = t.contiguous_bytes();
    ASSERT_EQ(b.size(), it->second.bytes.size()) << e.fqn;
    EXPECT_EQ(0, std::memcmp(b.data(), it->second.bytes.data(), b.size())) << e.fqn;
  }
  EXPECT_EQ(tensors, truth.size());
}

// Writes the entries of `src` for which `keep` holds as one rank-local part `dir` (whole tensors;
// its data file named for `rank`).
void write_part(const Reader& src, const std::string& dir, int64_t rank, const std::function<bool(const Entry&)>& keep,
                const std::function<Tensor(const Entry&)>& values) {
  std::vector<Entry> entries;
  for (const Entry& e : src.metadata().entries)
    if (keep(e)) entries.push_back(e);
  SavePlan plan = make_save_plan(entries, Target::whole());
  plan.files[0].rank = rank;
  plan.files[0].relative_path = data_file_name(rank);
  write_dcp(plan, chunks_of_whole(values, [&src](const Entry& e) { return src.read_bytes(e.fqn); }), dir);
}

}  // namespace

TEST(DcpMerge, RealRankLocalSaveOfTwoRanks) {
  const std::string in = kData + "/ranklocal_w2";
  const auto parts = rank_local_parts(in);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].metadata_file, in + "/rank_1/.metadata");
  const std::string out = ucpkit::testing::scratch_dir("dcp_merge_real") + "/merged";
  const MergeResult m = merge_rank_local(parts, out);
  expect_truth(out, "ranklocal_w2");
  // Each part is a full copy: every chunk of rank 1 is a replica of rank 0's, kept once.
  const Reader r1(parts[1].dir, parts[1].metadata_file), merged(out);
  size_t part_items = r1.metadata().items.size();
  EXPECT_EQ(m.replicas, part_items);
  EXPECT_EQ(merged.metadata().items.size(), part_items);
  EXPECT_EQ(m.written.storage.size(), part_items);
}

// Two parts with different tensors (a pipeline's stages), as our writer writes rank-local parts.
TEST(DcpMerge, PartsWithDifferentTensorsMergeIntoTheUnion) {
  const Reader src(kData + "/fsdp_w2");
  const std::string root = ucpkit::testing::scratch_dir("dcp_merge_union");
  fs::create_directories(root + "/in");
  auto first = [](const Entry& e) { return e.fqn.find("layers.") != std::string::npos; };
  auto whole = [&src](const Entry& e) { return src.read_tensor(e.fqn); };
  write_part(src, root + "/in/rank_0", 0, first, whole);
  write_part(src, root + "/in/rank_1", 1, [&](const Entry& e) { return !first(e); }, whole);
  const MergeResult m = merge_rank_local(rank_local_parts(root + "/in"), root + "/out");
  EXPECT_EQ(m.replicas, 0u);
  expect_truth(root + "/out", "fsdp_w2");
  const Metadata md = read_metadata(root + "/out/.metadata");
  for (const Item& it : md.items) EXPECT_EQ(it.storage.relative_path, first(*md.find(it.fqn)) ? "__0_0.distcp" : "__1_0.distcp");
  // The same parts laid out as later torch's `__{rank}.metadata` files in one folder are found too.
  fs::create_directories(root + "/flat");
  for (int r = 0; r < 2; ++r) {
    const std::string p = root + "/in/rank_" + std::to_string(r);
    fs::copy_file(p + "/.metadata", root + "/flat/__" + std::to_string(r) + ".metadata");
    fs::copy_file(p + "/__" + std::to_string(r) + "_0.distcp", root + "/flat/__" + std::to_string(r) + "_0.distcp");
  }
  const auto flat = rank_local_parts(root + "/flat");
  ASSERT_EQ(flat.size(), 2u);
  merge_rank_local(flat, root + "/out_flat");
  expect_truth(root + "/out_flat", "fsdp_w2");
}

TEST(DcpMerge, DisagreeingPartsAreRefusedAndNothingIsWritten) {
  const Reader src(kData + "/fsdp_w2");
  const std::string root = ucpkit::testing::scratch_dir("dcp_merge_bad");
  fs::create_directories(root + "/in");
  auto all = [](const Entry&) { return true; };
  auto whole = [&src](const Entry& e) { return src.read_tensor(e.fqn); };
  write_part(src, root + "/in/rank_0", 0, all, whole);
  // Same boxes, one value changed.
  write_part(src, root + "/in/rank_1", 1, all, [&src](const Entry& e) {
    Tensor t = src.read_tensor(e.fqn).contiguous(true);
    if (e.fqn == "norm.weight") t.storage()->mutable_bytes()[0] ^= 1;
    return t;
  });
  std::string msg = error_of([&] { merge_rank_local(rank_local_parts(root + "/in"), root + "/out"); });
  EXPECT_NE(msg.find(root + "/in/rank_1/.metadata"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'norm.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("other values"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_FALSE(fs::exists(root + "/out"));
  // The same tensor chunked otherwise (rows of 2 ranks against whole): overlapping chunks.
  fs::remove_all(root + "/in/rank_1");
  rewrite_dcp(kData + "/fsdp_w2", root + "/in/rank_1", std::nullopt);
  msg = error_of([&] { merge_rank_local(rank_local_parts(root + "/in"), root + "/out"); });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank_1/.metadata"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(root + "/out"));
  // A folder with a global .metadata, and one with no parts.
  msg = error_of([&] { rank_local_parts(kData + "/fsdp_w2"); });
  EXPECT_NE(msg.find("global .metadata"), std::string::npos) << msg;
  fs::create_directories(root + "/empty");
  msg = error_of([&] { rank_local_parts(root + "/empty"); });
  EXPECT_NE(msg.find("no rank-local parts"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_empty(root + "/empty"));
}

}  // namespace dcp_merge_test
