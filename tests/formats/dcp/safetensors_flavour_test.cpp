// lib/formats/dcp/safetensors_flavour: folders written by torch 2.14.1's HuggingFaceStorageWriter
// (tests/formats/dcp/data/t214_hf*, README.md there) read into Metadata and compared with
// /usr/bin/python3 reading the same safetensors headers (json + struct, no ucpkit code) and with the
// full tensors torch gathered (<folder>.truth/tensors.safetensors: global sizes, chunk bytes); folder
// detection; files written here byte by byte for each refusal; raw_chunk; safetensors_world_size.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/dcp/safetensors_flavour.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace dcp_safetensors_flavour_test {

using namespace ucpkit;
using namespace ucpkit::formats::dcp;
namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(UCPKIT_SOURCE_DIR) + "/tests/formats/dcp/data";

std::string thrown(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

std::string ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t k = 0; k < v.size(); ++k) s += (k ? "," : "") + std::to_string(v[k]);
  return s + "]";
}

// Entries (with global sizes) then items, one line each, as the Python below prints them.
std::string describe(const Metadata& md) {
  std::ostringstream o;
  for (const Entry& e : md.entries)
    o << "E " << e.fqn << " " << dtype_safetensors_name(e.dtype) << " " << ints(e.size) << "\n";
  for (const Item& it : md.items)
    o << "I " << it.fqn << " " << ints(*it.offset) << " " << it.storage.relative_path << " " << it.storage.offset << " "
      << it.storage.length << (it.storage.raw ? "" : " not-raw") << "\n";
  return o.str();
}

// The same from the headers by Python: entries in order of first appearance with the truth's shape.
const char* kPython = R"PY(
import json, struct, sys, os
def header(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    return 8 + n, json.loads(b[8:8 + n])
_, truth = header(sys.argv[1])
entries, items = {}, []
for path in sys.argv[2:]:
    start, h = header(path)
    info = json.loads(h['__metadata__']['DCP_SHARDING_INFO'])
    for fqn, t in h.items():
        if fqn == '__metadata__': continue
        entries.setdefault(fqn, 'E %s %s [%s]' % (fqn, t['dtype'], ','.join(map(str, truth[fqn]['shape']))))
        a, b = t['data_offsets']
        offs = ','.join(map(str, info[fqn]['saved_offsets']))
        items.append('I %s [%s] %s %d %d' % (fqn, offs, os.path.basename(path), start + a, b - a))
print('\n'.join(list(entries.values()) + items))
)PY";

std::string python_describe(const std::string& truth, const std::vector<std::string>& files) {
  const std::string script = ucpkit::testing::scratch_dir("safetensors_flavour_py") + "/d.py";
  std::ofstream(script) << kPython;
  std::string cmd = std::string(UCPKIT_PYTHON) + " " + script + " " + truth;
  for (const auto& f : files) cmd += " " + f;
  std::string out;
  EXPECT_EQ(ucpkit::testing::run_command(cmd, &out), 0) << out;
  return out;
}

// A safetensors file from a header JSON text and `data_bytes` bytes of data.
std::string write_st(const std::string& dir, const std::string& name, const std::string& header,
                     size_t data_bytes = 0) {
  const std::string path = dir + "/" + name;
  std::string b(8, '\0');
  for (int k = 0; k < 8; ++k) b[k] = static_cast<char>((header.size() >> (8 * k)) & 0xff);
  b += header;
  b += std::string(data_bytes, '\x01');
  std::ofstream(path, std::ios::binary) << b;
  return path;
}

std::string dcp_meta(const std::string& sharding) {
  nlohmann::json m;
  m["DCP_SHARDING_INFO"] = sharding;
  m["DCP_VERSION"] = "1.0";
  m["format"] = "pt";
  return m.dump();
}

}  // namespace

TEST(SafetensorsFlavour, RealFoldersMatchPythonsReadingAndTheTruthsShapes) {
  for (const std::string& name : {"t214_hf_w2", "t214_hfmulti_w2", "t214_hfcons_w2/sharded"}) {
    SCOPED_TRACE(name);
    const std::string dir = kData + "/" + name;
    const auto files = safetensors_flavour_files(dir);
    std::vector<std::string> want;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") want.push_back(e.path().string());
    std::sort(want.begin(), want.end());
    ASSERT_EQ(files, want);
    const Metadata md = read_safetensors_metadata(files);
    EXPECT_EQ(md.path, files.front());
    EXPECT_EQ(md.era, ClassEra::Safetensors);
    EXPECT_EQ(md.version, "1.0");
    const std::string truth = kData + "/" + name.substr(0, name.find('/')) + ".truth/tensors.safetensors";
    EXPECT_EQ(describe(md), python_describe(truth, files));
    EXPECT_EQ(safetensors_world_size(files), 2);
    EXPECT_EQ(md.entries.size(), 12u);
  }
}

