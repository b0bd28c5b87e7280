// lib/reshard/load, the ucp-load driver, in process (one rank): prepare() on a universal and on a native
// input, its refusals of options that do not go together, the summary's JSON, and run_load's
// contract: the target files dsgen writes for the same layout, nothing written over the input or on a
// failed --verify-against, --reuse-output writing nothing when the layout record matches. The bytes of
// what the writers write are other tests' (deepspeed_writer_test, roundtrip_test, direct_test).
#include <gtest/gtest.h>

#include <functional>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/universal/manifest.h"
#include "reshard/direct_source.h"
#include "reshard/layout_record.h"
#include "reshard/load.h"
#include "reshard/universal_fixture.h"
#include "support/errors.h"
#include "support/process.h"

namespace load_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

namespace {

using loadtest::gpt_options;

std::string universal() { return loadtest::gpt_case().universal.string(); }
std::string native() { return loadtest::gpt_case().src.string(); }
std::string scratch(const std::string& name) { return ucpkit::testing::scratch_dir("load_test_" + name); }

// Relative paths of the regular files under `dir`.
std::set<std::string> files_under(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) s.insert(fs::relative(e.path(), dir).string());
  return s;
}

std::string error_of(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

}  // namespace

TEST(LoadSummary, JsonSaysTheModeAndOnlyTheFieldsThatApply) {
  LoadSummary s;
  s.output = "/out";
  s.params = 7;
  s.not_carried = {"lr_scheduler"};
  nlohmann::json j = s.to_json();
  EXPECT_EQ(j["tool"], "ucp-load");
  EXPECT_EQ(j["format"], "deepspeed");
  EXPECT_EQ(j["mode"], "files");
  EXPECT_EQ(j["params"], 7);
  EXPECT_EQ(j["not_carried"], nlohmann::json::array({"lr_scheduler"}));
  EXPECT_FALSE(j.contains("fill_balance"));
  EXPECT_FALSE(j.contains("input_kind"));
  EXPECT_FALSE(j.contains("target"));  // an empty layout record is not written

  s.exchange = true;
  s.fill_balance = 1.25;
  s.direct = true;
  s.checksums_compared = 12;
  s.target = {{"tp", 2}};
  j = s.to_json();
  EXPECT_EQ(j["mode"], "exchange");
  EXPECT_EQ(j["fill_balance"], 1.25);
  EXPECT_EQ(j["input_kind"], "native");
  EXPECT_EQ(j["checksums_compared"], 12);
  EXPECT_EQ(j["target"]["tp"], 2);
}

TEST(Prepared, AUniversalInputHasNoSourceAndOpensWithTheCrcCheck) {
  Prepared p;
  EXPECT_EQ(p.direct(), nullptr);
  EXPECT_EQ(p.torch_dist(), nullptr);
  EXPECT_TRUE(p.open().crc_at_open);
}

TEST(Prepared, ADirectInputWithTheFusedCrcOpensWithoutTheCheck) {
  Prepared p;
  auto d = std::make_shared<DirectInput>();
  d->fused_crc = true;
  p.source = std::shared_ptr<const DirectInput>(d);
  ASSERT_EQ(p.direct(), d.get());
  EXPECT_FALSE(p.open().crc_at_open);
  d->fused_crc = false;
  EXPECT_TRUE(p.open().crc_at_open);
}

TEST(Prepare, UniversalInputGivesTheModelAndTheTarget) {
  const Prepared p = prepare(gpt_options(universal(), "/nowhere"));
  EXPECT_TRUE(std::holds_alternative<UniversalInput>(p.source));
  std::ifstream in(loadtest::gpt_case().truth / "meta.json");
  nlohmann::json meta;
  in >> meta;
  EXPECT_EQ(p.model.params.size(), meta["params"].size());
  EXPECT_EQ(p.model.vocab_multiple, 8);
  EXPECT_EQ(p.plan.target.tp, 2);
  EXPECT_EQ(p.plan.target.dp, 3);
  EXPECT_FALSE(p.plan.target.bf16_optimizer);  // --optimizer zero
  EXPECT_FALSE(p.record.is_null());            // DeepSpeed output: its layout record
}

TEST(Prepare, NativeInputIsReadDirectlyWithTheSameParameters) {
  const Prepared u = prepare(gpt_options(universal(), "/nowhere"));
  const Prepared n = prepare(gpt_options(native(), "/nowhere"), formats::detect(native()), /*fused_crc=*/true);
  ASSERT_NE(n.direct(), nullptr);
  EXPECT_TRUE(n.direct()->fused_crc);
  EXPECT_TRUE(n.direct()->kind.is(formats::kDeepSpeed));
  ASSERT_EQ(n.model.params.size(), u.model.params.size());
  for (size_t i = 0; i < u.model.params.size(); ++i) EXPECT_EQ(n.model.params[i].name, u.model.params[i].name);
  EXPECT_EQ(n.model.states, u.model.states);
}

TEST(Prepare, ModelMapWithoutTemplateIsAUsageError) {
  LoadOptions o = gpt_options(universal(), "/nowhere");
  o.model_map = "map.json";
  EXPECT_NE(error_of([&] { prepare(o); }).find("--model-map applies with --template"), std::string::npos);
  EXPECT_THROW(prepare(o), UsageError);
}

