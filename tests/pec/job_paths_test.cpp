// pec-save / pec-restore as a job script runs them (issue 28, items 1, 4 and 5): from another working
// folder with relative paths in every form (`.`, trailing slashes, symbolic links, a tag folder or its
// parent), the persist agent's exit code, a --step that disagrees with the checkpoint (refused) or
// left out (inferred), and PLT without token counts (unknown, not 0).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace job_paths_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::testing::file_bytes;
using ucpkit::testing::quote;
using ucpkit::testing::run_logged;

namespace {

std::string ckpt(int64_t step) { return kFx + "/ds/step" + std::to_string(step); }
std::string step_dir(int64_t step) { return ckpt(step) + "/global_step" + std::to_string(step); }

// `tool args` run inside `dir` (the way a job script with relative paths runs it); stdout and stderr
// into `dir/log` (returned through `log` when given).
int run_in(const std::string& dir, const std::string& tool, const std::string& args, std::string* log = nullptr) {
  const int rc = run_logged("cd " + quote(dir) + " && " + kBin + "/" + tool + " " + args, dir + "/log");
  if (log) *log = file_bytes(dir + "/log");
  return rc;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// The Python check of a native restore (tests/pec/verify_restore.py) against the fixture chain.
int verify_native(const std::string& out, int64_t step, const std::string& report) {
  std::string cmd = std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR + "/tests/pec/verify_restore.py " + out +
                    "/global_step" + std::to_string(step) + " " + report + " 2 0";
  for (int64_t s : {100, 200, 300, 400, 500}) cmd += " " + std::to_string(s) + "=" + step_dir(s);
  return run_logged(cmd, out + "/verify.log");
}

json json_file(const std::string& path) { return json::parse(file_bytes(path)); }
}  // namespace

// Item 1: every path option relative to the working folder, in every form a job script writes it:
// the parent folder with `latest`, with a trailing slash, `./` and the tag folder itself, a symbolic
// link to the folder, `.`; the store through a symbolic link and with a trailing slash; --tokens,
// --output and --report relative. The restore is checked bit-exactly in Python.
TEST(PecJobPaths, RelativePathsInEveryFormFromAnotherWorkingFolder) {
  const std::string d = ucpkit::testing::scratch_dir("pec_relative");
  fs::create_directories(d + "/job/data");
  fs::create_directory_symlink(d + "/job/data", d + "/job/store_link");
  for (int64_t s : {100, 200, 300}) fs::copy(ckpt(s), d + "/job/ckpt" + std::to_string(s), fs::copy_options::recursive);
  fs::create_directory_symlink(d + "/job/ckpt300", d + "/job/linked300");
  fs::copy_file(kFx + "/tokens/step100.json", d + "/job/tok100.json");
  const std::string common = " --policy sequential --k 1 --tokens tok100.json";
  std::string log;
  // The parent with `latest`, no trailing slash; the store given through a link with a trailing slash.
  ASSERT_EQ(run_in(d + "/job", "pec-save", "--checkpoint ckpt100 --store store_link/ --step 100" + common, &log), 0) << log;
  // The tag folder, `./` in front and a trailing slash.
  ASSERT_EQ(run_in(d + "/job", "pec-save", "--checkpoint ./ckpt200/global_step200/ --store store_link --step 200" + common, &log),
            0)
      << log;
  // `.` inside a symbolically linked checkpoint folder; the store `..`-relative.
  ASSERT_EQ(run_in(d + "/job/linked300", "pec-save", "--checkpoint . --store ../data/. --step 300 --policy sequential --k 1",
                   &log),
            0)
      << log;
  EXPECT_TRUE(fs::exists(d + "/job/data/manifests/step-000000000300.json"));
  // The restore: relative store (trailing slash), output and report.
  ASSERT_EQ(run_in(d + "/job", "pec-restore", "--store data/ --output out/ --report report.json", &log), 0) << log;
  EXPECT_EQ(file_bytes(d + "/job/out/latest"), "global_step300");
  EXPECT_TRUE(fs::is_directory(d + "/job/out/global_step300"));
  EXPECT_EQ(json_file(d + "/job/report.json")["step"], 300);
  EXPECT_EQ(verify_native(d + "/job/out", 300, d + "/job/report.json"), 0) << file_bytes(d + "/job/out/verify.log");
}

// The persist agent started in `dir` on the relative folder `shm/` into the store `name`: its log,
// exit code and pid files are `dir/name.{log,rc,pid}`.
struct Agent {
  std::string dir, name;
  Agent(const std::string& d, const std::string& n) : dir(d), name(n) {
    const std::string cmd = "(cd " + quote(dir) + " && " + kBin + "/pec-save --watch shm/ --store " + name +
                            " --policy sequential --k 1 --poll-seconds 0.05 >" + name + ".log 2>&1; echo $? >" + name +
                            ".rc) & echo $! >" + quote(dir + "/" + name + ".pid");
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
  ~Agent() { stop(); }
  std::string log() const { return file_bytes(dir + "/" + name + ".log"); }
  bool wait_for_line(const std::string& line) const {
    for (int i = 0; i < 1200 && !contains(log(), line); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return contains(log(), line);
  }
  // SIGTERM to the agent (the subshell's child); its exit code ("" when it did not end).
  std::string stop() {
    const std::string rc = dir + "/" + name + ".rc", pid = file_bytes(dir + "/" + name + ".pid");
    if (!fs::exists(rc) && !pid.empty()) std::system(("pkill -TERM -P " + pid.substr(0, pid.find('\n'))).c_str());
    for (int i = 0; i < 600 && !fs::exists(rc); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return file_bytes(rc);
  }
};

// Item 1: the persist agent watching a relative folder saves each step (it logged "NOT saved" at every
// step and exited 0 after saving nothing).
TEST(PecJobPaths, WatchOfARelativeFolderSavesEachStep) {
  const std::string d = ucpkit::testing::scratch_dir("pec_watch_relative");
  fs::create_directories(d + "/shm");
  fs::copy(step_dir(100), d + "/shm/global_step100", fs::copy_options::recursive);
  { std::ofstream(d + "/shm/latest") << "global_step100"; }
  Agent agent(d, "store");
  EXPECT_TRUE(agent.wait_for_line("step 100 saved")) << agent.log();
  EXPECT_EQ(agent.stop(), "0\n") << agent.log();
  EXPECT_FALSE(contains(agent.log(), "NOT saved")) << agent.log();
  EXPECT_TRUE(fs::exists(d + "/store/manifests/step-000000000100.json"));
}

// Item 1: an agent whose every step failed exits 1 when stopped (it exited 0), and says how many
// steps were not saved.
TEST(PecJobPaths, WatchThatSavedNothingExitsOne) {
  const std::string d = ucpkit::testing::scratch_dir("pec_watch_failed");
  fs::create_directories(d + "/shm/global_step200");  // a step folder that holds no checkpoint
  { std::ofstream(d + "/shm/global_step200/notes.txt") << "not a checkpoint"; }
  { std::ofstream(d + "/shm/latest") << "global_step200"; }
  Agent agent(d, "store");
  EXPECT_TRUE(agent.wait_for_line("step 200 NOT saved")) << agent.log();
  EXPECT_EQ(agent.stop(), "1\n") << agent.log();
  EXPECT_TRUE(contains(agent.log(), "stopped by signal after 0 saves, 1 steps NOT saved")) << agent.log();
}

// Item 4: `--step 200` on a folder whose `latest` names global_step300 stored step-300 data as step 200;
// now it is refused (exit 2) naming both steps and where 300 comes from, and nothing is stored.
// A folder named global_step200 that holds step 300 (global_steps and iteration 300) is refused too.
// Without --step the step is inferred and the summary says from what.
TEST(PecJobPaths, StepThatDisagreesWithTheCheckpointIsRefusedAndAMissingOneInferred) {
  const std::string d = ucpkit::testing::scratch_dir("pec_step_check");
  fs::create_directories(d + "/job");
  fs::create_directory_symlink(ckpt(300), d + "/job/ckpt");
  std::string log;
  EXPECT_EQ(run_in(d + "/job", "pec-save", "--checkpoint ckpt --store store --step 200 --policy sequential --k 1", &log), 2)
      << log;
  EXPECT_TRUE(contains(log, "--step 200")) << log;
  EXPECT_TRUE(contains(log, "step 300 from")) << log;
  EXPECT_TRUE(contains(log, "latest")) << log;
  EXPECT_EQ(log.find('\n'), log.size() - 1) << "one line: " << log;
  EXPECT_FALSE(fs::exists(d + "/job/store/manifests/step-000000000200.json"));
  // The tag folder renamed (copied under another step's name): its model states record step 300.
  fs::create_directories(d + "/job/renamed");
  fs::copy(step_dir(300), d + "/job/renamed/global_step200", fs::copy_options::recursive);
  EXPECT_EQ(run_in(d + "/job", "pec-save", "--checkpoint renamed/global_step200 --store store --step 200 --policy sequential --k 1",
                   &log),
            2)
      << log;
  EXPECT_TRUE(contains(log, "global_steps in ")) << log;
  EXPECT_TRUE(contains(log, "step 300")) << log;
  // Without --step the sources disagree among themselves: corrupt input, exit 1, both named.
  EXPECT_EQ(run_in(d + "/job", "pec-save", "--checkpoint renamed/global_step200 --store store --policy sequential --k 1", &log), 1)
      << log;
  EXPECT_TRUE(contains(log, "step 200 from the tag folder name global_step200")) << log;
  EXPECT_TRUE(contains(log, "step 300 from global_steps")) << log;
  // A symbolic link to a tag folder stands for its target (as for every tool): `current` -> global_step300.
  fs::create_directory_symlink(step_dir(300), d + "/job/current");
  EXPECT_EQ(run_in(d + "/job", "pec-save", "--checkpoint current --store store --step 200 --policy sequential --k 1", &log), 2)
      << log;
  EXPECT_TRUE(contains(log, "step 300 from the tag folder name global_step300")) << log;
  // Inferred: the step `latest`, the tag, global_steps and iteration agree on.
  ASSERT_EQ(run_in(d + "/job", "pec-save", "--checkpoint ckpt --store store --policy sequential --k 1 --json", &log), 0) << log;
  const json summary = json::parse(log.substr(log.find('{')));
  EXPECT_EQ(summary["step"], 300);
  EXPECT_EQ(summary["step_inferred"], true);
  for (const char* source : {"global_step300", "latest", "global_steps", "iteration"})
    EXPECT_TRUE(contains(summary["step_from"].get<std::string>(), source)) << summary["step_from"];
  EXPECT_TRUE(contains(log, "step 300 inferred from")) << log;
  EXPECT_TRUE(fs::exists(d + "/job/store/manifests/step-000000000300.json"));
  // The agreeing --step is taken as before.
  ASSERT_EQ(run_in(d + "/job", "pec-save", "--checkpoint " + step_dir(400) + " --store store --step 400 --policy sequential --k 1 --json",
                   &log),
            0)
      << log;
  EXPECT_EQ(json::parse(log.substr(log.find('{')))["step_inferred"], false);
}

// Item 5: without token counts PLT is unknown: `null` in the report (plt, plt_accumulated, the lost
// tokens of experts restored from older steps), "unknown" in the table, K kept with the reason (it was
// "PLT 0.0000% ... next K" computed from a false 0). An expert restored from the target step lost nothing (0).
TEST(PecJobPaths, PltWithoutTokenCountsIsUnknownNotZero) {
  const std::string d = ucpkit::testing::scratch_dir("pec_plt_unknown");
  fs::create_directories(d + "/job");
  for (int64_t s : {100, 200, 300})
    ASSERT_EQ(run_in(d + "/job", "pec-save", "--checkpoint " + ckpt(s) + " --store store --policy sequential --k 1 --step " +
                                                 std::to_string(s)),
              0);
  std::string table;
  ASSERT_EQ(run_in(d + "/job", "pec-restore", "--store store --output out --report report.json --plt-threshold 0", &table), 0)
      << table;
  const json r = json_file(d + "/job/report.json");
  EXPECT_TRUE(r["plt"]["overall"].is_null()) << r["plt"];
  EXPECT_TRUE(r["plt"]["per_layer"].is_null()) << r["plt"];
  EXPECT_TRUE(r["plt_accumulated"]["overall"].is_null()) << r["plt_accumulated"];
  EXPECT_TRUE(r["plt_exceeded"].is_null());
  EXPECT_EQ(r["tokens_known"], false);
  EXPECT_EQ(r["next_k"], r["k"]);  // threshold 0: a false 0 did not double it, an honest unknown keeps it
  EXPECT_TRUE(contains(r.value("next_k_reason", std::string()), "unknown")) << r;
  int older = 0;
  for (const auto& e : r["experts"]) {
    if (e["restored_step"] == 300) {
      EXPECT_EQ(e["lost_tokens"], 0) << e;
    } else {
      EXPECT_TRUE(e["lost_tokens"].is_null()) << e;
      ++older;
    }
  }
  EXPECT_GT(older, 0);  // K = 1 of 4: experts come from older steps
  EXPECT_TRUE(contains(table, "PLT unknown")) << table;
  EXPECT_FALSE(contains(table, "PLT 0.0000%")) << table;
  EXPECT_TRUE(contains(table, "unknown  ")) << table;  // an expert's lost tokens
  // The same chain with token counts from a folder of step<N>.json (what the job script's TOKENS
  // names): PLT known, and equal to giving each step's file.
  for (int64_t s : {100, 200, 300}) {
    ASSERT_EQ(run_in(d + "/job", "pec-save", "--checkpoint " + ckpt(s) + " --store folder --policy sequential --k 1 --tokens " +
                                                 kFx + "/tokens/ --step " + std::to_string(s)),
              0)
        << file_bytes(d + "/job/log");
    ASSERT_EQ(run_in(d + "/job", "pec-save", "--checkpoint " + ckpt(s) + " --store files --policy sequential --k 1 --tokens " +
                                                 kFx + "/tokens/step" + std::to_string(s) + ".json --step " + std::to_string(s)),
              0);
  }
  ASSERT_EQ(run_in(d + "/job", "pec-restore", "--store folder --output out_folder --report folder.json"), 0);
  ASSERT_EQ(run_in(d + "/job", "pec-restore", "--store files --output out_files --report files.json"), 0);
  const json a = json_file(d + "/job/folder.json"), b = json_file(d + "/job/files.json");
  ASSERT_TRUE(a["plt"]["overall"].is_number()) << a["plt"];
  EXPECT_EQ(a["plt"], b["plt"]);
  EXPECT_EQ(a["experts"], b["experts"]);
}

// pec-restore --output given as the step folder itself (`out/global_step300`): the checkpoint goes to
// `out` (no global_step300/global_step300); a step folder of another step is refused (exit 2). What
// the command line left out (--step, --ds-version) is the store's, and `from_source` says so.
TEST(PecJobPaths, RestoreOutputMayNameTheStepFolder) {
  const std::string d = ucpkit::testing::scratch_dir("pec_output_tag");
  fs::create_directories(d + "/job");
  for (int64_t s : {100, 200})
    ASSERT_EQ(run_in(d + "/job", "pec-save", "--checkpoint " + ckpt(s) + " --store store --policy sequential --k 1 --step " +
                                                 std::to_string(s)),
              0);
  std::string log;
  EXPECT_EQ(run_in(d + "/job", "pec-restore", "--store store --output out/global_step100", &log), 2) << log;
  EXPECT_TRUE(contains(log, "step 100") && contains(log, "step 200")) << log;
  EXPECT_FALSE(fs::exists(d + "/job/out"));
  ASSERT_EQ(run_in(d + "/job", "pec-restore", "--store store --output out/global_step200/ --report r200.json", &log), 0) << log;
  EXPECT_EQ(file_bytes(d + "/job/out/latest"), "global_step200");
  // Left out, the step and the version line are the store's, and the report and table say so.
  const json r200 = json_file(d + "/job/r200.json");
  EXPECT_EQ(r200.value("from_source", json::object()), json({{"step", 200}, {"ds_version", "as saved"}})) << r200;
  EXPECT_TRUE(contains(log, "from the store: step 200 (newest committed; no --step)")) << log;
  EXPECT_FALSE(fs::exists(d + "/job/out/global_step200/global_step200"));
  EXPECT_TRUE(fs::exists(d + "/job/out/global_step200/mp_rank_00_model_states.pt"));
  ASSERT_EQ(run_in(d + "/job", "pec-restore", "--store store --output out2/global_step100 --step 100 --report r100.json", &log),
            0)
      << log;
  EXPECT_EQ(file_bytes(d + "/job/out2/latest"), "global_step100");
  EXPECT_EQ(json_file(d + "/job/r100.json").value("from_source", json::object()), json({{"ds_version", "as saved"}}));
}

}  // namespace job_paths_test
