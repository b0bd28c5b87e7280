// Buffers through the universal form (issue 47): a DCP whose model holds tensors without optimizer
// state beside parameters with it (t215_loop_torchtitan_w2, torch 2.15's dcp.save of a training loop:
// BatchNorm's running_mean/var, int64 num_batches_tracked and position_ids, a bool mask, a float scale,
// an int32 train_state.step). Before, ucp-union refused it ("7 model tensors have no optimizer state")
// and so did ucp-load into safetensors. Now, through the tools from another folder:
//  * ucp-union lists each buffer in manifest.json ("buffers": name, shape, its own dtype, file, crc32),
//    its tensor as stored in zero/<name>/fp32.pt, no optimizer state files;
//  * ucp-load --format dcp from that folder writes it under the key it was saved with, in its own dtype
//    (--dtype bf16 converts the parameters only), no optimizer state entries for it; --format safetensors writes it as a tensor of
//    its dtype; direct mode (the DCP itself) the same, the non-tensor items it cannot carry said on stderr
//    and listed in --json; --format torch_dist refuses the buffers by name;
//  * ucp-info lists them, ucp-diff compares them (a changed buffer value: exit 3).
// torch's own readers judge the same outputs in tests/frameworks/dcp_buffers_universal_test.sh.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/reader.h"
#include "formats/universal/manifest.h"
#include "formats/universal/state_file.h"
#include "io/torch/torch_file.h"
#include "reshard/model_info.h"
#include "reshard/universal_reader.h"
#include "support/errors.h"
#include "support/paths.h"
#include "support/process.h"
#include "to_universal/save.h"

namespace dcp_buffers_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::dcp::Reader;

namespace {

const std::map<std::string, DType> kBuffers = {
    {"mask", DType::Bool},          {"scale", DType::Float32},
    {"position_ids", DType::Int64}, {"norm.running_mean", DType::Float32},
    {"norm.running_var", DType::Float32}, {"norm.num_batches_tracked", DType::Int64},
    {"train_state.step", DType::Int32}};

// <root>/in (the fixture), <root>/work (the tools' folder), and <root>/u, its union (made once per case).
struct Case {
  std::string root, work;
  ucpkit::testing::SplitResult run(const std::string& command) const {
    return ucpkit::testing::run_split_in(work, kBin + "/" + command, root);
  }
};

Case case_of(const std::string& name, bool with_union = true) {
  Case c;
  c.root = ucpkit::testing::scratch_dir("dcp_buffers_" + name);
  c.work = c.root + "/work";
  fs::create_directories(c.work);
  fs::copy(ucpkit::testing::kDcpData + "/t215_loop_torchtitan_w2", c.root + "/in", fs::copy_options::recursive);
  if (with_union) {
    const auto r = c.run("ucp-union -q --no-sync --input ../in --output ../u");
    EXPECT_EQ(r.rc, 0) << r.err;
  }
  return c;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const auto x = a.contiguous().contiguous_bytes(), y = b.contiguous().contiguous_bytes();
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size()) == 0);
}

// The input's tensor of a model key (torchtitan's: the fqn at the top level).
Tensor input_tensor(const Case& c, const std::string& fqn) {
  const formats::dcp::Folder folder = formats::dcp::find_folder(c.root + "/in");
  const Reader in(folder.dir, formats::dcp::read_folder_metadata(folder));
  return in.read_tensor(fqn);
}

// Name -> (safetensors dtype, tensor bytes) of one .safetensors file.
std::map<std::string, std::pair<std::string, std::string>> safetensors_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t h = 0;
  for (int b = 0; b < 8; ++b) h |= static_cast<uint64_t>(static_cast<uint8_t>(raw.at(b))) << (8 * b);
  const auto header = nlohmann::json::parse(raw.substr(8, h));
  std::map<std::string, std::pair<std::string, std::string>> out;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    const uint64_t a = e["data_offsets"][0], b = e["data_offsets"][1];
    out[name] = {e["dtype"].get<std::string>(), raw.substr(8 + h + a, b - a)};
  }
  return out;
}

