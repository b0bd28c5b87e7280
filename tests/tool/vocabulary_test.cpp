// One vocabulary across the six tools (issue 28 item 9, docs/commands.md): --input/--output with the
// old names as aliases, --overwrite, sizes with suffixes, --threads, --dry-run, --verify/--no-verify
// and one --json envelope. Tools run as users run them: from their work folder, relative paths.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace vocabulary_test {

namespace fs = std::filesystem;
using ucpkit::testing::file_bytes;
using ucpkit::testing::quote;
using ucpkit::testing::run_command_status;
using ucpkit::testing::tree_bytes;

namespace {

using ToolRun = ucpkit::testing::SplitResult;

// A work folder holding copies of the fixtures (gpt/, gpt_bad_crc/, moe/, loads.json, tokens.json) and a log folder beside it.
struct Work {
  std::string dir, logs;
  explicit Work(const std::string& name) {
    const std::string root = ucpkit::testing::scratch_dir("tool_" + name);
    dir = root + "/work";
    logs = root + "/logs";
    fs::create_directories(logs);
    fs::create_directories(dir);
    for (const char* f : {"gpt", "gpt_bad_crc", "moe", "loads.json", "tokens.json"})
      fs::copy(kFx + "/" + f, dir + "/" + f, fs::copy_options::recursive);
  }
  // `tool args` run inside the work folder; stdout and stderr apart.
  ToolRun run(const std::string& tool, const std::string& args) const {
    return ucpkit::testing::run_split_in(dir, kBin + "/" + tool + " " + args, logs);
  }
  bool exists(const std::string& rel) const { return fs::exists(dir + "/" + rel); }
};

// Regular files under `dir` (recursively).
size_t files_under(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) ++n;
  return n;
}

const char* const kSave = "--step 100 --policy sequential --k 1";
const char* const kLoad = "--tp 1 --pp 1 --dp 2 --zero-stage 1";

// Each tool's command (relative paths) writing `out`, with `extra` options.
std::vector<std::pair<std::string, std::string>> every_tool(const std::string& extra) {
  return {{"ucp-extract", "--input gpt --output out " + extra},
          {"ucp-union", "--input gpt --output out " + extra},
          {"ucp-load", "--input moe --output out " + std::string(kLoad) + " --ep 2 " + extra},
          {"pec-save", "--input moe --output out " + std::string(kSave) + " " + extra},
          {"moe-replace", "--input loads.json --nodes 2 --gpus-per-node 2 --slots-per-gpu 3 --output out " + extra}};
}

// Every tool's command, pec-restore's reading `store`, which a pec-save of moe/ writes first.
std::vector<std::pair<std::string, std::string>> all_six(const Work& w, const std::string& extra) {
  EXPECT_EQ(w.run("pec-save", "--input moe --output store " + std::string(kSave)).rc, 0);
  auto tools = every_tool(extra);
  tools.push_back({"pec-restore", "--input store --output out " + extra});
  return tools;
}

}  // namespace

TEST(Vocabulary, EveryToolPrintsTheJsonEnvelopeFirst) {
  Work w("envelope");
  for (const auto& [tool, args] : all_six(w, "--json")) {
    SCOPED_TRACE(tool);
    fs::remove_all(w.dir + "/out");
    const ToolRun r = w.run(tool, args);
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto j = nlohmann::ordered_json::parse(r.out);
    std::vector<std::string> keys;
    for (const auto& [k, v] : j.items()) keys.push_back(k);
    ASSERT_GE(keys.size(), 6u);
    EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + 5),
              (std::vector<std::string>{"tool", "version", "schema_version", "output", "seconds"}));
    EXPECT_EQ(j["tool"], tool);
    EXPECT_EQ(j["schema_version"], 1);
    const ToolRun v = w.run(tool, "--version");
    EXPECT_NE(v.out.find(j["version"].get<std::string>()), std::string::npos) << v.out;
    EXPECT_GT(j["seconds"].get<double>(), 0.0);
    const std::string output = j["output"].get<std::string>();
    EXPECT_TRUE(fs::exists(fs::path(w.dir) / output)) << output;
  }
}

