// lib/reshard/exchange, run_exchange executed on one rank (exchange_plan_test checks the plan itself):
// the GPT fixture's universal checkpoint laid out for TP 2 DP 3 ZeRO-1 bf16 by DeepSpeedWriter, then
// written by the exchange (owners read, pieces filled out of order into DeferredTorchFiles) and compared
// byte for byte with the same files saved in order by save_file (files mode's writer, whose values
// deepspeed_writer_test checks against dsgen's truth), in one batch and in many; its statistics; a
// checksum that does not match the manifest; plans made for other ranks or other files.
#include <gtest/gtest.h>

#include <functional>

#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "parallel/mpi_session.h"
#include "reshard/deepspeed_writer.h"
#include "reshard/exchange.h"
#include "reshard/exchange_plan.h"
#include "reshard/load_plan.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"
#include "reshard/universal_fixture.h"
#include "reshard/universal_reader.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace exchange_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

namespace {

// The fixture's universal folder (or a copy of it) read for the GPT case's target layout.
struct Target {
  std::string universal;
  ModelInfo model;
  UcpInfo plan;
  std::unique_ptr<UniversalReader> reader;
  std::unique_ptr<DeepSpeedWriter> writer;

  explicit Target(const std::string& dir) : universal(dir) {
    model = read_model_info(dir);
    model.vocab_multiple = 8;  // tests/reshard/cases.py target_args
    TargetLayout t;
    t.tp = 2;
    t.dp = 3;
    t.zero_stage = 1;
    t.dtype = DType::BFloat16;
    plan = ucp_info(model, t);
    reader = std::make_unique<UniversalReader>(model, dir, /*verify=*/true);
    writer = std::make_unique<DeepSpeedWriter>(model, plan, *reader, load_torch(dir + "/zero/optimizer_state.pt"));
  }
  // Every target file laid out under `out` (nothing written), sorted by path as the driver sorts them.
  std::vector<LaidOutFile> lay_out(const std::string& out) const {
    std::vector<LaidOutFile> files;
    for (const FileJob& j : file_jobs(model, plan, nullptr))
      for (auto& f : writer->lay_out(j, out)) files.push_back(std::move(f));
    std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
    for (const auto& f : files) fs::create_directories(fs::path(f.path).parent_path());
    return files;
  }
  ExchangePlan exchange_plan(const std::vector<LaidOutFile>& files, int ranks, uint64_t batch_bytes) const {
    return plan_exchange(model, file_needs(files, model, 2), ranks, batch_bytes);
  }
};

std::string scratch(const std::string& name) { return ucpkit::testing::scratch_dir("exchange_test_" + name); }

// The files saved in order, one by one (files mode): the reference the exchange's bytes must equal.
const std::map<std::string, std::string>& saved_in_order() {
  static const std::map<std::string, std::string> bytes = [] {
    Target s(loadtest::gpt_case().universal.string());
    const std::string out = scratch("in_order");
    for (const auto& f : s.lay_out(out)) save_file(f, {});
    return ucpkit::testing::tree_bytes(out);
  }();
  return bytes;
}

ExchangeStats exchange_into(const std::string& out, uint64_t batch_bytes, size_t* batches = nullptr) {
  Target s(loadtest::gpt_case().universal.string());
  const auto files = s.lay_out(out);
  const ExchangePlan plan = s.exchange_plan(files, 1, batch_bytes);
  if (batches) *batches = plan.batches.size();
  return run_exchange(files, {}, *s.reader, s.model, plan, parallel::MpiSession::get(), 2);
}

std::string error_of(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

}  // namespace

TEST(Exchange, OneBatchWritesTheBytesFilesModeWrites) {
  const std::string out = scratch("one_batch");
  size_t batches = 0;
  const ExchangeStats st = exchange_into(out, uint64_t{1} << 30, &batches);
  EXPECT_EQ(batches, 1u);
  const auto got = ucpkit::testing::tree_bytes(out);
  const auto& want = saved_in_order();
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(want.size(), 2u + 2u * 3u);  // TP 2 model files, TP 2 x DP 3 optimizer shards
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name;
  }
  uint64_t total = 0;
  for (const auto& [name, bytes] : got) total += bytes.size();
  EXPECT_EQ(st.files_written, want.size());  // one rank writes every file
  EXPECT_EQ(st.bytes_written, total);
}

