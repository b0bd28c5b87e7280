// A training loop's whole DCP through the universal form (issue 47), through the tools from another
// folder with relative paths, on torch 2.15's dcp.save of scripts/frameworks/dcp_train_loop.py
// (tests/formats/dcp/data: t215_loop_torchtitan_w2 in torchtitan's keys, fp32; t215_loop_gsd_bf16_w2
// in get_state_dict's, the whole model bf16):
//  * ucp-union carries every entry: the bytes entries (LR scheduler, dataloader position, train_state
//    bytes, torchtitan's flattened param_groups) verbatim in items/, the keys it was saved under, bf16
//    tensors widened (exact) with their dtype recorded; nothing "not carried", nothing said about it;
//  * ucp-load --format dcp --world-size 3 of that folder writes back exactly the source's keys (no
//    other), each tensor bit for bit in its own dtype (bf16 by default for a bf16 save), each bytes
//    item's value equal; --dtype fp32 changes the parameters only;
//  * --format safetensors says by default what it cannot carry (the items) and lists it in --json;
//  * a damaged item is refused naming its file, nothing written; ucp-diff compares items (exit 3).
// torch 2.15 itself judges the same route in tests/frameworks/dcp_universal_resume_test.sh.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/reader.h"
#include "formats/universal/manifest.h"
#include "support/paths.h"
#include "support/process.h"

namespace dcp_universal_items_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::dcp::Reader;

namespace {

struct Case {
  std::string root, work;
  ucpkit::testing::SplitResult run(const std::string& command) const {
    return ucpkit::testing::run_split_in(work, kBin + "/" + command, root);
  }
};

// <root>/in: a copy of `fixture`; <root>/u: its union (checked to succeed).
Case case_of(const std::string& name, const std::string& fixture) {
  Case c;
  c.root = ucpkit::testing::scratch_dir("dcp_items_" + name);
  c.work = c.root + "/work";
  fs::create_directories(c.work);
  fs::copy(ucpkit::testing::kDcpData + "/" + fixture, c.root + "/in", fs::copy_options::recursive);
  const auto r = c.run("ucp-union --no-sync --input ../in --output ../u --json");
  EXPECT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["not_carried"].empty()) << r.out;
  EXPECT_EQ(r.err.find("not carried"), std::string::npos) << r.err;
  return c;
}

std::unique_ptr<Reader> open_dcp(const std::string& dir) {
  const formats::dcp::Folder folder = formats::dcp::find_folder(dir);
  return std::make_unique<Reader>(folder.dir, formats::dcp::read_folder_metadata(folder));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const auto x = a.contiguous().contiguous_bytes(), y = b.contiguous().contiguous_bytes();
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size()) == 0);
}

// Every entry of `in` is in `out` under the same key and no other: tensors bit for bit in their dtype
// (`params_as`: the parameters' dtype asked for, else as stored), bytes entries of equal value.
void expect_same_entries(const Reader& in, const Reader& out, const std::set<std::string>& converted = {},
                         DType params_as = DType::Float32) {
  std::set<std::string> want, got;
  for (const auto& e : in.metadata().entries) want.insert(e.fqn);
  for (const auto& e : out.metadata().entries) got.insert(e.fqn);
  ASSERT_EQ(got, want);
  for (const auto& e : in.metadata().entries) {
    SCOPED_TRACE(e.fqn);
    if (e.is_bytes) {
      EXPECT_EQ(out.read_object(e.fqn)->repr(8), in.read_object(e.fqn)->repr(8));
    } else if (converted.count(e.fqn)) {
      EXPECT_EQ(out.metadata().find(e.fqn)->dtype, params_as);
      EXPECT_TRUE(same_bits(out.read_tensor(e.fqn), in.read_tensor(e.fqn).to(params_as)));
    } else {
      EXPECT_TRUE(same_bits(out.read_tensor(e.fqn), in.read_tensor(e.fqn)));
    }
  }
}

}  // namespace

