// --dry-run summaries (lib/tool/dry_run.cpp): existing_note's three outcomes, bytes_text, the text and
// fields made from hand-written plans of ucp-load (every output format), pec-save, pec-restore and
// moe-replace, print_dry_run's two forms, and the extract / union plans of the area's GPT fixture.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "support/errors.h"
#include "tool/dry_run.h"

namespace dry_run_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace ucpkit::tool;
using ucpkit::testing::error_of;

namespace {

const std::string kGpt = std::string(UCPKIT_FIXTURES_DIR) + "/gpt";

struct TempDir {
  fs::path dir = fs::temp_directory_path() / ("dry_run_test_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
};

}  // namespace

TEST(DryRun, ExistingNoteForAMissingReplacedKeptOrRefusedOutput) {
  TempDir t;
  const std::string missing = (t.dir / "missing").string(), there = t.dir.string();
  EXPECT_EQ(existing_note(missing, false), "");
  EXPECT_EQ(existing_note(missing, true, true), "");
  EXPECT_EQ(existing_note(there, true), " (replacing the existing one)");
  EXPECT_EQ(existing_note(there, true, true), " (replacing the existing one)");  // --overwrite first
  EXPECT_EQ(existing_note(there, false, true), " (kept if it already holds this layout, refused otherwise)");
  EXPECT_EQ(error_of([&] { existing_note(there, false); }),
            there + ": output already exists (remove it or pass --overwrite)");
}

TEST(DryRun, BytesTextIsMebibytesWithOneDecimal) {
  EXPECT_EQ(bytes_text(0), "0.0 MiB");
  EXPECT_EQ(bytes_text(1048576), "1.0 MiB");
  EXPECT_EQ(bytes_text(1572864), "1.5 MiB");
  EXPECT_EQ(bytes_text(uint64_t{10} << 30), "10240.0 MiB");
}

TEST(LoadDryRun, SafetensorsPlanCountsShards) {
  const json plan = {{"shards", {{{"file", "a"}}, {{"file", "b"}}}}, {"dtype", "bf16"}, {"from_source", {{"tp", 2}}}};
  const DryRun d = load_dry_run(plan, "out", " (replacing the existing one)");
  EXPECT_EQ(d.text,
            "ucp-load --dry-run: would write out (replacing the existing one): 2 safetensors shards, dtype bf16; "
            "nothing written\n");
  EXPECT_EQ(d.fields, json({{"dry_run", true},
                            {"would_write", "out"},
                            {"format", "safetensors"},
                            {"shards", 2},
                            {"from_source", {{"tp", 2}}}}));
}

TEST(LoadDryRun, TorchDistPlanNamesItsLayout) {
  const json plan = {{"format", "torch_dist"},
                     {"iteration_folder", "iter_0000100"},
                     {"entries", 40},
                     {"files", {1, 2, 3}},
                     {"target",
                      {{"tp", 2},
                       {"pp", 1},
                       {"ep", 1},
                       {"dp", 4},
                       {"dtype", "bf16"},
                       {"optimizer_format", "fully_sharded_model_space"}}}};
  const DryRun d = load_dry_run(plan, "out");
  EXPECT_EQ(d.text,
            "ucp-load --dry-run: would write out: a Megatron-Core torch_dist save (iter_0000100) of 40 entries in 3 "
            "files, TP 2, PP 1, EP 1, DP 4, model tensors bf16, optimizer fully_sharded_model_space; nothing "
            "written\n");
  EXPECT_EQ(d.fields.at("format"), "torch_dist");
  EXPECT_EQ(d.fields.at("entries"), 40);
  EXPECT_EQ(d.fields.at("target").at("dp"), 4);
  EXPECT_FALSE(d.fields.contains("from_source"));
}

TEST(LoadDryRun, DcpPlanNamesMeshAndDtypes) {
  const json plan = {{"format", "dcp"},
                     {"entries", 12},
                     {"tensor_entries", 10},
                     {"files", {1, 2}},
                     {"target", {{"mesh", "fsdp"}, {"world", 8}, {"dtype", "bf16"}, {"optimizer_dtype", "fp32"}}}};
  EXPECT_EQ(load_dry_run(plan, "o").text,
            "ucp-load --dry-run: would write o: a DCP checkpoint of 12 entries (10 tensors) in 2 files, fsdp over 8 "
            "rank(s), model tensors bf16, optimizer states fp32; nothing written\n");
  // Missing values are said as "?", not refused.
  EXPECT_EQ(load_dry_run({{"format", "dcp"}}, "o").text,
            "ucp-load --dry-run: would write o: a DCP checkpoint of ? entries (? tensors) in ? files, ? over ? "
            "rank(s), model tensors ?, optimizer states ?; nothing written\n");
}

TEST(LoadDryRun, DeepSpeedPlanIsTheDefault) {
  const json plan = {{"target", {{"tp", 2}, {"pp", 2}, {"dp", 1}, {"zero_stage", 1}, {"ep", 1}, {"dtype", "fp16"}}},
                     {"mp_ranks", {0, 1, 2, 3}}};
  const DryRun d = load_dry_run(plan, "o");
  EXPECT_EQ(d.text,
            "ucp-load --dry-run: would write o: deepspeed layout TP 2, PP 2, DP 1, ZeRO stage 1, EP 1, weights fp16 "
            "(4 model-parallel ranks); nothing written\n");
  EXPECT_EQ(d.fields.at("format"), "deepspeed");
  EXPECT_EQ(d.fields.at("mp_ranks"), 4);
  EXPECT_EQ(load_dry_run(json::object(), "o").fields.at("mp_ranks"), 0);
}

TEST(SaveDryRun, CountsExpertsPerTierAndBytes) {
  const json plan = {{"step", 100},
                     {"selection", {{"fast", {{1, 2}, {3}}}, {"slow", {{4}}}}},
                     {"ranks", {{{"bytes", 1048576}}, {{"bytes", 524288}}, json::object()}}};
  const DryRun d = save_dry_run(plan, "/store", "/fast");
  EXPECT_EQ(d.text,
            "pec-save --dry-run: would save step 100 into /store and /fast: the non-expert state and 3 experts into "
            "the fast tier, 1 experts into the slow tier (1.5 MiB before deduplication); nothing written\n");
  EXPECT_EQ(d.fields, json({{"dry_run", true},
                            {"would_write", "/store and /fast"},
                            {"step", 100},
                            {"experts", {{"fast", 3}, {"slow", 1}}},
                            {"bytes", 1572864}}));
  EXPECT_NE(save_dry_run({{"step", 1}}, "/s", "").text.find("into /s: the non-expert state and no experts (0.0 MiB"),
            std::string::npos);
}

TEST(RestoreDryRun, CountsFilesOfTheNonExpertStateAndTheExperts) {
  const json plan = {{"step", 7},
                     {"step_dir", "/ckpt/global_step7"},
                     {"non_expert", {{"files", {"a", "b"}}}},
                     {"experts", {{{"files", {"c"}}}, {{"files", {"d", "e"}}}, {{"id", 3}}}},
                     {"objects_read", 9},
                     {"bytes_read", 2097152}};
  const DryRun d = restore_dry_run(plan);
  EXPECT_EQ(d.text,
            "pec-restore --dry-run: would write /ckpt/global_step7 (step 7): 5 files from 9 stored objects (2.0 MiB), "
            "2 experts; nothing written\n");
  EXPECT_EQ(d.fields.at("files"), 5);
  EXPECT_EQ(d.fields.at("would_write"), "/ckpt/global_step7");
  // Without a step folder, the output.
  EXPECT_EQ(restore_dry_run({{"output", "/o"}}).fields.at("would_write"), "/o");
}

TEST(ReplaceDryRun, ListsTheFilesAndKeepsTheSummary) {
  const DryRun d = replace_dry_run({{"algorithm", "balanced-ft"}}, {"plan.json", "plan.svg"});
  EXPECT_EQ(d.text, "moe-replace --dry-run: would write plan.json, plan.svg; nothing written\n");
  EXPECT_EQ(d.fields,
            json({{"algorithm", "balanced-ft"}, {"dry_run", true}, {"would_write", {"plan.json", "plan.svg"}}}));
}

TEST(DryRun, PrintsTheTextOrTheEnvelope) {
  const DryRun d{"line\n", {{"dry_run", true}, {"would_write", "o"}}};
  ::testing::internal::CaptureStdout();
  print_dry_run("ucp-load", d, false);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "line\n");
  ::testing::internal::CaptureStdout();
  print_dry_run("ucp-load", d, true);
  const json j = json::parse(::testing::internal::GetCapturedStdout());
  EXPECT_EQ(j.at("tool"), "ucp-load");
  EXPECT_TRUE(j.at("output").is_null());
  EXPECT_EQ(j.at("dry_run"), true);
  EXPECT_EQ(j.at("would_write"), "o");
}

