// ucp-load's target defaults, layout record and file count, run as users run it (issue 28 items 2, 3
// and 9): from another working directory with relative paths, leaving out the options that default.
// * every target dimension or precision not given is the source's (EP 2 and fp16 kept from a native
//   MoE fp16 EP-2 run; TP 2 PP 2 kept from a dense pipeline run), said on stderr and in --json's
//   from_source, and the output is byte for byte what the source's values given explicitly write;
// * --world-size gives DP = W / (TP * PP); a W that does not divide, or no DP at all, is a usage error;
// * ucpkit_layout.json records the layout; --reuse-output reuses only a folder recording the same;
// * --json's files_written is the number of files in the output's tag folder (--ds-version 0.19.5
//   writes no expp_rank files).
// Sources: tests/reshard/defaults_sources.py (tests/generator/dsgen), made once per test process.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace defaults_test {

namespace fs = std::filesystem;
using ucpkit::testing::CommandResult;
using ucpkit::testing::file_bytes;
using ucpkit::testing::quote;
using ucpkit::testing::run_capture;
using ucpkit::testing::tree_bytes;

namespace {

// The sources, generated once (one Python start).
const fs::path& sources() {
  static const fs::path dir = ucpkit::testing::scratch_dir("load_defaults_sources");
  static std::once_flag once;
  std::call_once(once, [] {
    const auto r = run_capture(kPy + " " + kSrc + "/tests/reshard/defaults_sources.py " + quote(dir.string()));
    if (r.rc != 0) ADD_FAILURE() << r.out;
  });
  return dir;
}

// A work folder for one test; `rel(src)` is the source's path relative to it (the tools run there).
struct Work {
  fs::path dir;
  explicit Work(const std::string& name) : dir(ucpkit::testing::scratch_dir(name)) {}
  std::string rel(const std::string& source) const { return fs::relative(sources() / source, dir).string(); }
  // `args` run as `cd dir && ucp-load args` (stdout only when `json_only`, for --json parsing).
  CommandResult load(const std::string& args, bool json_only = false) const {
    // run_capture appends 2>&1: the braces keep stderr away from the JSON.
    return run_capture("cd " + quote(dir.string()) + " && { " + kBin + "/ucp-load " + args +
                       (json_only ? " 2>/dev/null; }" : "; }"));
  }
  size_t files_in(const std::string& sub) const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir / sub))
      if (e.is_regular_file()) ++n;
    return n;
  }
  size_t count(const std::string& sub, const std::string& prefix) const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir / sub))
      if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
    return n;
  }
};

std::string dtypes_of(const fs::path& tag_dir) {
  const auto r = run_capture(kPy + " " + kSrc + "/tests/reshard/target_dtypes.py " + quote(tag_dir.string()));
  EXPECT_EQ(r.rc, 0) << r.out;
  return r.out;
}

TEST(LoadDefaults, NativeMoeKeepsTheSourcesEpAndPrecision) {
  const Work w("load_defaults_moe");
  const std::string src = w.rel("moe_fp16_ep2");
  // The issue's command: the layout given but --ep and --dtype left out (relative input and output):
  // EP 2 and fp16 must be kept, and said so.
  auto r = w.load("--input " + src + " --output out --tp 1 --pp 1 --dp 4 --zero-stage 1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("from the source"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ep 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dtype fp16"), std::string::npos) << r.out;
  const std::string tag = "out/global_step20";
  EXPECT_EQ(w.count(tag, "expp_rank_"), 2u) << "EP 2 writes one expert optimizer file per EP rank";
  EXPECT_EQ(w.count(tag, "bf16_"), 0u) << "an fp16 source must not come back as BF16_Optimizer shards";
  EXPECT_EQ(w.count(tag, "zero_pp_rank_"), 4u);
  EXPECT_EQ(dtypes_of(w.dir / tag), "torch.float16\n");
  // The same bytes as the source's values given explicitly.
  r = w.load("--input " + src + " --output explicit --tp 1 --pp 1 --dp 4 --zero-stage 1 --ep 2 --dtype fp16");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(tree_bytes((w.dir / "out").string()) == tree_bytes((w.dir / "explicit").string()));
  // Only --dp: TP, PP and the ZeRO stage are the source's too.
  r = w.load("--input " + src + " --output only_dp --dp 4");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("tp 1, pp 1, ep 2, zero_stage 1, dtype fp16"), std::string::npos) << r.out;
  EXPECT_TRUE(tree_bytes((w.dir / "only_dp").string()) == tree_bytes((w.dir / "explicit").string()));
  // --json names what was taken from the source; the universal input (ucp-union first) says the same.
  r = run_capture("cd " + quote(w.dir.string()) + " && " + kBin + "/ucp-union -q --input " + src + " --output u");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = w.load("--input u --output from_universal --world-size 4 --json", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["from_source"], nlohmann::json::parse(R"({"tp": 1, "pp": 1, "ep": 2, "zero_stage": 1, "dtype": "fp16"})"));
  EXPECT_EQ(w.count("from_universal/global_step20", "expp_rank_"), 2u);
  EXPECT_EQ(dtypes_of(w.dir / "from_universal/global_step20"), "torch.float16\n");
  // Given values win, and are not reported as the source's.
  r = w.load("--input u --output ep4 --dp 4 --ep 4 --json", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_FALSE(nlohmann::json::parse(r.out)["from_source"].contains("ep"));
  EXPECT_EQ(w.count("ep4/global_step20", "expp_rank_"), 4u);
}