TEST(Prepare, TemplateIsRefusedForOtherFormatsAndOtherInputs) {
  LoadOptions o = gpt_options(universal(), "/nowhere");
  o.template_dir = universal();
  o.format = OutputFormat::Safetensors;
  EXPECT_NE(error_of([&] { prepare(o); }).find("--template applies to --format deepspeed"), std::string::npos);
  o.format = OutputFormat::DeepSpeed;
  const std::string msg = error_of([&] { prepare(o); });  // a universal folder is no torch_dist save
  EXPECT_NE(msg.find("--template needs a Megatron-Core torch_dist checkpoint"), std::string::npos) << msg;
}

TEST(Prepare, DsVersionOnAModelWithoutExpertsIsAUsageError) {
  LoadOptions o = gpt_options(universal(), "/nowhere");
  o.target.ds_line = "0.14";
  const std::string msg = error_of([&] { prepare(o); });
  EXPECT_NE(msg.find("--ds-version applies to native DeepSpeed MoE"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has no experts"), std::string::npos) << msg;
}

TEST(PlanJson, GivesTheTargetAndThisRanksLoadPlan) {
  const nlohmann::json j = plan_json(gpt_options(universal(), "/nowhere"));
  ASSERT_TRUE(j.is_object());
  EXPECT_TRUE(j.contains("load")) << j.dump().substr(0, 400);
  EXPECT_TRUE(j.contains("record"));
}

TEST(RunLoad, WritesTheFilesDsgenWritesForTheLayout) {
  const std::string out = scratch("files") + "/out";
  const LoadSummary s = run_load(gpt_options(universal(), out));
  // dsgen's checkpoint of the same layout (src/../ref) names the files DeepSpeed writes: TP 2 model
  // files, TP 2 x DP 3 optimizer shards, `latest`.
  std::set<std::string> want = files_under(loadtest::gpt_case().ref);
  std::set<std::string> got = files_under(out);
  got.erase(kLayoutRecordName);
  for (auto it = want.begin(); it != want.end();) it = it->rfind("truth/", 0) == 0 ? want.erase(it) : std::next(it);
  EXPECT_EQ(got, want);
  EXPECT_EQ(s.output, out);
  EXPECT_EQ(s.ranks, 1);
  EXPECT_FALSE(s.direct);
  EXPECT_FALSE(s.reused);
  EXPECT_GE(s.files_written, want.size() - 1);
  uint64_t bytes = 0;
  for (const auto& f : files_under(out)) bytes += fs::file_size(fs::path(out) / f);
  EXPECT_LE(s.bytes_written, bytes);
  EXPECT_GT(s.bytes_written, 0u);
}

TEST(RunLoad, ReuseOutputWritesNothingWhenTheLayoutIsTheSame) {
  const std::string out = scratch("reuse") + "/out";
  LoadOptions o = gpt_options(universal(), out);
  (void)run_load(o);
  const auto before = fs::last_write_time(fs::path(out) / kLayoutRecordName);
  o.reuse_output = true;
  const LoadSummary s = run_load(o);
  EXPECT_TRUE(s.reused);
  EXPECT_EQ(s.files_written, 0u);
  EXPECT_EQ(s.target["tp"], 2) << s.target.dump();
  EXPECT_EQ(fs::last_write_time(fs::path(out) / kLayoutRecordName), before);

  // Another layout: converted again (said as a warning), which needs --overwrite.
  std::vector<std::string> warnings;
  o.target.dp = 2;
  o.reporter.warn = [&](const std::string& w) { warnings.push_back(w); };
  EXPECT_THROW(run_load(o), std::exception);
  o.overwrite = true;
  warnings.clear();
  EXPECT_FALSE(run_load(o).reused);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].find("holds another layout"), std::string::npos) << warnings[0];
}

TEST(RunLoad, OutputInsideTheInputIsRefused) {
  const std::string out = universal() + "/inner";
  const std::string msg = error_of([&] { run_load(gpt_options(universal(), out)); });
  EXPECT_NE(msg.find("--output"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
}

TEST(RunLoad, DirectModeComparesChecksumsWithTheUnionManifest) {
  const std::string out = scratch("direct") + "/out";
  LoadOptions o = gpt_options(native(), out);
  o.verify_against = universal();
  const LoadSummary s = run_load(o);
  EXPECT_TRUE(s.direct);
  EXPECT_EQ(s.checksums_compared, s.params * 3);  // fp32, exp_avg, exp_avg_sq of every parameter
  EXPECT_EQ(s.to_json()["input_kind"], "native");
  EXPECT_TRUE(fs::exists(fs::path(out) / "latest"));
}

TEST(RunLoad, DirectModeWithAMismatchingManifestWritesNothing) {
  const std::string dir = scratch("bad_manifest");
  auto m = formats::universal::read_universal_manifest(universal() + "/manifest.json");
  m.params[0].states.at("fp32").crc32 = 0xdeadbeef;
  std::ofstream(dir + "/manifest.json") << m.text();
  LoadOptions o = gpt_options(native(), dir + "/out");
  o.verify_against = dir;
  const std::string msg = error_of([&] { run_load(o); });
  EXPECT_NE(msg.find("crc32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("deadbeef"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

}  // namespace load_test
