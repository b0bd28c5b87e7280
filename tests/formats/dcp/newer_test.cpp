// formats/dcp on checkpoints written by torch 2.14.1's own DCP save code (tests/formats/dcp/data/t214_*,
// scripts/fixtures/dcp_fixtures_newer.sh: the real torch/distributed/checkpoint package of Debian's
// python3-torch 2.14.1 over torch 2.6, 2 gloo ranks; README.md there): zstd transforms on every item
// (FileSystemWriter _extensions=[ZStandard()]), Metadata.version, __{rank}.metadata rank-local saves
// (use_collectives=False) and the HuggingFaceStorageWriter safetensors flavour; and torch 2.6's own
// save with the torch 2.0-2.2 TensorProperties class path (t26_shardprops_w2) and with an emulated
// 6-item TensorProperties state (t26_strides6_w2). Every tensor is read
// bit-exact against the truth the saving script recorded (torch's own full_state_dict gather, not DCP
// loading), through the library and through `ucp-union --input` run as users run it (relative paths,
// from another folder). Damage (a zstd frame cut short, an unknown transform): one line naming the data
// file, exit 1, nothing left.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "core/error.h"
#include "formats/dcp/dcp_data.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/merge.h"
#include "formats/dcp/reader.h"
#include "formats/dcp/safetensors_flavour.h"
#include "formats/dcp/transforms.h"
#include "formats/universal/manifest.h"
#include "formats/universal/state_file.h"
#include "io/safetensors_file.h"
#include "io/torch/torch_file.h"
#include "support/paths.h"
#include "support/process.h"

namespace dcp_newer_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::dcp::FolderKind;
using formats::dcp::Reader;
using ucpkit::testing::slurp;

namespace {

const std::string& kData = ucpkit::testing::kDcpData;

std::map<std::string, SafetensorsTensor> truth_of(const std::string& variant) {
  const std::string p = kData + "/" + variant + ".truth/tensors.safetensors";
  return parse_safetensors(slurp(p), p);
}

void expect_same(const Tensor& t, const SafetensorsTensor& want) {
  EXPECT_EQ(dtype_safetensors_name(t.dtype()), want.dtype);
  EXPECT_EQ(t.shape(), want.shape);
  const auto b = t.contiguous().contiguous_bytes();
  ASSERT_EQ(b.size(), want.bytes.size());
  EXPECT_EQ(0, std::memcmp(b.data(), want.bytes.data(), b.size())) << "values differ";
}

// The folder as the tools open it (find_folder + read_folder_metadata), every tensor vs the truth.
Reader open_folder(const std::string& dir) {
  const auto f = formats::dcp::find_folder(dir);
  return Reader(dir, formats::dcp::read_folder_metadata(f));
}

void expect_matches_truth(const Reader& r, const std::map<std::string, SafetensorsTensor>& truth) {
  std::set<std::string> tensor_keys, truth_keys;
  for (const auto& e : r.metadata().entries)
    if (!e.is_bytes) tensor_keys.insert(e.fqn);
  for (const auto& [k, v] : truth) truth_keys.insert(k);
  EXPECT_EQ(tensor_keys, truth_keys) << r.dir();
  for (const auto& [name, want] : truth) {
    SCOPED_TRACE(r.dir() + " " + name);
    expect_same(r.read_tensor(name), want);
  }
}

// A copy of fixture `variant` at <scratch>/in/ck, and <scratch>/work, the folder the tools run in.
struct Case {
  std::string root, work, input;
};

Case case_of(const std::string& name, const std::string& variant) {
  Case c;
  c.root = ucpkit::testing::scratch_dir("dcp_newer_" + name);
  c.work = c.root + "/work";
  fs::create_directories(c.work);
  c.input = c.root + "/in/ck";
  fs::create_directories(c.root + "/in");
  fs::copy(kData + "/" + variant, c.input, fs::copy_options::recursive);
  return c;
}

ucpkit::testing::SplitResult union_in(const Case& c, const std::string& args) {
  return ucpkit::testing::run_split_in(c.work, kBin + "/ucp-union " + args, c.root);
}

// ucp-union's universal folder vs the truth: every parameter's state files and step.
void expect_universal_matches_truth(const std::string& out, const std::string& variant) {
  const auto truth = truth_of(variant);
  const auto manifest = formats::universal::read_universal_manifest(out + "/manifest.json");
  EXPECT_EQ(manifest.source.format_name(), "dcp");
  std::set<std::string> used;
  for (const auto& p : manifest.params) {
    for (const auto& [state, f] : p.states) {
      SCOPED_TRACE(variant + " " + p.name + " " + state);
      const std::string key = state == "fp32" ? (truth.count("model." + p.name) ? "model." + p.name : p.name)
                                              : "optim.state." + p.name + "." + state;
      ASSERT_TRUE(truth.count(key)) << key;
      used.insert(key);
      const std::string path = out + "/" + f.file;
      expect_same(formats::universal::read_state_file(load_torch(path), path).param, truth.at(key));
    }
    if (p.step) {
      const std::string key = "optim.state." + p.name + ".step";
      ASSERT_TRUE(truth.count(key)) << key;
      used.insert(key);
      const auto step = load_torch(out + "/zero/" + p.name + "/step.pt");
      ASSERT_TRUE(step && step->kind == pickle::Kind::Tensor);
      expect_same(step->as_tensor(), truth.at(key));
    }
  }
  EXPECT_EQ(used.size(), truth.size()) << variant << ": truth tensors without a universal state";
}

// Nothing but the input and the work folder's absence of output: no staging left behind.
void expect_nothing_left(const Case& c) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(c.work)) {
    ADD_FAILURE() << "left behind: " << e.path();
    ++n;
  }
  EXPECT_EQ(n, 0u);
}

}  // namespace

