// lib/reshard/deepspeed_output, ucp-load --format deepspeed's OutputWriter (reached through the registry, as
// run_load and plan_json reach it), on the GPT fixture (universal folder and its DeepSpeed source) for
// TP 2 DP 3 ZeRO-1 bf16: what it refuses to write, the folder it lays down (`latest`, layout record),
// files mode and exchange mode writing the same bytes, --plan's exchange and direct-mode sections
// (every byte of every target record accounted for: copied from a source byte range, or zeros).
#include <gtest/gtest.h>

#include <functional>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "reshard/layout_record.h"
#include "reshard/load.h"
#include "reshard/output_writer.h"
#include "reshard/universal_fixture.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace deepspeed_output_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

namespace {

using loadtest::gpt_options;

std::string universal() { return loadtest::gpt_case().universal.string(); }
std::string native() { return loadtest::gpt_case().src.string(); }
std::string scratch(const std::string& name) { return ucpkit::testing::scratch_dir("deepspeed_output_" + name); }

std::string error_of(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

// The 8 files DeepSpeed writes for TP 2 DP 3 ZeRO-1 bf16 (dsgen's reference checkpoint of the layout).
std::set<std::string> reference_files() {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(loadtest::gpt_case().ref / "global_step100"))
    s.insert(e.path().filename().string());
  return s;
}

}  // namespace

TEST(DeepSpeedOutput, RegisteredWithTheOptionsOnlyDeepSpeedTakes) {
  const OutputWriter& w = output_writer(OutputFormat::DeepSpeed);
  EXPECT_TRUE(w.reads_model());
  EXPECT_TRUE(w.takes_template());
  EXPECT_TRUE(w.takes_exchange());
  EXPECT_TRUE(w.needs_model_files());
  EXPECT_TRUE(w.writes_file_jobs());
  EXPECT_FALSE(w.one_process());
}

TEST(DeepSpeedOutput, AFolderWithoutModelFilesIsRefusedNamingTheWayOut) {
  ModelInfo m;
  m.manifest_only = true;
  const LoadOptions o = gpt_options("/in", "/out");
  const std::string msg = error_of([&] { output_writer(OutputFormat::DeepSpeed).check_model(o, m); });
  EXPECT_NE(msg.find("/in/manifest.json: no DeepSpeed model files"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--to-names megatron-deepspeed"), std::string::npos) << msg;
}

TEST(DeepSpeedOutput, BuffersBesideModelFilesAreRefusedNotDropped) {
  ModelInfo m;
  formats::universal::UniversalBuffer b;
  b.name = "layers.0.attn.bias_mask";
  m.buffers.push_back(b);
  const std::string msg = error_of(
      [&] { output_writer(OutputFormat::DeepSpeed).check_model(gpt_options("/in", "/out"), m); });
  EXPECT_NE(msg.find("layers.0.attn.bias_mask"), std::string::npos) << msg;
  EXPECT_NE(msg.find("beside DeepSpeed model files"), std::string::npos) << msg;
  EXPECT_NO_THROW(output_writer(OutputFormat::DeepSpeed).check_model(gpt_options("/in", "/out"), ModelInfo{}));
}

TEST(DeepSpeedOutput, FilesModeWritesLatestTheLayoutRecordAndDeepSpeedsFiles) {
  const std::string out = scratch("files") + "/out";
  const LoadSummary s = run_load(gpt_options(universal(), out));
  EXPECT_EQ(ucpkit::testing::file_bytes(out + "/latest"), "global_step100");
  std::set<std::string> got;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "global_step100"))
    got.insert(e.path().filename().string());
  EXPECT_EQ(got, reference_files());
  EXPECT_EQ(s.files_written, got.size());
  // The layout record: what was written, read back as the summary's target.
  const auto record = read_layout_record(out);
  ASSERT_TRUE(record);
  EXPECT_EQ(s.target, *record);
  EXPECT_EQ(ucpkit::testing::file_bytes(out + "/" + kLayoutRecordName), record->dump(1) + "\n");
  EXPECT_FALSE(s.exchange);
  EXPECT_TRUE(s.phase_seconds.empty());
}

