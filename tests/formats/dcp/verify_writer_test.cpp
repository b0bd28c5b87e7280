// The writer's side of scripts/verify/dcp_verify.sh (outside CI): with UCPKIT_DCP_VERIFY_OUT=<folder> set,
// writes our DCP output for every committed fixture with a truth (whole tensors; rows and columns for
// 2 ranks; rows and a 2x2 grid for 4 ranks) and the merged rank-local save, plus cases.tsv
// (folder, fixture, world size it was written for), for the real torch 2.6 dcp.load to check.
// Without the variable it only checks that the case list names existing fixtures.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/merge.h"
#include "formats/dcp/rewrite.h"

namespace dcp_verify_writer_test {

namespace fs = std::filesystem;
using namespace ucpkit::formats::dcp;

namespace {

const std::vector<std::string> kFixtures = {"fsdp_w2",  "twod_w4",        "fsdp_optim_w2", "fsdp_tp_optim_w4",
                                            "plain_w2", "single_item_w1", "torch113_w2"};

struct Case {
  std::string name;
  Target target;
  int64_t world;
};

const std::vector<Case> kTargets = {{"whole", Target::whole(), 1},
                                    {"rows2", Target::rows(2), 2},
                                    {"cols2", Target::columns(2), 2},
                                    {"rows4", Target::rows(4), 4},
                                    {"grid4", Target::grid(4, 2), 4}};

}  // namespace

TEST(DcpVerifyWriter, WritesOurOutputForRealTorch) {
  const std::string& data = ucpkit::testing::kDcpData;
  for (const auto& f : kFixtures) EXPECT_TRUE(fs::exists(data + "/" + f + "/.metadata")) << f;
  const char* env = std::getenv("UCPKIT_DCP_VERIFY_OUT");
  if (!env || !*env) GTEST_SKIP() << "UCPKIT_DCP_VERIFY_OUT not set (scripts/verify/dcp_verify.sh sets it)";
  const std::string out = env;
  fs::create_directories(out);
  std::ofstream cases(out + "/cases.tsv");
  for (const auto& f : kFixtures)
    for (const auto& c : kTargets) {
      const std::string name = f + "__" + c.name;
      fs::remove_all(out + "/" + name);
      rewrite_dcp(data + "/" + f, out + "/" + name, c.target);
      cases << name << "\t" << f << "\t" << c.world << "\n";
    }
  const std::string merged = "ranklocal_w2__merged";
  fs::remove_all(out + "/" + merged);
  merge_rank_local(rank_local_parts(data + "/ranklocal_w2"), out + "/" + merged);
  cases << merged << "\tranklocal_w2\t2\n";
}

// Writer throughput (outside CI): with UCPKIT_DCP_BENCH_DIR=<folder> set, writes 16 float32 tensors
// of 128 MiB (2 GiB) for 4 ranks by rows and as whole tensors there and prints the times; run it
// under /usr/bin/time -v for the peak RSS (docs/formats-dcp.md, "Writing").
TEST(DcpVerifyWriter, Throughput) {
  const char* env = std::getenv("UCPKIT_DCP_BENCH_DIR");
  if (!env || !*env) GTEST_SKIP() << "UCPKIT_DCP_BENCH_DIR not set";
  std::vector<Entry> entries;
  for (int i = 0; i < 16; ++i) entries.push_back({"layers." + std::to_string(i) + ".w", false, ucpkit::DType::Float32, {128 * 1024, 256}, {}});
  auto values = [](const Entry& e) {
    ucpkit::Tensor t = ucpkit::Tensor::zeros(e.dtype, e.size);
    auto b = t.storage()->mutable_bytes();
    for (size_t k = 0; k < b.size(); k += 4096) b[k] = static_cast<uint8_t>(k >> 12);
    return t;
  };
  for (const auto& [name, target] : {std::pair{"rows4", Target::rows(4)}, std::pair{"whole", Target::whole()}}) {
    WriteOptions o;
    o.overwrite = true;
    const auto t0 = std::chrono::steady_clock::now();
    const WriteResult r = write_dcp(make_save_plan(entries, target), chunks_of_whole(values, {}), std::string(env) + "/" + name, o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %.2f GiB in %.2f s (%.0f MiB/s), %zu items\n", name, r.bytes / 1073741824.0, s,
                r.bytes / 1048576.0 / s, r.storage.size());
    EXPECT_EQ(r.storage.size(), target.kind == Target::Kind::Whole ? 16u : 64u);
  }
}

}  // namespace dcp_verify_writer_test