TEST(DcpNewer, ZstdTransformsOnEveryItemReadBitExact) {
  const std::string dir = kData + "/t214_zstd_w2";
  EXPECT_EQ(formats::dcp::find_folder(dir).kind, FolderKind::Global);
  const Reader r = open_folder(dir);
  EXPECT_EQ(r.metadata().version, std::optional<std::string>("1.0.0"));  // filesystem.py:71, :762@2.14.1
  size_t zstd = 0;
  for (const auto& it : r.metadata().items) {
    EXPECT_EQ(it.storage.transform_descriptors, std::vector<std::string>{"stream.zstd/1"}) << it.fqn;
    zstd += it.storage.transforms == 1;
  }
  EXPECT_EQ(zstd, r.metadata().items.size());
  expect_matches_truth(r, truth_of("t214_zstd_w2"));
  // Bytes items (param_groups) are zstd streams too: decoded, then torch.load's bytes; values as recorded.
  const auto want = nlohmann::json::parse(slurp(kData + "/t214_zstd_w2.truth/nontensor.json"));
  EXPECT_DOUBLE_EQ(r.read_object("optim.param_groups.0.lr")->as_float(), want["optim.param_groups.0.lr"].get<double>());
  EXPECT_DOUBLE_EQ(r.read_object("optim.param_groups.0.eps")->as_float(), want["optim.param_groups.0.eps"].get<double>());
  EXPECT_FALSE(r.read_object("optim.param_groups.0.amsgrad")->as_bool());
}

TEST(DcpNewer, LargeZstdItemsDecodeWhole) {
  // 6 MiB of tensors stored in under 2 KB of zstd (one process, torch 2.14.1 with ZStandard): the
  // decoder's output grows through many 128 KiB blocks. Truth: dtype, shape, size and zlib.crc32 of each
  // tensor's bytes as the saving script computed them (truth.json); zlib's crc32 here, not ucpkit's.
  const std::string dir = kData + "/t214_zstd_big_w1";
  const Reader r = open_folder(dir);
  const auto truth = nlohmann::json::parse(slurp(dir + ".truth/truth.json"));
  ASSERT_EQ(r.metadata().entries.size(), truth.size());
  for (const auto& [name, want] : truth.items()) {
    SCOPED_TRACE(name);
    const Tensor t = r.read_tensor(name);
    EXPECT_EQ(dtype_name(t.dtype()), want["dtype"].get<std::string>());
    EXPECT_EQ(t.shape(), want["shape"].get<std::vector<int64_t>>());
    const auto b = t.contiguous().contiguous_bytes();
    ASSERT_EQ(b.size(), want["nbytes"].get<size_t>());
    EXPECT_EQ(::crc32(0L, b.data(), static_cast<uInt>(b.size())), want["crc32"].get<uint32_t>());
  }
}