// The GPT fixture (tests/tool/fixtures.py: 2 layers, hidden 16, FFN 32, vocab 64, sequence 8, DP 2,
// ZeRO-1): 28 parameters (2 embeddings, 12 per layer, the final norm's 2) of 5,632 elements (1,024 +
// 128 + 2 x 2,224 + 32), each read as fp32 weight and two Adam moments (12 bytes), from its 2
// optimizer shards.
TEST(ExtractDryRun, PlansTheFixtureWithoutWriting) {
  if (!fs::exists(kGpt)) GTEST_SKIP() << kGpt << " absent";
  TempDir t;
  const std::string out = (t.dir / "ucp").string();
  const DryRun d = extract_dry_run(kGpt, out, {});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(d.fields.at("dry_run"), true);
  EXPECT_EQ(d.fields.at("would_write"), out);
  EXPECT_EQ(d.fields.at("params"), 28);
  EXPECT_EQ(d.fields.at("bytes"), 5632 * 12);
  EXPECT_EQ(d.fields.at("shard_files"), 2);
  EXPECT_NE(d.text.find(" of 28 parameters (0.1 MiB) read from 2 shard files; nothing written\n"), std::string::npos)
      << d.text;
  EXPECT_EQ(d.text.rfind("ucp-extract --dry-run: would write " + out + ": plan.json and ", 0), 0u) << d.text;
  // An existing output without --overwrite is refused as the run refuses it.
  EXPECT_NE(error_of([&] { extract_dry_run(kGpt, t.dir.string(), {}); }).find("output already exists"),
            std::string::npos);
}

TEST(UnionDryRun, CountsWhatTheUnionWouldRead) {
  if (!fs::exists(kGpt)) GTEST_SKIP() << kGpt << " absent";
  TempDir t;
  const std::string out = (t.dir / "ucp").string();
  const DryRun d = union_dry_run(kGpt, out, {});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(d.fields.at("would_write"), out);
  EXPECT_EQ(d.fields.at("params"), 28);
  EXPECT_EQ(d.fields.at("bytes"), 5632 * 12);
  EXPECT_TRUE(d.fields.at("input_kind").is_string());
  EXPECT_EQ(d.text.rfind("ucp-union --dry-run: would write " + out + ": ", 0), 0u) << d.text;
  EXPECT_NE(d.text.find(kGpt + "; nothing written\n"), std::string::npos) << d.text;
}

}  // namespace dry_run_test
