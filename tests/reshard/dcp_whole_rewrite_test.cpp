// ucp-load of a DCP checkpoint into DCP (issue 47, reshard/dcp_rewrite.cpp): rewritten whole, through
// the tool from another working folder with relative paths, on two checkpoints torch 2.15's own dcp.save
// wrote from a training loop (tests/formats/dcp/data/README.md: t215_loop_*; scripts/frameworks/
// dcp_train_loop.py). Before issue 47 ucp-load refused both ("parameter mask has 1 states, others 3":
// the buffers have no optimizer state) and dropped every non-tensor item. Checked here with our reader:
//  * every entry is kept under its key (torchtitan's top-level model keys and flattened `optimizer.*`,
//    get_state_dict's `model.*` / `optim.*`), in its dtype (bool, int32, int64, bf16, fp32), equal bit
//    for bit; every non-tensor item (LR scheduler, dataloader, train state, param_groups) byte for byte;
//    the nested paths (planner_data) as saved;
//  * --world-size 3: FSDP2's Shard(0) over 3 ranks; no --world-size: the chunks as stored;
//  * --dtype bf16 converts the parameters (torch's rounding) and nothing else: buffers, counters and
//    optimizer states stay as stored; --plan and --dry-run describe it and write nothing.
// torch's own loader judges the same output in tests/frameworks/dcp_resume_test.sh (resume equivalence).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/reader.h"
#include "support/paths.h"
#include "support/process.h"

namespace dcp_whole_rewrite_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::dcp::Reader;

namespace {

const std::string& kData = ucpkit::testing::kDcpData;
const std::vector<std::string> kFx = {"t215_loop_torchtitan_w2", "t215_loop_gsd_bf16_w2"};

// <scratch>/work (the tool's working folder) and <scratch>/in, a copy of the fixture.
struct Case {
  std::string root, work;
};

Case case_of(const std::string& name, const std::string& fixture) {
  Case c;
  c.root = ucpkit::testing::scratch_dir("dcp_whole_" + name);
  c.work = c.root + "/work";
  fs::create_directories(c.work);
  fs::copy(kData + "/" + fixture, c.root + "/in", fs::copy_options::recursive);
  return c;
}

ucpkit::testing::SplitResult load(const Case& c, const std::string& args) {
  return ucpkit::testing::run_split_in(c.work, kBin + "/ucp-load --no-sync --input ../in --format dcp " + args, c.root);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const auto x = a.contiguous().contiguous_bytes(), y = b.contiguous().contiguous_bytes();
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size()) == 0);
}

// Every entry of `in` in `out` under the same key, kind, global shape and nested path; tensors equal
// bit for bit unless converted (then equal to the source converted), bytes items byte for byte.
void expect_same_entries(const Reader& in, const Reader& out, const std::set<std::string>& converted = {},
                         DType to = DType::BFloat16) {
  ASSERT_EQ(in.metadata().entries.size(), out.metadata().entries.size());
  ASSERT_TRUE(in.metadata().planner && out.metadata().planner);
  for (const auto& e : in.metadata().entries) {
    const auto* o = out.metadata().find(e.fqn);
    ASSERT_NE(o, nullptr) << e.fqn;
    EXPECT_EQ(o->is_bytes, e.is_bytes) << e.fqn;
    EXPECT_FALSE(in.metadata().planner->strings(e.fqn).empty()) << e.fqn;
    EXPECT_EQ(out.metadata().planner->strings(e.fqn), in.metadata().planner->strings(e.fqn)) << e.fqn;
    if (e.is_bytes) {
      EXPECT_EQ(out.read_bytes(e.fqn), in.read_bytes(e.fqn)) << e.fqn;
      continue;
    }
    EXPECT_EQ(o->size, e.size) << e.fqn;
    const Tensor want = converted.count(e.fqn) ? in.read_tensor(e.fqn).to(to) : in.read_tensor(e.fqn);
    EXPECT_TRUE(same_bits(out.read_tensor(e.fqn), want)) << e.fqn;
  }
}

}  // namespace

TEST(DcpWholeRewrite, EveryEntryKeptAtAnotherWorldSize) {
  for (const auto& fx : kFx) {
    const Case c = case_of("world3_" + fx, fx);
    const auto r = load(c, "--world-size 3 --output ../out --json");
    ASSERT_EQ(r.rc, 0) << fx << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["route"], "whole");
    EXPECT_EQ(j["target"]["mesh"], "rows");
    EXPECT_EQ(j["target"]["world"], 3);
    EXPECT_TRUE(j["converted"].empty());
    const Reader in(c.root + "/in"), out(c.root + "/out");
    EXPECT_GT(j["bytes_entries"].get<int>(), 0);
    EXPECT_EQ(j["entries"], in.metadata().entries.size());
    expect_same_entries(in, out);
    for (int rank = 0; rank < 3; ++rank) EXPECT_TRUE(fs::exists(c.root + "/out/__" + std::to_string(rank) + "_0.distcp"));
    // Shard(0) over 3 ranks: a 32-row tensor in rows of 11, 11, 10 (torch's split).
    const auto* emb = out.metadata().find(fx.find("gsd") != std::string::npos ? "model.emb.weight" : "emb.weight");
    ASSERT_NE(emb, nullptr);
    ASSERT_EQ(emb->chunks.size(), 3u);
    EXPECT_EQ(emb->chunks[2].sizes[0], 10);
  }
}