TEST(SafetensorsFlavour, ChunkBytesAreTheTruthsRows) {
  // tok_embeddings.weight [32, 8] float32, split by rows: rank 1's chunk holds rows 16..31.
  const auto files = safetensors_flavour_files(kData + "/t214_hf_w2");
  const Metadata md = read_safetensors_metadata(files);
  const std::vector<int64_t> at{16, 0};
  const Item& it = md.item_of("tok_embeddings.weight", &at);
  EXPECT_EQ(it.storage.relative_path, "shard-00002-model-00001-of-00001.safetensors");
  const std::string file = ucpkit::testing::file_bytes(kData + "/t214_hf_w2/" + it.storage.relative_path);
  const std::string chunk = file.substr(it.storage.offset, it.storage.length);
  const Tensor t = raw_chunk({reinterpret_cast<const uint8_t*>(chunk.data()), chunk.size()}, DType::Float32, {16, 8},
                             "c");
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{16, 8}));
  // The truth file's tensor, its second half.
  const std::string truth = ucpkit::testing::file_bytes(kData + "/t214_hf_w2.truth/tensors.safetensors");
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<uint8_t>(truth[k]);
  const auto h = nlohmann::json::parse(truth.substr(8, n));
  const auto span = h["tok_embeddings.weight"]["data_offsets"];
  const std::string whole = truth.substr(8 + n + span[0].get<size_t>(), span[1].get<size_t>() - span[0].get<size_t>());
  ASSERT_EQ(whole.size(), 32u * 8 * 4);
  const auto got = t.contiguous_bytes();
  EXPECT_EQ(std::string(got.begin(), got.end()), whole.substr(16 * 8 * 4));
}

TEST(SafetensorsFlavour, FolderDetection) {
  // A consolidated Hugging Face file (no DCP keys), a folder with .metadata, a non-folder: not the flavour.
  EXPECT_TRUE(safetensors_flavour_files(kData + "/t214_hfcons_w2").empty());
  EXPECT_TRUE(safetensors_flavour_files(kData + "/plain_w2").empty());
  EXPECT_TRUE(safetensors_flavour_files(kData + "/README.md").empty());
  EXPECT_TRUE(safetensors_flavour_files("/nonexistent").empty());
  const std::string dir = ucpkit::testing::scratch_dir("safetensors_flavour_detect");
  EXPECT_TRUE(safetensors_flavour_files(dir).empty());
  write_st(dir, "b.safetensors", R"({"__metadata__":{"DCP_VERSION":"1.0"}})");
  write_st(dir, "a.safetensors", R"({"__metadata__":{"DCP_SHARDING_INFO":"{}"}})");
  std::ofstream(dir + "/notes.txt") << "x";
  EXPECT_EQ(safetensors_flavour_files(dir), (std::vector<std::string>{dir + "/a.safetensors", dir + "/b.safetensors"}));
  write_st(dir, "c.safetensors", R"({"__metadata__":{"format":"pt"}})");  // one plain file: not the flavour
  EXPECT_TRUE(safetensors_flavour_files(dir).empty());
  write_st(dir, "c.safetensors", "[1]");
  EXPECT_EQ(thrown([&] { safetensors_flavour_files(dir); }),
            dir + "/c.safetensors: safetensors: header is not a JSON object");
}