TEST(DcpNewer, Torch214WithoutTransformsReadBitExact) {
  const Reader r = open_folder(kData + "/t214_plain_w2");
  EXPECT_EQ(r.metadata().version, std::optional<std::string>("1.0.0"));
  for (const auto& it : r.metadata().items) EXPECT_EQ(it.storage.transforms, 0u) << it.fqn;
  expect_matches_truth(r, truth_of("t214_plain_w2"));
}

TEST(DcpNewer, RankLocalUnderscoreRankMetadataMergedBitExact) {
  // use_collectives=False: each rank wrote its own __{rank}.metadata of its own Shard(0) chunks
  // (filesystem.py:770-806@2.14.1); neither alone tiles a tensor, the two merged do.
  const std::string dir = kData + "/t214_ranklocal_w2";
  const auto f = formats::dcp::find_folder(dir);
  ASSERT_EQ(f.kind, FolderKind::RankLocal);
  ASSERT_EQ(f.metadata_files.size(), 2u);
  EXPECT_EQ(fs::path(f.metadata_files[1]).filename(), "__1.metadata");
  const auto md = formats::dcp::read_folder_metadata(f);
  EXPECT_EQ(formats::dcp::world_size_of(md, f), 2);
  const Reader r(dir, md);
  expect_matches_truth(r, truth_of("t214_ranklocal_w2"));
  const auto part = formats::dcp::read_metadata(f.metadata_files[0]);
  EXPECT_THROW(formats::dcp::check_chunks_cover(part.entries.at(0), part.path), Error);
}

TEST(DcpNewer, RankLocalUnderscoreRankMetadataMergesIntoOneReshardableFolder) {
  // formats/dcp/merge on torch 2.14.1's real __{rank}.metadata save: the merged folder has one
  // .metadata listing both ranks' chunks, and reads as the truth.
  const std::string out = ucpkit::testing::scratch_dir("dcp_newer_merge") + "/merged";
  const auto parts = formats::dcp::rank_local_parts(kData + "/t214_ranklocal_w2");
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(fs::path(parts[1].metadata_file).filename(), "__1.metadata");
  formats::dcp::merge_rank_local(parts, out);
  EXPECT_EQ(formats::dcp::find_folder(out).kind, FolderKind::Global);
  const Reader r(out);
  for (const auto& e : r.metadata().entries) EXPECT_EQ(e.chunks.size(), 2u) << e.fqn;  // Shard(0) x 2 ranks
  expect_matches_truth(r, truth_of("t214_ranklocal_w2"));
}

TEST(DcpNewer, SafetensorsFlavourShardedBitExact) {
  const std::string dir = kData + "/t214_hf_w2";
  const auto f = formats::dcp::find_folder(dir);
  ASSERT_EQ(f.kind, FolderKind::Safetensors);
  EXPECT_EQ(formats::dcp::folder_kind_name(f.kind), "dcp-safetensors");
  ASSERT_EQ(f.metadata_files.size(), 2u);  // shard-00001-..., shard-00002-... (shard_index = rank + 1)
  const auto md = formats::dcp::read_folder_metadata(f);
  EXPECT_EQ(formats::dcp::world_size_of(md, f), 2);
  EXPECT_EQ(md.version, std::optional<std::string>("1.0"));  // DCP_VERSION, _hf_utils.py:37-38@2.14.1
  const auto* e = md.find("tok_embeddings.weight");
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->chunks.size(), 2u);  // FSDP2 Shard(0): two row blocks from saved_offsets
  EXPECT_EQ(e->chunks[1].offsets, (std::vector<int64_t>{e->size[0] / 2, 0}));
  EXPECT_EQ(md.era, formats::dcp::ClassEra::Safetensors);
  for (const auto& it : md.items) EXPECT_TRUE(it.storage.raw) << it.fqn;
  expect_matches_truth(Reader(dir, md), truth_of("t214_hf_w2"));
}

