// ucp-load --device cuda against the CPU path: the partition materialized in GPU memory must hold
// exactly the bytes the CPU path writes into that rank's ZeRO file. Skipped (with the reason) on a
// machine without a usable GPU; CI has none, the lent GPU machine runs it (docs/ucp-load.md).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/crc32.h"
#include "io/pickle/value.h"
#include "io/torch/torch_file.h"
#include "support/paths.h"
#include <fstream>

namespace device_test {

namespace fs = std::filesystem;
using ucpkit::pickle::Kind;
using ucpkit::pickle::ValuePtr;

namespace {

int run(const std::string& cmd, std::string* out, bool merge_stderr = true) {
  FILE* p = popen((cmd + (merge_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (!p) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  const int st = pclose(p);
  *out = text;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// CRC-32 of a tensor's bytes followed by zeros up to `bytes` (DeepSpeedZeroOptimizer stores the fp32
// partition without its padding; the device holds the whole padded partition, padding zero).
uint32_t crc_padded(const ucpkit::Tensor& t, uint64_t bytes) {
  const auto data = t.contiguous_bytes();
  uint32_t c = ucpkit::crc32_update(0, data);
  const std::vector<uint8_t> zeros(bytes > data.size() ? bytes - data.size() : 0, 0);
  return ucpkit::crc32_update(c, zeros);
}

ValuePtr state_entry(const ValuePtr& state, int64_t g) {
  for (const auto& [k, v] : state->entries)
    if (k->kind == Kind::Int && k->as_int() == g) return v;
  return nullptr;
}

nlohmann::json first_case() {
  std::ifstream in(fs::path(kFx) / "cases.json");
  nlohmann::json j;
  in >> j;
  return j.at(0);
}

fs::path find_file(const fs::path& dir, const std::string& name) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename() == name) return e.path();
  return {};
}

}  // namespace

TEST(LoadDevice, PartitionOnGpuEqualsCpuFiles) {
  const fs::path d = fs::temp_directory_path() / ("ucpkit_device_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::string out;
  const auto c = first_case();
  const fs::path src = fs::path(kFx) / c["name"].get<std::string>() / "src";
  ASSERT_EQ(run(kBin + "/ucp-union -q --input " + src.string() + " --output " + (d / "u").string(), &out), 0) << out;
  const std::string common = " --input " + (d / "u").string() + " --tp 1 --pp 1 --dp 2 --zero-stage 1";
  int rc = run(kBin + "/ucp-load --device cuda --dp-rank 0 --json" + common, &out);
  if (rc != 0 && out.find("no GPU") != std::string::npos) GTEST_SKIP() << "no usable GPU: " << out;
  ASSERT_EQ(run(kBin + "/ucp-load -q --dtype bf16 --output " + (d / "cpu").string() + common, &out), 0) << out;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(run(kBin + "/ucp-load --device cuda -q --json --dp-rank " + std::to_string(r) + common, &out, false), 0)
        << out;
    const auto j = nlohmann::json::parse(out);
    const auto crcs = j.at("partition_crc32").get<std::vector<uint32_t>>();
    const fs::path f = find_file(d / "cpu", "bf16_zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt");
    ASSERT_FALSE(f.empty()) << "no ZeRO file of rank " << r << " under " << d / "cpu";
    const auto osd = ucpkit::load_torch(f.string())->at("optimizer_state_dict");
    const auto& flats = osd->at("single_partition_of_fp32_groups")->items;
    const auto& state = osd->at("base_optimizer_state")->at("state");
    ASSERT_EQ(crcs.size(), flats.size() * 3) << f;
    for (size_t g = 0; g < flats.size(); ++g) {
      const auto st = state_entry(state, static_cast<int64_t>(g));
      ASSERT_TRUE(st) << f << " group " << g;
      const uint64_t part = st->at("exp_avg")->as_tensor().nbytes();
      EXPECT_EQ(crcs[3 * g], crc_padded(flats[g]->as_tensor(), part)) << f << " group " << g << " fp32";
      EXPECT_EQ(crcs[3 * g + 1], crc_padded(st->at("exp_avg")->as_tensor(), part)) << f << " group " << g;
      EXPECT_EQ(crcs[3 * g + 2], crc_padded(st->at("exp_avg_sq")->as_tensor(), part)) << f << " group " << g;
    }
  }
  fs::remove_all(d);
}

}  // namespace device_test