TEST(SafetensorsFlavour, PlainFilesReadAsChunksAtOffsetZeroAndSizesGrowOverFiles) {
  const std::string dir = ucpkit::testing::scratch_dir("safetensors_flavour_plain");
  // No sharding info: offsets all zero (as torch reads a plain file).
  const std::string header = R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})";
  const auto plain = write_st(dir, "p.safetensors", header, 12);
  const Metadata md = read_safetensors_metadata({plain});
  ASSERT_EQ(md.entries.size(), 1u);
  EXPECT_EQ(md.entries[0].dtype, DType::BFloat16);
  EXPECT_EQ(md.entries[0].size, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*md.items[0].offset, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(md.items[0].storage.offset, 8 + header.size());
  EXPECT_FALSE(md.version);
  // Two files holding column pieces [0:2] and [2:5] of a [4, 5] tensor: the global size is the union.
  const auto a = write_st(dir, "a.safetensors",
                          R"({"__metadata__":)" + dcp_meta(R"({"x":{"saved_offsets":[0,0]}})") +
                              R"(,"x":{"dtype":"I32","shape":[4,2],"data_offsets":[0,32]}})",
                          32);
  const auto b = write_st(dir, "b.safetensors",
                          R"({"__metadata__":)" + dcp_meta(R"({"x":{"saved_offsets":[0,2]}})") +
                              R"(,"x":{"dtype":"I32","shape":[4,3],"data_offsets":[0,48]}})",
                          48);
  const Metadata two = read_safetensors_metadata({a, b});
  ASSERT_EQ(two.entries.size(), 1u);
  EXPECT_EQ(two.entries[0].size, (std::vector<int64_t>{4, 5}));
  ASSERT_EQ(two.entries[0].chunks.size(), 2u);
  EXPECT_EQ(two.entries[0].chunks[1].offsets, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(two.item_of("x", &two.entries[0].chunks[1].offsets).storage.relative_path, "b.safetensors");
}

TEST(SafetensorsFlavour, MalformedFilesAreRefusedNamingTheFile) {
  const std::string dir = ucpkit::testing::scratch_dir("safetensors_flavour_bad");
  auto refused = [&](const std::string& name, const std::string& bytes_or_header, size_t data, bool raw = false) {
    std::string path = dir + "/" + name;
    if (raw) std::ofstream(path, std::ios::binary) << bytes_or_header;
    else path = write_st(dir, name, bytes_or_header, data);
    const std::string msg = thrown([&] { read_safetensors_metadata({path}); });
    EXPECT_EQ(msg.rfind(path + ": safetensors: ", 0), 0u) << msg;
    return msg;
  };
  auto has = [](const std::string& msg, const std::string& words) {
    EXPECT_NE(msg.find(words), std::string::npos) << msg;
  };
  has(refused("short", "abc", 0, true), "shorter than its 8-byte header length");
  has(refused("long", std::string("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10), 0, true),
      "header length 255 runs past the end of the file");
  has(refused("text", "{oops", 0), "header is not JSON");
  has(refused("nodtype", R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4),
      "tensor 'w' lacks dtype, shape or data_offsets");
  has(refused("f8", R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1),
      "tensor 'w' has dtype F8_E4M3, which ucpkit has no type for");
  has(refused("negshape", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
      "'w' shape holds a non-count");
  has(refused("span", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8),
      "tensor 'w' data_offsets do not hold its shape x dtype inside the file");
  has(refused("past", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), "data_offsets do not hold");
  has(refused("nooffs",
              R"({"__metadata__":)" + dcp_meta(R"({"v":{"saved_offsets":[0]}})") +
                  R"(,"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
              4),
      "DCP_SHARDING_INFO has no saved_offsets for 'w'");
  has(refused("rank",
              R"({"__metadata__":)" + dcp_meta(R"({"w":{"saved_offsets":[0,0]}})") +
                  R"(,"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
              4),
      "'w' saved_offsets 2-d for a 1-d tensor");
  has(refused("info",
              R"({"__metadata__":{"DCP_SHARDING_INFO":"[1"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
      "DCP_SHARDING_INFO is not JSON");
  has(refused("infotype", R"({"__metadata__":{"DCP_SHARDING_INFO":7}})", 0), "DCP_SHARDING_INFO is not a string");
  // Two files disagreeing on a tensor's dtype.
  const auto f32 = write_st(dir, "d1.safetensors", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  const auto f16 = write_st(dir, "d2.safetensors", R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4);
  has(thrown([&] {
        read_safetensors_metadata({f32, f16});
      }),
      f16 + ": safetensors: tensor 'w' differs in dtype or rank from the earlier files' chunks");
  EXPECT_EQ(thrown([] { read_safetensors_metadata({}); }), "DCP safetensors flavour: no .safetensors files");
}

// A shape whose byte count wraps around 2^64 to the length of data_offsets: [2^32, 2^32] uint8 with
// data_offsets [0, 0] (accepted before the product was checked for overflow).
TEST(SafetensorsFlavour, ShapeWhoseByteCountOverflowsIsRefused) {
  const std::string dir = ucpkit::testing::scratch_dir("safetensors_flavour_overflow");
  const auto path = write_st(dir, "o.safetensors",
                             R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})");
  const std::string msg = thrown([&] { read_safetensors_metadata({path}); });
  EXPECT_NE(msg.find("data_offsets do not hold its shape x dtype"), std::string::npos) << msg;
}

TEST(SafetensorsFlavour, RawChunkChecksItsByteCount) {
  const std::vector<uint8_t> b{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
  const Tensor t = raw_chunk(b, DType::Float32, {2, 1}, "x.safetensors");
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(thrown([&] { raw_chunk(std::span<const uint8_t>(b).first(3), DType::Float32, {2}, "x.safetensors"); }),
            "x.safetensors: DCP: a raw item of 3 bytes for a chunk of 8");
  EXPECT_EQ(raw_chunk({}, DType::Int8, {0, 4}, "e").numel(), 0);
}

TEST(SafetensorsFlavour, WorldSizeIsTheHighestShardPrefix) {
  EXPECT_EQ(safetensors_world_size({"/d/shard-00001-model-00001-of-00001.safetensors",
                                    "/d/shard-00004-model-00001-of-00001.safetensors",
                                    "/d/shard-00002-model-00001-of-00001.safetensors"}),
            4);
  EXPECT_EQ(safetensors_world_size({"/d/model-00001-of-00002.safetensors"}), 1);
  EXPECT_EQ(safetensors_world_size({}), 1);
  EXPECT_EQ(safetensors_world_size({"/d/shard-x1-a.safetensors", "/d/shard-123456789-a.safetensors", "/d/shard-"}), 1);
  EXPECT_EQ(safetensors_world_size({"/shard-00003-dir/a.safetensors"}), 1);  // only the file name counts
}

}  // namespace dcp_safetensors_flavour_test