TEST(DcpNewer, SafetensorsFlavourTwoFilesPerRankBitExact) {
  // fqn_to_index_mapping: layers.* in model-00001, the rest in model-00002, from each of the 2 ranks.
  const std::string dir = kData + "/t214_hfmulti_w2";
  const auto f = formats::dcp::find_folder(dir);
  ASSERT_EQ(f.kind, FolderKind::Safetensors);
  ASSERT_EQ(f.metadata_files.size(), 4u);
  const auto md = formats::dcp::read_folder_metadata(f);
  EXPECT_EQ(formats::dcp::world_size_of(md, f), 2);
  for (const auto& e : md.entries) EXPECT_EQ(e.chunks.size(), 2u) << e.fqn;
  expect_matches_truth(Reader(dir, md), truth_of("t214_hfmulti_w2"));
}

TEST(DcpNewer, SafetensorsConsolidatedOutput) {
  // enable_consolidation=True: the DCP shards under sharded/, the consolidated file beside them is a
  // plain Hugging Face file (no DCP_SHARDING_INFO), not a DCP folder; read as torch's
  // HuggingFaceStorageReader reads one (offsets 0), it holds the truth as well.
  const std::string dir = kData + "/t214_hfcons_w2";
  EXPECT_EQ(formats::dcp::find_folder(dir).kind, FolderKind::None);
  ASSERT_EQ(formats::dcp::find_folder(dir + "/sharded").kind, FolderKind::Safetensors);
  expect_matches_truth(open_folder(dir + "/sharded"), truth_of("t214_hfcons_w2"));
  const auto md = formats::dcp::read_safetensors_metadata({dir + "/model-00001-of-00001.safetensors"});
  expect_matches_truth(Reader(dir, md), truth_of("t214_hfcons_w2"));
}

TEST(DcpNewer, Torch20To22TensorPropertiesClassPathReadBitExact) {
  // torch 2.6's real save with TensorProperties patched to the _shard class, as torch's own
  // test_compatibility.py (test_sharded_tensor_dependency) emulates torch 2.0-2.2 checkpoints.
  const std::string dir = kData + "/t26_shardprops_w2";
  EXPECT_NE(slurp(dir + "/.metadata").find("torch.distributed._shard.sharded_tensor.metadata"), std::string::npos);
  const Reader r = open_folder(dir);
  EXPECT_EQ(r.metadata().era, formats::dcp::ClassEra::ShardedProps);
  expect_matches_truth(r, truth_of("t26_shardprops_w2"));
}

TEST(DcpNewer, SixItemTensorPropertiesStateReadBitExact) {
  // The 2026 TensorProperties state (dtype, layout, requires_grad, memory format, pin_memory, strides),
  // emulated on torch 2.6's real save (scripts/fixtures/dcp_fixtures_newer.py --variant strides6).
  const std::string dir = kData + "/t26_strides6_w2";
  const Reader r = open_folder(dir);
  EXPECT_EQ(r.metadata().era, formats::dcp::ClassEra::Current);
  expect_matches_truth(r, truth_of("t26_strides6_w2"));
}

TEST(DcpNewer, ZstdFrameCutShortIsAnError) {
  // A real item's zstd frame with its last bytes cut off.
  const std::string dir = kData + "/t214_zstd_w2";
  const Reader r(dir);
  const auto& it = r.metadata().items.front();
  const std::string file = slurp(dir + "/" + it.storage.relative_path);
  const std::span<const uint8_t> item(reinterpret_cast<const uint8_t*>(file.data()) + it.storage.offset,
                                      it.storage.length);
  EXPECT_NO_THROW(formats::dcp::undo_transforms(item, it.storage.transform_descriptors, "x"));
  try {
    formats::dcp::undo_transforms(item.first(item.size() - 3), it.storage.transform_descriptors, "item.bin");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("item.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cut short"), std::string::npos) << e.what();
  }
  // A stream decoding to more than the caller allows (the reader: the chunk's bytes + 1 MiB) stops there.
  const size_t whole = formats::dcp::undo_transforms(item, it.storage.transform_descriptors, "x").size();
  EXPECT_EQ(formats::dcp::undo_transforms(item, it.storage.transform_descriptors, "x", whole).size(), whole);
  EXPECT_THROW(formats::dcp::undo_transforms(item, it.storage.transform_descriptors, "x", whole - 1), Error);
  EXPECT_THROW(formats::dcp::undo_transforms(item, {"stream.zstd/2"}, "x"), Error);  // another major version
  EXPECT_THROW(formats::dcp::undo_transforms(item, {"stream.lz4/1"}, "x"), Error);
}