std::string bytes_of(const Tensor& t) {
  const auto b = t.contiguous().contiguous_bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace

TEST(DcpBuffers, UnionCarriesEachBufferInItsOwnDtype) {
  const Case c = case_of("union", false);
  const auto r = c.run("ucp-union -q --no-sync --input ../in --output ../u --json");
  ASSERT_EQ(r.rc, 0) << r.err;  // before: exit 1, "7 model tensors have no optimizer state"
  const auto summary = nlohmann::json::parse(r.out);
  EXPECT_EQ(summary["buffers"], 7);
  EXPECT_TRUE(summary["not_carried"].empty()) << summary.dump();
  EXPECT_EQ(summary["items"], 94);  // LR scheduler, dataloader, train_state bytes, param_groups: carried (issue 47)
  const auto m = formats::universal::read_universal_manifest(c.root + "/u/manifest.json");
  ASSERT_EQ(m.buffers.size(), kBuffers.size());
  for (const auto& b : m.buffers) {
    SCOPED_TRACE(b.name);
    ASSERT_TRUE(kBuffers.count(b.name));
    EXPECT_EQ(b.dtype, dtype_name(kBuffers.at(b.name)));
    EXPECT_EQ(b.tensor.file, "zero/" + b.name + "/fp32.pt");
    const std::string path = c.root + "/u/" + b.tensor.file;
    const Tensor t = formats::universal::read_state_file(load_torch(path), path).param;
    EXPECT_TRUE(same_bits(t, input_tensor(c, b.name)));
    EXPECT_EQ(to_universal::tensor_crc32(t), b.tensor.crc32.value_or(0));
    EXPECT_EQ(std::distance(fs::directory_iterator(fs::path(path).parent_path()), fs::directory_iterator()), 1);
  }
  for (const auto& p : m.params) EXPECT_FALSE(kBuffers.count(p.name)) << p.name;
  EXPECT_EQ(m.params.size(), 7u);
}

TEST(DcpBuffers, DcpOutputKeepsBuffersInTheirDtypeWhateverDtypeSays) {
  const Case c = case_of("dcp");
  auto r = c.run("ucp-load -q --no-sync --input ../u --format dcp --world-size 3 --dtype bf16 --output ../out --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["buffers"], 7);
  EXPECT_NE(j.value("route", ""), "whole");
  const Reader out(c.root + "/out");
  for (const auto& [name, dtype] : kBuffers) {
    SCOPED_TRACE(name);
    const auto* e = out.metadata().find(name);  // torchtitan's key, as saved (issue 47)
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, dtype);
    EXPECT_TRUE(same_bits(out.read_tensor(name), input_tensor(c, name)));
    for (const auto& x : out.metadata().entries) EXPECT_EQ(x.fqn.find("optimizer.state." + name + "."), std::string::npos);
  }
  // The parameters are converted (--dtype bf16), their optimizer states stay fp32.
  EXPECT_EQ(out.metadata().find("emb.weight")->dtype, DType::BFloat16);
  EXPECT_EQ(out.metadata().find("optimizer.state.emb.weight.exp_avg")->dtype, DType::Float32);
}

TEST(DcpBuffers, SafetensorsFromTheUniversalFolderAndDirectly) {
  const Case c = case_of("safetensors");
  for (const std::string input : {"../u", "../in"}) {
    SCOPED_TRACE(input);
    const std::string out = input == "../u" ? "../st_u" : "../st_in";
    const auto r = c.run("ucp-load --no-sync --input " + input + " --format safetensors --output " + out + " --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["buffers"], 7);
    if (input == "../in") {  // direct mode: what the universal form cannot carry, said and listed
      ASSERT_FALSE(j["not_carried"].empty());
      EXPECT_NE(r.err.find("are not carried"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(j["not_carried"][0].get<std::string>()), std::string::npos) << r.err;
    }
    const auto st = safetensors_of(fs::path(c.work) / out / "model.safetensors");
    EXPECT_EQ(st.size(), 14u);
    const std::map<DType, std::string> names = {{DType::Bool, "BOOL"}, {DType::Int64, "I64"}, {DType::Int32, "I32"},
                                                {DType::Float32, "F32"}};
    for (const auto& [name, dtype] : kBuffers) {
      ASSERT_TRUE(st.count(name)) << name;
      EXPECT_EQ(st.at(name).first, names.at(dtype)) << name;
      EXPECT_EQ(st.at(name).second, bytes_of(input_tensor(c, name))) << name;
    }
  }
}

TEST(DcpBuffers, TorchDistRefusesBuffersByName) {
  const Case c = case_of("torch_dist");
  const auto r = c.run("ucp-load -q --no-sync --input ../u --format torch_dist --output ../out");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("7 buffers ('mask', 'scale', 'position_ids', 'norm.running_mean', ...)"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(c.root + "/out"));
}

TEST(DcpBuffers, InfoListsAndDiffComparesBuffers) {
  const Case c = case_of("info_diff");
  auto r = c.run("ucp-info --json ../u");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto info = nlohmann::json::parse(r.out);
  ASSERT_EQ(info["buffers"].size(), 7u) << info.dump();
  EXPECT_EQ(info["buffers"][0]["name"], "mask");
  EXPECT_EQ(info["buffers"][0]["dtype"], "bool");
  r = c.run("ucp-info ../u");
  EXPECT_NE(r.out.find("7 tensors without optimizer state, each in its own dtype: mask bool"), std::string::npos) << r.out;
  fs::copy(c.root + "/u", c.root + "/v", fs::copy_options::recursive);
  r = c.run("ucp-diff ../u ../v");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  // One step of num_batches_tracked more, its crc32 recorded: a difference of a buffer only.
  auto m = formats::universal::read_universal_manifest(c.root + "/v/manifest.json");
  for (auto& b : m.buffers) {
    if (b.name != "norm.num_batches_tracked") continue;
    const std::string path = c.root + "/v/" + b.tensor.file;
    formats::universal::StateFile f;
    f.param = formats::universal::read_state_file(load_torch(path), path).param.contiguous(true);
    int64_t n;
    std::memcpy(&n, f.param.contiguous_bytes().data(), 8);
    ++n;
    f.param = Tensor::from_bytes(DType::Int64, f.param.shape(),
                                 std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&n), reinterpret_cast<uint8_t*>(&n) + 8));
    save_torch_file(path, formats::universal::to_pickle(f));
    b.tensor.crc32 = to_universal::tensor_crc32(f.param);
  }
  std::ofstream(c.root + "/v/manifest.json") << m.text();
  r = c.run("ucp-diff --json ../u ../v");
  EXPECT_EQ(r.rc, 3) << r.out << r.err;
  const auto d = nlohmann::json::parse(r.out);
  ASSERT_EQ(d["listed"].size(), 1u) << d.dump();
  EXPECT_EQ(d["listed"][0]["param"], "norm.num_batches_tracked");
  EXPECT_EQ(d["listed"][0]["kind"], "values");
}

// A damaged buffer is refused naming the file (reshard/model_info buffers_of, universal_reader
// read_buffer): an unknown dtype in manifest.json, a file outside the folder or missing, a tensor that
// is not what the manifest says, a checksum that does not match.
TEST(DcpBuffers, DamagedBufferIsRefusedNamingTheFile) {
  const Case c = case_of("damaged");
  const std::string u = c.root + "/u";
  const auto good = formats::universal::read_universal_manifest(u + "/manifest.json");
  const reshard::ModelInfo m = reshard::read_model_info(u);
  ASSERT_EQ(m.buffers.size(), 7u);
  EXPECT_TRUE(same_bits(reshard::read_buffer(u, m.buffers[0], true), input_tensor(c, "mask")));
  auto refused = [&](const std::function<void(formats::universal::UniversalManifest&)>& change, const std::string& want) {
    auto bad = good;
    change(bad);
    std::ofstream(u + "/manifest.json") << bad.text();
    const std::string msg = ucpkit::testing::error_of([&] {
      const reshard::ModelInfo mi = reshard::read_model_info(u);
      for (const auto& b : mi.buffers) (void)reshard::read_buffer(u, b, true);
    });
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  refused([](auto& x) { x.buffers[1].dtype = "int65"; }, "manifest.json: buffer scale has the unknown dtype int65");
  refused([](auto& x) { x.buffers[1].tensor.file = "../in/.metadata"; }, "manifest.json: buffer scale file '../in/.metadata'");
  refused([](auto& x) { x.buffers[1].tensor.file = "zero/gone.pt"; }, "zero/gone.pt: missing");
  refused([](auto& x) { x.buffers[1].dtype = "float16"; }, "zero/scale/fp32.pt: buffer is float32 but manifest.json says float16");
  refused([](auto& x) { x.buffers[1].shape = {3, 4}; }, "zero/scale/fp32.pt: buffer has shape [12] but manifest.json says [3,4]");
  refused([](auto& x) { *x.buffers[1].tensor.crc32 ^= 1; }, "zero/scale/fp32.pt: checksum mismatch");
  // ucp-info says so in its checksums check (exit 1), ucp-load refuses (exit 1, nothing written).
  auto r = c.run("ucp-info ../u");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("checksums: failed"), std::string::npos) << r.out;
  r = c.run("ucp-load -q --no-sync --input ../u --format safetensors --output ../st");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(c.root + "/st"));
}

}  // namespace dcp_buffers_test
