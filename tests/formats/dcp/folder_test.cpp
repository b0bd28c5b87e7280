// formats/dcp/folder: which kind of DCP folder a path is (the committed real saves of torch 2.6 and
// 1.13, tests/formats/dcp/data), Megatron-Core's metadata.json backend, and a rank-local save's
// metadata merged (torch 2.6 save_state_dict(no_dist=True) per rank: replicated chunks kept once, items
// under their rank folder; ranks of another class-path era or a missing rank refused naming the file).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/reader.h"
#include "support/errors.h"
#include "support/process.h"

namespace dcp_folder_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::dcp::find_folder;
using formats::dcp::FolderKind;
using formats::dcp::read_folder_metadata;
using ucpkit::testing::error_of;

namespace {
const std::string& kData = ucpkit::testing::kDcpData;

std::string copy_of(const std::string& name, const std::string& variant) {
  const std::string d = ucpkit::testing::scratch_dir("dcp_folder_" + name) + "/ck";
  fs::copy(kData + "/" + variant, d, fs::copy_options::recursive);
  return d;
}
}  // namespace

TEST(DcpFolder, KindsOfTheRealSaves) {
  EXPECT_EQ(find_folder(kData + "/fsdp_w2").kind, FolderKind::Global);
  EXPECT_EQ(find_folder(kData + "/torch113_w2").kind, FolderKind::Global);
  const auto local = find_folder(kData + "/ranklocal_w2");
  EXPECT_EQ(local.kind, FolderKind::RankLocal);
  ASSERT_EQ(local.metadata_files.size(), 2u);
  EXPECT_EQ(local.data_dirs, (std::vector<std::string>{"rank_0", "rank_1"}));
  EXPECT_EQ(find_folder(kData).kind, FolderKind::None);                    // a folder of checkpoints
  EXPECT_EQ(find_folder(kData + "/README.md").kind, FolderKind::None);     // a file
  EXPECT_EQ(find_folder(kData + "/fsdp_w2.truth").kind, FolderKind::None);
}

TEST(DcpFolder, MegatronCoreBackendFromMetadataJson) {
  const std::string d = copy_of("mcore", "fsdp_w2");
  std::ofstream(d + "/metadata.json") << R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})";
  const auto f = find_folder(d);
  EXPECT_EQ(f.kind, FolderKind::TorchDist);
  EXPECT_EQ(f.sharded_backend, "torch_dist");
  EXPECT_EQ(read_folder_metadata(f).entries.size(), 12u);  // the DCP underneath reads as any
  std::ofstream(d + "/metadata.json", std::ios::trunc) << R"({"sharded_backend": "zarr"})";
  const std::string e = error_of([&] { find_folder(d); });
  EXPECT_NE(e.find(d + "/metadata.json: Megatron-Core sharded backend 'zarr'"), std::string::npos) << e;
  std::ofstream(d + "/metadata.json", std::ios::trunc) << "{not json";
  EXPECT_NE(error_of([&] { find_folder(d); }).find(d + "/metadata.json"), std::string::npos);
}

TEST(DcpFolder, RankLocalMetadataMergedReplicasKeptOnce) {
  const auto f = find_folder(kData + "/ranklocal_w2");
  const auto md = read_folder_metadata(f);
  const auto rank0 = formats::dcp::read_metadata(kData + "/ranklocal_w2/rank_0/.metadata");
  ASSERT_EQ(md.entries.size(), rank0.entries.size());
  for (const auto& e : md.entries) EXPECT_EQ(e.chunks.size(), 1u) << e.fqn;  // each rank saved the whole tensor
  ASSERT_EQ(md.items.size(), rank0.items.size());
  for (const auto& it : md.items) EXPECT_EQ(it.storage.relative_path.rfind("rank_0/", 0), 0u) << it.storage.relative_path;
  EXPECT_EQ(formats::dcp::world_size_of(md, f), 2);
  const formats::dcp::Reader r(f.dir, md);
  EXPECT_EQ(r.read_tensor("tok_embeddings.weight").shape(), (std::vector<int64_t>{32, 8}));
}

TEST(DcpFolder, RankLocalRanksOfAnotherEraOrMissingRefused) {
  const std::string d = ucpkit::testing::scratch_dir("dcp_folder_mixed") + "/ck";
  fs::create_directories(d);
  fs::copy(kData + "/ranklocal_w2/rank_0", d + "/rank_0", fs::copy_options::recursive);
  fs::copy(kData + "/torch113_w2", d + "/rank_1", fs::copy_options::recursive);
  const std::string e = error_of([&] { read_folder_metadata(find_folder(d)); });
  EXPECT_NE(e.find(d + "/rank_1/.metadata: DCP metadata: class-path era"), std::string::npos) << e;
  fs::remove_all(d + "/rank_0");
  const std::string m = error_of([&] { find_folder(d); });
  EXPECT_NE(m.find(d + ": rank-local DCP checkpoint without the metadata of rank 0"), std::string::npos) << m;
}

TEST(DcpFolder, WorldSizeFromTheDataFileNames) {
  for (const auto& [variant, world] : std::vector<std::pair<std::string, int>>{
           {"fsdp_w2", 2}, {"twod_w4", 4}, {"fsdp_tp_optim_w4", 4}, {"single_item_w1", 1}, {"torch113_w2", 2}}) {
    const auto f = find_folder(kData + "/" + variant);
    EXPECT_EQ(formats::dcp::world_size_of(read_folder_metadata(f), f), world) << variant;
  }
}

// The `__{rank}.metadata` form (later torch's rank-local save; torch 2.6 writes none): rank 0 of the real
// torch 2.6 rank-local save, its files renamed into that form (contents unchanged), reads as a
// one-rank rank-local checkpoint.
TEST(DcpFolder, RankMetadataFilesForm) {
  const std::string d = ucpkit::testing::scratch_dir("dcp_folder_rank_files") + "/ck";
  fs::create_directories(d);
  fs::copy_file(kData + "/ranklocal_w2/rank_0/.metadata", d + "/__0.metadata");
  fs::copy_file(kData + "/ranklocal_w2/rank_0/__0_0.distcp", d + "/__0_0.distcp");
  const auto f = find_folder(d);
  EXPECT_EQ(f.kind, FolderKind::RankLocal);
  EXPECT_EQ(f.data_dirs, (std::vector<std::string>{""}));
  const auto md = read_folder_metadata(f);
  const formats::dcp::Reader r(f.dir, md);
  const formats::dcp::Reader whole(kData + "/ranklocal_w2/rank_0");
  for (const auto& e : md.entries)
    EXPECT_TRUE(r.read_tensor(e.fqn).equal(whole.read_tensor(e.fqn))) << e.fqn;
  fs::copy_file(d + "/__0.metadata", d + "/__2.metadata");  // rank 1 missing
  EXPECT_NE(error_of([&] { find_folder(d); }).find("without the metadata of rank 1"), std::string::npos);
}

}  // namespace dcp_folder_test