TEST(DeepSpeedOutput, ExchangeModeWritesTheSameBytesAsFilesMode) {
  const std::string files = scratch("mode_files") + "/out", exchange = scratch("mode_exchange") + "/out";
  (void)run_load(gpt_options(universal(), files));
  LoadOptions o = gpt_options(universal(), exchange);
  o.exchange = ExchangeMode::Exchange;
  o.batch_bytes = 8192;  // many batches
  const LoadSummary s = run_load(o);
  EXPECT_TRUE(s.exchange);
  EXPECT_GT(s.batches, 5u);
  for (const char* phase : {"read", "pack", "alltoall", "fill", "finish"}) EXPECT_TRUE(s.phase_seconds.contains(phase));
  EXPECT_DOUBLE_EQ(s.fill_balance, 1.0);  // one rank
  EXPECT_EQ(s.files_written, reference_files().size());
  EXPECT_TRUE(ucpkit::testing::tree_bytes(files) == ucpkit::testing::tree_bytes(exchange));
}

TEST(DeepSpeedOutput, PlanHasTheExchangeWhenItWouldBeUsed) {
  LoadOptions o = gpt_options(universal(), "/nowhere");
  EXPECT_FALSE(plan_json(o).contains("exchange"));  // one rank: files mode
  o.exchange = ExchangeMode::Exchange;
  const nlohmann::json j = plan_json(o);
  EXPECT_TRUE(j.contains("record"));
  EXPECT_TRUE(j.contains("load"));
  ASSERT_TRUE(j.contains("exchange"));
  const auto& files = j["exchange"]["files"];
  ASSERT_EQ(files.size(), reference_files().size());
  for (const auto& f : files) {
    EXPECT_EQ(f["rank"], 0);
    EXPECT_EQ(fs::path(f["file"].get<std::string>()).parent_path().filename(), "global_step100");
  }
  EXPECT_FALSE(j.contains("direct"));
}

TEST(DeepSpeedOutput, DirectPlanAccountsForEveryTargetByte) {
  const nlohmann::json j = plan_json(gpt_options(native(), "/nowhere"));
  ASSERT_TRUE(j.contains("direct"));
  const auto& d = j["direct"];
  const auto& t = d["totals"];
  ASSERT_EQ(d["targets"].size(), reference_files().size());
  EXPECT_EQ(t["target_files"], reference_files().size());
  uint64_t record_bytes = 0, copied_target = 0, copied_source = 0;
  for (const auto& f : d["targets"]) {
    std::map<std::string, std::pair<std::string, uint64_t>> records;
    for (const auto& [name, r] : f["records"].items()) {
      records[name] = {r["dtype"], r["bytes"]};
      record_bytes += r["bytes"].get<uint64_t>();
    }
    for (const auto& c : f["copies"]) {
      const int file = c[0];
      ASSERT_GE(file, 0);  // a TP 1 source: every parameter lies in one byte range, nothing joined
      ASSERT_LT(file, static_cast<int>(d["source_files"].size()));
      const auto& [dtype, bytes] = records.at(c[3].get<std::string>());
      const uint64_t es = dtype == "float32" ? 4 : 2;
      EXPECT_EQ(c[2].get<uint64_t>() / 4 * es, c[5].get<uint64_t>());  // fp32 source elements, converted
      EXPECT_LE(c[4].get<uint64_t>() + c[5].get<uint64_t>(), bytes);
      copied_source += c[2].get<uint64_t>();
      copied_target += c[5].get<uint64_t>();
    }
  }
  EXPECT_EQ(t["copied_source_bytes"], copied_source);
  EXPECT_EQ(t["copied_target_bytes"], copied_target);
  EXPECT_EQ(t["joined_target_bytes"], 0);
  // Vocabulary rows 100..111 (padded to a multiple of 8 x TP 2) and partition padding are zeros.
  EXPECT_GT(t["zero_target_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(copied_target + t["zero_target_bytes"].get<uint64_t>(), record_bytes);
}

}  // namespace deepspeed_output_test