TEST(DcpNewerUnion, EveryNewerVariantBitExactThroughUcpUnion) {
  for (const std::string variant : {"t214_zstd_w2", "t214_plain_w2", "t214_ranklocal_w2", "t214_hf_w2",
                                    "t214_hfmulti_w2", "t26_shardprops_w2", "t26_strides6_w2"}) {
    SCOPED_TRACE(variant);
    const Case c = case_of("all_" + variant, variant);
    const auto r = union_in(c, "--input ../in/ck --output out --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_GT(nlohmann::json::parse(r.out).value("params", 0), 0);
    expect_universal_matches_truth(c.work + "/out", variant);
  }
  const Case c = case_of("all_hfcons", "t214_hfcons_w2");
  const auto r = union_in(c, "--input ../in/ck/sharded --output out");
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_universal_matches_truth(c.work + "/out", "t214_hfcons_w2");
}

TEST(DcpNewerUnion, ZstdFrameCutShortInADataFileFailsNamingIt) {
  // Item A's bytes replaced by the first |A| bytes of a longer real zstd item B of the same save: a
  // real frame that ends too early, inside an otherwise intact file and metadata.
  const Case c = case_of("cut", "t214_zstd_w2");
  const Reader r(c.input);
  const formats::dcp::Item *a = nullptr, *b = nullptr;
  for (const auto& it : r.metadata().items) {
    if (!it.offset) continue;  // tensor items only
    if (!a || it.storage.length < a->storage.length) a = &it;
    if (!b || it.storage.length > b->storage.length) b = &it;
  }
  ASSERT_TRUE(a && b && b->storage.length > a->storage.length + 16);
  std::string fa = slurp(c.input + "/" + a->storage.relative_path);
  const std::string fb = slurp(c.input + "/" + b->storage.relative_path);
  fa.replace(a->storage.offset, a->storage.length, fb.substr(b->storage.offset, a->storage.length));
  {
    std::ofstream(c.input + "/" + a->storage.relative_path, std::ios::binary | std::ios::trunc) << fa;
  }
  const auto res = union_in(c, "--input ../in/ck --output out");
  EXPECT_EQ(res.rc, 1) << res.err;
  EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << res.err;
  EXPECT_NE(res.err.find(a->storage.relative_path), std::string::npos) << res.err;
  EXPECT_NE(res.err.find("cut short"), std::string::npos) << res.err;
  expect_nothing_left(c);
}

TEST(DcpNewerUnion, UnknownTransformFailsNamingTheDataFile) {
  // Every "stream.zstd/1" descriptor in .metadata renamed to a transform nobody registered (same length,
  // so the pickle stays valid).
  const Case c = case_of("unknown", "t214_zstd_w2");
  std::string md = slurp(c.input + "/.metadata");
  size_t n = 0;
  for (size_t at = md.find("stream.zstd/1"); at != std::string::npos; at = md.find("stream.zstd/1", at + 1), ++n)
    md.replace(at, 13, "stream.brot/1");
  ASSERT_GT(n, 0u);
  {
    std::ofstream(c.input + "/.metadata", std::ios::binary | std::ios::trunc) << md;
  }
  const auto res = union_in(c, "--input ../in/ck --output out");
  EXPECT_EQ(res.rc, 1) << res.err;
  EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << res.err;
  EXPECT_NE(res.err.find(".distcp"), std::string::npos) << res.err;
  EXPECT_NE(res.err.find("unknown transform 'stream.brot/1'"), std::string::npos) << res.err;
  expect_nothing_left(c);
}

namespace {

// Rewrites the JSON header of safetensors file `path` through `edit` (the header length prefix follows;
// the tensor bytes stay as they are).
void edit_safetensors_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  const std::string b = slurp(path);
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<uint8_t>(b[static_cast<size_t>(k)]);
  nlohmann::json h = nlohmann::json::parse(b.substr(8, n));
  edit(h);
  const std::string text = h.dump();
  std::string out(8, '\0');
  for (int k = 0; k < 8; ++k) out[static_cast<size_t>(k)] = static_cast<char>((text.size() >> (8 * k)) & 0xff);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out << text << b.substr(8 + n);
}

void expect_union_refuses(const Case& c, const std::string& file, const std::string& what) {
  const auto res = union_in(c, "--input ../in/ck --output out");
  EXPECT_EQ(res.rc, 1) << res.err;
  EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << res.err;
  EXPECT_NE(res.err.find(file), std::string::npos) << res.err;
  EXPECT_NE(res.err.find(what), std::string::npos) << res.err;
  expect_nothing_left(c);
}

const char* kShard1 = "shard-00001-model-00001-of-00001.safetensors";

}  // namespace