TEST(DcpUniversalItems, TorchtitansWholeSaveComesBackUnderItsKeys) {
  const Case c = case_of("titan", "t215_loop_torchtitan_w2");
  const auto m = formats::universal::read_universal_manifest(c.root + "/u/manifest.json");
  EXPECT_EQ(m.items.size(), 94u);
  EXPECT_EQ(m.source.facts["dcp"]["layout"], "torchtitan");
  const auto r = c.run("ucp-load -q --no-sync --input ../u --format dcp --world-size 3 --output ../out --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["items"], 94);
  EXPECT_TRUE(j["not_carried"].empty());
  const auto in = open_dcp(c.root + "/in"), out = open_dcp(c.root + "/out");
  expect_same_entries(*in, *out);
  for (const auto& e : out->metadata().entries)  // items verbatim: the same bytes
    if (e.is_bytes) EXPECT_EQ(out->read_bytes(e.fqn), in->read_bytes(e.fqn)) << e.fqn;
}

TEST(DcpUniversalItems, Bf16SaveComesBackBf16AndDtypeChangesParametersOnly) {
  const Case c = case_of("bf16", "t215_loop_gsd_bf16_w2");
  const auto m = formats::universal::read_universal_manifest(c.root + "/u/manifest.json");
  EXPECT_EQ(m.params.at(0).dtype, "bfloat16");
  EXPECT_EQ(m.params.at(0).states.at("fp32").source_dtype, "bfloat16");
  EXPECT_EQ(m.params.at(0).states.at("exp_avg").source_dtype, "bfloat16");
  auto r = c.run("ucp-load -q --no-sync --input ../u --format dcp --world-size 3 --output ../out --json");
  ASSERT_EQ(r.rc, 0) << r.err;  // before: "state tensor is bfloat16, not float32"
  EXPECT_EQ(nlohmann::json::parse(r.out)["target"]["dtype"], "bf16");
  const auto in = open_dcp(c.root + "/in");
  expect_same_entries(*in, *open_dcp(c.root + "/out"));
  r = c.run("ucp-load -q --no-sync --input ../u --format dcp --dtype fp32 --output ../out32");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::set<std::string> params;
  for (const auto& p : m.params) params.insert("model." + p.name);
  expect_same_entries(*in, *open_dcp(c.root + "/out32"), params, DType::Float32);
  // safetensors of the bf16 universal folder: bf16 parameters by default
  r = c.run("ucp-load --no-sync --input ../u --format safetensors --output ../st --json");
  ASSERT_EQ(r.rc, 0) << r.err;
}

TEST(DcpUniversalItems, OtherFormatsSayWhatTheyDoNotCarry) {
  const Case c = case_of("st", "t215_loop_torchtitan_w2");
  const auto r = c.run("ucp-load --no-sync --input ../u --format safetensors --output ../st --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["not_carried"].size(), 94u);
  EXPECT_NE(r.err.find("94 non-tensor DCP entries ('"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("are not carried into --format safetensors"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(c.root + "/u"), std::string::npos) << r.err;
}

TEST(DcpUniversalItems, DamagedItemIsRefusedAndDiffComparesItems) {
  const Case c = case_of("damaged", "t215_loop_torchtitan_w2");
  fs::copy(c.root + "/u", c.root + "/v", fs::copy_options::recursive);
  auto r = c.run("ucp-diff ../u ../v");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  const auto m = formats::universal::read_universal_manifest(c.root + "/v/manifest.json");
  const auto& item = m.items.at(0);
  { std::ofstream(c.root + "/v/" + item.file.file, std::ios::binary | std::ios::app) << "x"; }
  r = c.run("ucp-load -q --no-sync --input ../v --format dcp --output ../out");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("v/" + item.file.file + ": checksum mismatch (item " + item.key + ")"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(c.root + "/out"));
  r = c.run("ucp-info ../v");
  EXPECT_EQ(r.rc, 1) << r.out;
  // The same item with another value and its crc32 recorded: a difference of that item only.
  fs::remove_all(c.root + "/v");
  fs::copy(c.root + "/u", c.root + "/v", fs::copy_options::recursive);
  auto changed = m;
  changed.items[0].file = changed.items[1].file;  // another item's bytes under this key
  std::ofstream(c.root + "/v/manifest.json") << changed.text();
  r = c.run("ucp-diff --json ../u ../v");
  EXPECT_EQ(r.rc, 3) << r.out << r.err;
  const auto d = nlohmann::json::parse(r.out);
  ASSERT_EQ(d["listed"].size(), 1u) << d.dump();
  EXPECT_EQ(d["listed"][0]["param"], item.key);
}

}  // namespace dcp_universal_items_test