TEST(LoadDefaults, DenseKeepsTpPpAndTakesDpFromTheWorldSize) {
  const Work w("load_defaults_dense");
  const std::string src = w.rel("gpt_fp16_tp2pp2");
  auto r = w.load("--input " + src + " --output out --world-size 8 --json", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["from_source"], nlohmann::json::parse(R"({"tp": 2, "pp": 2, "zero_stage": 1, "dtype": "fp16"})"));
  // TP 2 x PP 2 = 4 model files; DP 8 / 4 = 2 ZeRO shards each.
  EXPECT_EQ(w.count("out/global_step30", "mp_rank_"), 4u);
  EXPECT_EQ(w.count("out/global_step30", "zero_pp_rank_"), 8u);
  EXPECT_EQ(j["target"]["dp"], 2);
  // Usage errors (exit 2, one line naming the option, nothing written).
  r = w.load("--input " + src + " --output bad --world-size 6");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("ucp-load: error: --world-size 6 is not a multiple of TP * PP = 2 * 2"), std::string::npos) << r.out;
  r = w.load("--input " + src + " --output bad");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--dp or --world-size is required"), std::string::npos) << r.out;
  r = w.load("--input " + src + " --output bad --world-size 8 --dp 3");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--dp is 3"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(w.dir / "bad"));
  // --help states each default.
  r = w.load("--help");
  for (const char* text : {"tensor-parallel degree (default: the source's)", "pipeline-parallel degree (default: the source's)",
                           "expert-parallel degree (default: the source's)", "ZeRO stage (0-3; default: the source's)",
                           "dtype (default: the source's training precision)", "--world-size"})
    EXPECT_NE(r.out.find(text), std::string::npos) << text;
}

TEST(LoadDefaults, LayoutRecordDecidesReuse) {
  const Work w("load_defaults_reuse");
  const std::string src = w.rel("moe_fp16_ep2");
  auto r = w.load("--input " + src + " --output out --dp 4 --reuse-output");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto rec = nlohmann::json::parse(file_bytes((w.dir / "out/ucpkit_layout.json").string()));
  EXPECT_EQ(rec["format"], "ucpkit-layout");
  const auto want = nlohmann::json::parse(R"({"tp": 1, "pp": 1, "dp": 4, "ep": 2, "zero_stage": 1,
        "dtype": "fp16", "tag": "global_step20", "ds_line": "0.14"})");
  for (const auto& [k, v] : want.items()) EXPECT_EQ(rec[k], v) << k;
  const auto before = tree_bytes((w.dir / "out").string());
  const auto mtime = fs::last_write_time(w.dir / "out/global_step20/mp_rank_00_model_states.pt");
  // The same request (defaults resolved the same way): reused, nothing written.
  r = w.load("--input " + src + " --output out --dp 4 --ep 2 --reuse-output --json", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["reused"], true);
  EXPECT_EQ(fs::last_write_time(w.dir / "out/global_step20/mp_rank_00_model_states.pt"), mtime);
  // Another layout without --overwrite: refused (exit 1), the folder untouched.
  r = w.load("--input " + src + " --output out --dp 4 --ep 4 --reuse-output");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("holds another layout (ep 2 (requested 4))"), std::string::npos) << r.out;
  EXPECT_TRUE(tree_bytes((w.dir / "out").string()) == before);
  // With --overwrite: converted again, and the record says so.
  r = w.load("--input " + src + " --output out --dp 4 --ep 4 --reuse-output --overwrite");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("converting again (--overwrite)"), std::string::npos) << r.out;
  EXPECT_EQ(nlohmann::json::parse(file_bytes((w.dir / "out/ucpkit_layout.json").string()))["ep"], 4);
  EXPECT_EQ(w.count("out/global_step20", "expp_rank_"), 4u);
}

TEST(LoadDefaults, FilesWrittenIsWhatTheTagFolderHolds) {
  const Work w("load_defaults_files");
  const std::string src = w.rel("moe_fp16_ep2");
  for (const std::string line : {"0.19.5", "0.14"}) {
    for (const std::string mode : {"off", "on"}) {
      SCOPED_TRACE(line + " exchange " + mode);
      const std::string out = "out_" + line + "_" + mode;
      // Every layout option given: the count is checked on its own, whatever the defaults.
      auto r = w.load("--input " + src + " --output " + out + " --tp 1 --pp 1 --dp 4 --zero-stage 1 --ep 2 --dtype fp16" +
                          " --ds-version " + line + " --exchange " + mode + " --json",
                      true);
      ASSERT_EQ(r.rc, 0) << r.out;
      const auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["files_written"].get<size_t>(), w.files_in(out + "/global_step20"));
      EXPECT_EQ(w.count(out + "/global_step20", "expp_rank_"), line == "0.19.5" ? 0u : 2u);
    }
  }
}

}  // namespace

}  // namespace defaults_test