TEST(DcpNewerUnion, SafetensorsTensorPastItsFileFailsNamingIt) {
  const Case c = case_of("st_past", "t214_hf_w2");
  edit_safetensors_header(c.input + "/" + kShard1, [](nlohmann::json& h) {
    auto& off = h["output.weight"]["data_offsets"];
    off[1] = off[1].get<int64_t>() + 4096;
  });
  expect_union_refuses(c, kShard1, "'output.weight' data_offsets do not hold its shape x dtype inside the file");
}

TEST(DcpNewerUnion, SafetensorsShardingInfoWithoutAKeyFailsNamingIt) {
  const Case c = case_of("st_nokey", "t214_hf_w2");
  edit_safetensors_header(c.input + "/" + kShard1, [](nlohmann::json& h) {
    auto info = nlohmann::json::parse(h["__metadata__"]["DCP_SHARDING_INFO"].get<std::string>());
    info.erase("norm.weight");
    h["__metadata__"]["DCP_SHARDING_INFO"] = info.dump();
  });
  expect_union_refuses(c, kShard1, "DCP_SHARDING_INFO has no saved_offsets for 'norm.weight'");
}

TEST(DcpNewerUnion, SafetensorsChunksLeavingAGapFailNamingTheFile) {
  // Rank 0's file loses tok_embeddings.weight: only rank 1's chunk (rows 16..31) remains; the global size
  // (largest offset + shape, as torch's reader computes it) still starts at row 0, so rows 0..15 are a
  // gap. The error names the metadata's path, the first shard file.
  const Case c = case_of("st_gap", "t214_hf_w2");
  edit_safetensors_header(c.input + "/" + kShard1, [](nlohmann::json& h) {
    h.erase("tok_embeddings.weight");
    auto info = nlohmann::json::parse(h["__metadata__"]["DCP_SHARDING_INFO"].get<std::string>());
    info.erase("tok_embeddings.weight");
    h["__metadata__"]["DCP_SHARDING_INFO"] = info.dump();
  });
  expect_union_refuses(c, kShard1, "leave a gap");
}

TEST(DcpNewerUnion, UcpInfoVerifiesEveryNewerVariant) {
  // ucp-info --verify decodes every item (zstd frames, raw safetensors ranges) and reports the folder kind.
  const std::map<std::string, std::string> kinds = {
      {"t214_zstd_w2", "dcp"},       {"t214_plain_w2", "dcp"},          {"t214_ranklocal_w2", "dcp-rank-local"},
      {"t214_hf_w2", "dcp-safetensors"}, {"t26_shardprops_w2", "dcp"}, {"t26_strides6_w2", "dcp"}};
  for (const auto& [variant, folder] : kinds) {
    SCOPED_TRACE(variant);
    const Case c = case_of("info_" + variant, variant);
    const auto r = ucpkit::testing::run_split_in(c.work, kBin + "/ucp-info ../in/ck --verify --json", c.root);
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_TRUE(j.value("ok", false));
    EXPECT_EQ(j["dcp"].value("folder", ""), folder);
    EXPECT_EQ(j["dcp"].value("world_size", 0), 2);
    EXPECT_EQ(j["dcp"].value("tensor_entries", 0), static_cast<int>(truth_of(variant).size()));
    for (const auto& check : j["checks"]) EXPECT_EQ(check.value("status", ""), "ok") << check.dump();
  }
}

}  // namespace dcp_newer_test