TEST(DcpWholeRewrite, WithoutAWorldSizeTheChunksStayAsStored) {
  const Case c = case_of("as_stored", kFx[0]);
  const auto r = load(c, "--output ../out");
  ASSERT_EQ(r.rc, 0) << r.err;
  const Reader in(c.root + "/in"), out(c.root + "/out");
  expect_same_entries(in, out);
  for (const auto& e : in.metadata().entries) {
    if (e.is_bytes) continue;
    const auto* o = out.metadata().find(e.fqn);
    ASSERT_EQ(o->chunks.size(), e.chunks.size()) << e.fqn;
    for (size_t k = 0; k < e.chunks.size(); ++k) {
      EXPECT_EQ(o->chunks[k].offsets, e.chunks[k].offsets) << e.fqn;
      EXPECT_EQ(o->chunks[k].sizes, e.chunks[k].sizes) << e.fqn;
    }
  }
}

TEST(DcpWholeRewrite, DtypeConvertsTheParametersOnly) {
  const Case c = case_of("dtype", kFx[0]);
  // --plan and --dry-run first: read-only.
  auto r = load(c, "--dtype bf16 --world-size 2 --output ../out --plan");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto plan = nlohmann::json::parse(r.out);
  const std::set<std::string> params = {"emb.weight", "up.weight", "up.bias", "norm.weight", "norm.bias", "out.weight", "out.bias"};
  EXPECT_EQ(plan["converted"].get<std::set<std::string>>(), params);
  EXPECT_EQ(plan["target"]["dtype"], "bf16");
  r = load(c, "--dtype bf16 --world-size 2 --output ../out --dry-run");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("7 converted by --dtype"), std::string::npos) << r.out << r.err;
  EXPECT_FALSE(fs::exists(c.root + "/out"));
  r = load(c, "--dtype bf16 --world-size 2 --output ../out");
  ASSERT_EQ(r.rc, 0) << r.err;
  const Reader in(c.root + "/in"), out(c.root + "/out");
  expect_same_entries(in, out, params, DType::BFloat16);
  for (const std::string& kept : {"norm.running_mean", "norm.running_var", "scale"})
    EXPECT_EQ(out.metadata().find(kept)->dtype, DType::Float32) << kept;
  EXPECT_EQ(out.metadata().find("norm.num_batches_tracked")->dtype, DType::Int64);
  EXPECT_EQ(out.metadata().find("position_ids")->dtype, DType::Int64);
  EXPECT_EQ(out.metadata().find("mask")->dtype, DType::Bool);
  EXPECT_EQ(out.metadata().find("optimizer.state.emb.weight.exp_avg")->dtype, DType::Float32);
}

// ucp-info names what a training loop's DCP holds besides its parameters (issue 47: it said
// "0 param_groups" and nothing of the rest). (ucp-union refused its buffers by name until the universal
// form carried them: tests/reshard/dcp_buffers_test.cpp.)
TEST(DcpWholeRewrite, UcpInfoDescribesEveryItem) {
  const Case c = case_of("info", kFx[0]);
  auto r = ucpkit::testing::run_split_in(c.work, kBin + "/ucp-info ../in --json", c.root);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto dcp = nlohmann::json::parse(r.out)["dcp"];
  EXPECT_EQ(dcp["key_layout"], "torchtitan");
  EXPECT_TRUE(dcp["flattened_optimizer"].get<bool>());
  for (const char* head : {"lr_scheduler", "dataloader", "train_state", "param_groups"})
    EXPECT_GT(dcp["non_tensor_items"].value(head, 0), 0) << head;
  EXPECT_EQ(dcp["buffers"].size(), 7u) << dcp.dump();
  r = ucpkit::testing::run_split_in(c.work, kBin + "/ucp-info ../in", c.root);
  EXPECT_NE(r.out.find("param_groups flattened per parameter"), std::string::npos) << r.out;
  const Case g = case_of("info_gsd", kFx[1]);
  r = ucpkit::testing::run_split_in(g.work, kBin + "/ucp-info ../in --json", g.root);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["dcp"]["key_layout"], "get_state_dict");
}

// Options of the universal and DeepSpeed paths mean nothing to a whole rewrite: refused by name
// (exit 2), nothing written.
TEST(DcpWholeRewrite, OptionsItDoesNotUseAreRefused) {
  const Case c = case_of("unused_options", kFx[0]);
  for (const std::string opt : {"--verify-against ../in", "--reuse-output", "--optimizer zero"}) {
    const auto r = load(c, opt + " --output ../out");
    EXPECT_EQ(r.rc, 2) << opt << ": " << r.err;
    EXPECT_NE(r.err.find(opt.substr(0, opt.find(' '))), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(c.root + "/out")) << opt;
  }
}

// Every DCP flavour the reader reads is rewritten whole (issue 48's torch 2.15 judge found rank-local and
// HuggingFaceStorageWriter saves going through the universal form, which refused an int64 buffer and
// renamed the keys model.<fqn>): the rank-local parts merged and the safetensors read, every entry kept
// under its own key, the output a plain DCP folder.
TEST(DcpWholeRewrite, RankLocalAndSafetensorsFlavoursAreRewrittenWhole) {
  for (const std::string fx : {"t214_ranklocal_w2", "t214_hf_w2"}) {
    SCOPED_TRACE(fx);
    const Case c = case_of("flavour_" + fx, fx);
    const auto r = load(c, "--world-size 1 --output ../out --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["route"], "whole");
    const formats::dcp::Folder folder = formats::dcp::find_folder(c.root + "/in");
    const Reader in(folder.dir, formats::dcp::read_folder_metadata(folder)), out(c.root + "/out");
    ASSERT_EQ(in.metadata().entries.size(), out.metadata().entries.size());
    for (const auto& e : in.metadata().entries) {
      ASSERT_NE(out.metadata().find(e.fqn), nullptr) << e.fqn;
      if (!e.is_bytes) EXPECT_TRUE(same_bits(out.read_tensor(e.fqn), in.read_tensor(e.fqn))) << e.fqn;
    }
  }
}

}  // namespace dcp_whole_rewrite_test