TEST(Vocabulary, JsonCountsAreTrue) {
  Work w("counts");
  // files_written and bytes_written: what the output folder holds (ucp-load's: tests/reshard/defaults_test.cpp)
  for (const auto& [tool, input] : std::vector<std::pair<std::string, std::string>>{
           {"ucp-extract", "gpt"}, {"ucp-union", "gpt"}, {"ucp-union", "moe"}, {"ucp-union", "work"}}) {
    SCOPED_TRACE(tool + " " + input);
    const std::string out = tool == "ucp-extract" ? "work" : "out";
    fs::remove_all(w.dir + "/" + out);
    const ToolRun r = w.run(tool, "--input " + input + " --output " + out + " --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    size_t bytes = 0;
    for (const auto& [rel, data] : tree_bytes(w.dir + "/" + out)) bytes += data.size();
    EXPECT_EQ(j["files_written"].get<size_t>(), files_under(w.dir + "/" + out));
    EXPECT_EQ(j["bytes_written"].get<size_t>(), bytes);
  }
}

TEST(Vocabulary, OldInputAndOutputNamesAreAliases) {
  Work w("aliases");
  // pec-save: --input/--output = --checkpoint/--store; pec-restore: --input = --store
  ASSERT_EQ(w.run("pec-save", "--input moe --output s1 " + std::string(kSave)).rc, 0);
  ASSERT_EQ(w.run("pec-save", "--checkpoint moe --store s2 " + std::string(kSave)).rc, 0);
  ASSERT_EQ(w.run("pec-restore", "--input s1 --output r1").rc, 0);
  ASSERT_EQ(w.run("pec-restore", "--store s2 --output r2").rc, 0);
  const auto r1 = tree_bytes(w.dir + "/r1");
  EXPECT_FALSE(r1.empty());
  EXPECT_EQ(r1, tree_bytes(w.dir + "/r2"));
  // moe-replace: --input = --loads
  ASSERT_EQ(w.run("moe-replace", "--input loads.json --nodes 2 --gpus-per-node 2 --slots-per-gpu 3 --output p1.json").rc, 0);
  ASSERT_EQ(w.run("moe-replace", "--loads loads.json --nodes 2 --gpus-per-node 2 --slots-per-gpu 3 --output p2.json").rc, 0);
  EXPECT_EQ(nlohmann::json::parse(file_bytes(w.dir + "/p1.json"))["layers"],
            nlohmann::json::parse(file_bytes(w.dir + "/p2.json"))["layers"]);
  // both spellings at once are one option given twice: a usage error
  EXPECT_EQ(w.run("pec-save", "--input moe --checkpoint moe --output s3 " + std::string(kSave)).rc, 2);
}

TEST(Vocabulary, OverwriteReplacesAndForceIsItsAlias) {
  Work w("overwrite");
  ASSERT_EQ(w.run("pec-save", "--input moe --output store " + std::string(kSave)).rc, 0);
  ASSERT_EQ(w.run("pec-restore", "--input store --output out").rc, 0);
  const ToolRun again = w.run("pec-restore", "--input store --output out");
  EXPECT_NE(again.rc, 0);
  EXPECT_NE(again.err.find("already exists"), std::string::npos) << again.err;
  EXPECT_EQ(w.run("pec-restore", "--input store --output out --overwrite").rc, 0);
  EXPECT_EQ(w.run("pec-restore", "--input store --output out --force").rc, 0);
  for (const auto& [tool, args] : every_tool("")) {
    if (tool == "pec-save") continue;  // adds a step to a store: nothing replaced
    SCOPED_TRACE(tool);
    fs::remove_all(w.dir + "/out");
    ASSERT_EQ(w.run(tool, args).rc, 0);
    const ToolRun r = w.run(tool, args + " --overwrite");
    EXPECT_EQ(r.rc, 0) << r.err;
  }
}

TEST(Vocabulary, SizesTakeSuffixesAndTheOldUnitOptionsStay) {
  Work w("sizes");
  // ucp-load safetensors shards: --shard-size 4K is --shard-size-gb 0.000004096
  const std::string st = "--input moe --format safetensors --dtype fp32 ";
  ASSERT_EQ(w.run("ucp-load", st + "--output a --shard-size 4K").rc, 0);
  ASSERT_EQ(w.run("ucp-load", st + "--output b --shard-size-gb 0.000004096").rc, 0);
  ASSERT_EQ(w.run("ucp-load", st + "--output c").rc, 0);
  EXPECT_EQ(tree_bytes(w.dir + "/a"), tree_bytes(w.dir + "/b"));
  EXPECT_GT(files_under(w.dir + "/a"), files_under(w.dir + "/c")) << "4K shards split the model";
  // pec-save chunks: --chunk 4K stores more, smaller objects than --chunk-mib 1; the restores agree
  ASSERT_EQ(w.run("pec-save", "--input moe --output s4k --chunk 4K " + std::string(kSave)).rc, 0);
  ASSERT_EQ(w.run("pec-save", "--input moe --output s1m --chunk-mib 1 " + std::string(kSave)).rc, 0);
  EXPECT_GT(files_under(w.dir + "/s4k"), files_under(w.dir + "/s1m"));
  // pec-restore: --memory 64M is --memory-mb 64
  ASSERT_EQ(w.run("pec-restore", "--input s4k --output r1 --memory 64M").rc, 0);
  ASSERT_EQ(w.run("pec-restore", "--input s1m --output r2 --memory-mb 64").rc, 0);
  EXPECT_EQ(tree_bytes(w.dir + "/r1"), tree_bytes(w.dir + "/r2"));
  // pec-save budget: --budget 40K is --budget-bytes 40960
  const std::string budget = "--input moe --output b1 --step 100 --policy budget --tokens tokens.json --no-bootstrap --plan ";
  const ToolRun plan1 = w.run("pec-save", budget + "--budget 40K");
  ASSERT_EQ(plan1.rc, 0);
  const ToolRun plan2 = w.run("pec-save", budget + "--budget-bytes 40960");
  ASSERT_EQ(plan2.rc, 0);
  EXPECT_EQ(plan1.out, plan2.out);
  const ToolRun plan3 = w.run("pec-save", budget + "--budget 4K");
  ASSERT_EQ(plan3.rc, 0);
  EXPECT_NE(plan1.out, plan3.out) << "another budget selects otherwise";
  // the new and the old form together are one option given twice
  const ToolRun twice = w.run("pec-restore", "--input s4k --output x --memory 64M --memory-mb 64");
  EXPECT_EQ(twice.rc, 2) << twice.err;
  EXPECT_NE(twice.err.find("--memory"), std::string::npos) << twice.err;
  // refusals: usage errors naming the option and the syntax
  for (const auto& [tool, args] :
       std::vector<std::pair<std::string, std::string>>{{"ucp-load", st + "--output x --shard-size 5GB"},
                                                        {"pec-restore", "--input s4k --output x --memory lots"},
                                                        {"pec-save", "--input moe --output x --chunk -4K " + std::string(kSave)},
                                                        {"ucp-load", st + "--output x --batch 1Q"}}) {
    SCOPED_TRACE(args);
    const ToolRun r = w.run(tool, args);
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_NE(r.err.find(tool + ": error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("256M"), std::string::npos) << r.err;
    EXPECT_FALSE(w.exists("x"));
  }
}

TEST(Vocabulary, ThreadsEverywhere) {
  Work w("threads");
  for (const auto& [tool, args] : all_six(w, "--threads 1")) {
    SCOPED_TRACE(tool);
    fs::remove_all(w.dir + "/out");
    const ToolRun r = w.run(tool, args);
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(w.run(tool, args + " --threads -1").rc, 2);
  }
}

TEST(Vocabulary, DryRunSaysWhatWouldBeWrittenAndWritesNothing) {
  Work w("dry_run");
  const auto tools = all_six(w, "--dry-run");
  const auto before = tree_bytes(w.dir);
  for (const auto& [tool, args] : tools) {
    SCOPED_TRACE(tool);
    const ToolRun r = w.run(tool, args);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find(tool + " --dry-run: would "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("out"), std::string::npos) << r.out;
    EXPECT_EQ(tree_bytes(w.dir), before) << "nothing written";
    const ToolRun j = w.run(tool, args + " --json");
    ASSERT_EQ(j.rc, 0) << j.err;
    const auto e = nlohmann::json::parse(j.out);
    EXPECT_EQ(e["tool"], tool);
    EXPECT_TRUE(e["output"].is_null());
    EXPECT_EQ(e["dry_run"], true);
    EXPECT_EQ(tree_bytes(w.dir), before) << "nothing written";
  }
  // what it says is what a run writes: ucp-extract's fragment files, ucp-union's atomic files
  const auto d = nlohmann::json::parse(w.run("ucp-extract", "--input gpt --output out --dry-run --json").out);
  ASSERT_EQ(w.run("ucp-extract", "--input gpt --output out").rc, 0);
  EXPECT_EQ(d["fragment_files"].get<size_t>(), files_under(w.dir + "/out/fragments"));
  for (const std::string input : {"moe", "out"}) {
    const ToolRun u = w.run("ucp-union", "--input " + input + " --output u --overwrite --dry-run --json");
    ASSERT_EQ(u.rc, 0) << u.err;
    ASSERT_EQ(w.run("ucp-union", "--input " + input + " --output u --overwrite").rc, 0);
    size_t atomic = 0;  // zero/<param>/<state>.pt and step.pt (zero/optimizer_state.pt is no parameter's)
    for (const auto& e : fs::directory_iterator(w.dir + "/u/zero"))
      if (e.is_directory()) atomic += files_under(e.path().string());
    EXPECT_EQ(nlohmann::json::parse(u.out)["atomic_files"].get<size_t>(), atomic) << input;
  }
  // ucp-load's dry run says which target values it takes from the source, as the run does
  const ToolRun l = w.run("ucp-load", "--input moe --output target --dp 2 --dry-run");
  ASSERT_EQ(l.rc, 0) << l.err;
  EXPECT_NE(l.err.find("from the source"), std::string::npos) << l.err;
  EXPECT_NE(l.out.find("EP 2"), std::string::npos) << "the source's EP: " << l.out;
  EXPECT_FALSE(w.exists("target"));
  // an existing output without --overwrite is refused as the run would refuse it
  EXPECT_EQ(w.run("ucp-extract", "--input gpt --output out --dry-run").rc, 1);
  EXPECT_EQ(w.run("ucp-extract", "--input gpt --output out --dry-run --overwrite").rc, 0);
}

// Every tool's --dry-run over an existing output says what the run would say: ucp-load's dry runs (a
// DeepSpeed target, and a DCP input rewritten whole or converted first) said "would write" with exit 0,
// then the run refused the folder.
TEST(Vocabulary, DryRunOverAnExistingOutputIsRefusedAsTheRunIsRefused) {
  Work w("dry_run_existing");
  ASSERT_EQ(w.run("ucp-load", "--input moe --output dcp --format dcp --world-size 2").rc, 0);
  const std::vector<std::string> runs = {"--input moe --output taken " + std::string(kLoad) + " --ep 2",
                                         "--input dcp --output taken --format dcp --world-size 1",
                                         "--input dcp --output taken --format safetensors"};
  fs::create_directories(w.dir + "/taken");
  for (const auto& args : runs) {
    SCOPED_TRACE(args);
    const ToolRun run = w.run("ucp-load", args);
    EXPECT_EQ(run.rc, 1) << run.err;
    const ToolRun dry = w.run("ucp-load", args + " --dry-run");
    EXPECT_EQ(dry.rc, 1) << dry.out;
    EXPECT_NE(dry.err.find("taken: output already exists (remove it or pass --overwrite)"), std::string::npos) << dry.err;
    const ToolRun over = w.run("ucp-load", args + " --dry-run --overwrite");
    EXPECT_EQ(over.rc, 0) << over.err;
    EXPECT_NE(over.out.find("taken (replacing the existing one)"), std::string::npos) << over.out;
  }
  EXPECT_TRUE(fs::is_empty(w.dir + "/taken"));
}

TEST(Vocabulary, VerifyTakesBothPolarities) {
  Work w("verify");
  // gpt_bad_crc: one byte of tensor data changed in an optimizer shard (its zip CRC-32 no longer matches)
  for (const std::string tool : {"ucp-extract", "ucp-union"}) {
    SCOPED_TRACE(tool);
    fs::remove_all(w.dir + "/out");
    const ToolRun on = w.run(tool, "--input gpt_bad_crc --output out --verify");
    EXPECT_EQ(on.rc, 1) << on.err;
    EXPECT_NE(on.err.find("CRC"), std::string::npos) << on.err;
    EXPECT_EQ(w.run(tool, "--input gpt_bad_crc --output out").rc, 1) << "on by default";
    EXPECT_EQ(w.run(tool, "--input gpt_bad_crc --output out --no-verify").rc, 0);
  }
  // pec-save reads only what it stores: off by default, --verify asks for it
  EXPECT_EQ(w.run("pec-save", "--input moe --output s --no-verify " + std::string(kSave)).rc, 0);
  EXPECT_EQ(w.run("pec-save", "--input moe --output s2 --verify " + std::string(kSave)).rc, 0);
}

}  // namespace vocabulary_test