TEST(Exchange, ManySmallBatchesWriteTheSameBytes) {
  const std::string out = scratch("many_batches");
  size_t batches = 0;
  (void)exchange_into(out, 4096, &batches);
  EXPECT_GT(batches, 10u);  // the GPT's tensors cut into many batches, their pieces filled across them
  EXPECT_TRUE(ucpkit::testing::tree_bytes(out) == saved_in_order());
}

TEST(Exchange, OneRankFillsEvenly) {
  const ExchangeStats st = exchange_into(scratch("balance"), 1 << 16);
  EXPECT_GT(st.fill_cost, 0u);
  EXPECT_EQ(st.fill_cost, st.fill_cost_even);  // the busiest rank is the only one
}

TEST(Exchange, WrittenFilesLoadAsTorchFiles) {
  const std::string out = scratch("loadable");
  (void)exchange_into(out, 1 << 16);
  for (const auto& [name, bytes] : ucpkit::testing::tree_bytes(out)) {
    SCOPED_TRACE(name);
    const auto root = load_torch((fs::path(out) / name).string());
    ASSERT_TRUE(root);
    if (name.find("optim_states") != std::string::npos) EXPECT_TRUE(root->get("optimizer_state_dict")) << name;
  }
}

TEST(Exchange, ATensorNotMatchingItsManifestChecksumIsRefused) {
  // A copy of the universal folder whose manifest gives one state another crc32.
  const std::string dir = scratch("bad_crc") + "/u";
  fs::copy(loadtest::gpt_case().universal, dir, fs::copy_options::recursive);
  nlohmann::json m;
  std::ifstream(dir + "/manifest.json") >> m;
  ASSERT_TRUE(m["params"].is_array());
  auto& state = m["params"][0]["states"]["exp_avg"];
  state["crc32"] = "00000000";
  const std::string param = m["params"][0]["name"];
  std::ofstream(dir + "/manifest.json") << m.dump(1);

  Target s(dir);
  const std::string out = scratch("bad_crc_out");
  const auto files = s.lay_out(out);
  const ExchangePlan plan = s.exchange_plan(files, 1, 1 << 16);
  const std::string msg = error_of(
      [&] { run_exchange(files, {}, *s.reader, s.model, plan, parallel::MpiSession::get(), 2); });
  EXPECT_NE(msg.find(param), std::string::npos) << msg;
  EXPECT_NE(msg.find("exp_avg"), std::string::npos) << msg;
}

TEST(Exchange, APlanForOtherRanksIsRefused) {
  Target s(loadtest::gpt_case().universal.string());
  const auto files = s.lay_out(scratch("two_ranks"));
  const ExchangePlan plan = s.exchange_plan(files, 2, 1 << 16);
  const std::string msg = error_of(
      [&] { run_exchange(files, {}, *s.reader, s.model, plan, parallel::MpiSession::get(), 2); });
  EXPECT_NE(msg.find("exchange plan made for 2 ranks"), std::string::npos) << msg;
}

TEST(Exchange, APlanForOtherFilesIsRefused) {
  Target s(loadtest::gpt_case().universal.string());
  auto files = s.lay_out(scratch("other_files"));
  const ExchangePlan plan = s.exchange_plan(files, 1, 1 << 16);
  files.pop_back();
  const std::string msg = error_of(
      [&] { run_exchange(files, {}, *s.reader, s.model, plan, parallel::MpiSession::get(), 2); });
  EXPECT_NE(msg.find("exchange plan made for other files"), std::string::npos) << msg;
}

}  // namespace exchange_test
