// Issue 16's should-fix items for PEC, each checked against what the tools must do:
//  * pec-restore's temporary folder: removed on SIGTERM (the run dies by the signal), and a folder
//    left by a SIGKILLed restore is swept by the next restore into the same output;
//  * a store manifest claiming a 1 TiB file (checksum recomputed, as anyone can): exit 1 naming it,
//    no std::bad_alloc, nothing written;
//  * a truncated expert file (or model file) is refused by pec-save before anything is stored;
//  * `--k 0` (and other usage errors) create no store;
//  * a read-only store can be restored from (shared lock taken without write access).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "pec/checksum.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace reliability_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::testing::file_bytes;
using ucpkit::testing::run_logged;
using ucpkit::testing::tree_bytes;

namespace {

std::string ckpt(int64_t step) { return kFx + "/ds/step" + std::to_string(step); }
std::string tokens(int64_t step) { return kFx + "/tokens/step" + std::to_string(step) + ".json"; }

// Files (relative names) under `dir`, empty when it does not exist.
std::set<std::string> names_under(const fs::path& dir) {
  std::set<std::string> s;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) s.insert(it->path().lexically_relative(dir).string());  // lexical: a file renamed meanwhile does not throw
  return s;
}

// Entries of `out` that are staging folders of restores (`.global_stepN.pec-restore-tmp-<pid>`).
std::vector<std::string> temporaries(const std::string& out) {
  std::vector<std::string> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec))
    if (e.path().filename().string().find(".pec-restore-tmp-") != std::string::npos) v.push_back(e.path().filename().string());
  return v;
}

// Two steps (100 with every expert, 200 with K = 1) in `store`.
void two_steps(const std::string& store) {
  for (int64_t s : {100, 200})
    ASSERT_EQ(run_logged(kBin + "/pec-save --checkpoint " + ckpt(s) + " --store " + store + " --step " + std::to_string(s) +
                 " --policy sequential --k 1 --tokens " + tokens(s)),
              0)
        << s;
}

std::string restore_cmd(const std::string& store, const std::string& out, const std::string& extra = "") {
  return kBin + "/pec-restore -q --store " + store + " --output " + out + " " + extra;
}

// The last line on stderr is the error and names `what`; at most `lines` lines in all (one per
// message, no dumps).
void expect_error_naming(const std::string& log, const std::string& what, size_t lines = 1) {
  std::string text = file_bytes(log);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  EXPECT_LE(static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1, lines) << text;
  const std::string last = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
  EXPECT_NE(last.find("error"), std::string::npos) << text;
  EXPECT_NE(last.find(what), std::string::npos) << text;
}
}  // namespace

// A restore SIGKILLed while writing (crash point 3: a few chunks written) leaves its temporary folder;
// the next restore into the same output removes it (its process is gone) and succeeds.
TEST(PecReliability, RestoreSweepsTheTemporaryFolderOfAKilledRun) {
  const std::string d = ucpkit::testing::scratch_dir("pec_rel_sweep");
  two_steps(d + "/store");
  ASSERT_EQ(run_logged(restore_cmd(d + "/store", d + "/ref")), 0);
  ASSERT_EQ(run_logged("UCPKIT_PEC_CRASH_AFTER=3 " + restore_cmd(d + "/store", d + "/o")), 137);
  ASSERT_EQ(temporaries(d + "/o").size(), 1u) << "the killed run should have left its folder";
  EXPECT_FALSE(fs::exists(d + "/o/global_step200"));
  EXPECT_FALSE(fs::exists(d + "/o/latest"));
  // A live process's folder is not touched (this test process's pid).
  const std::string live = d + "/o/.global_step200.pec-restore-tmp-" + std::to_string(::getpid());
  fs::create_directories(live);
  // Another step's folders of a dead process: its staging folder is swept too (not only the target
  // step's), its `-old-` folder kept while global_step100 is absent (then it is the only copy).
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const std::string other = d + "/o/.global_step100.pec-restore-tmp-" + std::to_string(dead);
  const std::string old = d + "/o/.global_step100.pec-restore-old-" + std::to_string(dead);
  fs::create_directories(other);
  fs::create_directories(old);
  ASSERT_EQ(run_logged(restore_cmd(d + "/store", d + "/o")), 0);
  EXPECT_EQ(temporaries(d + "/o"), std::vector<std::string>{fs::path(live).filename().string()});
  EXPECT_FALSE(fs::exists(other));
  EXPECT_TRUE(fs::exists(old));
  EXPECT_EQ(tree_bytes(d + "/o/global_step200"), tree_bytes(d + "/ref/global_step200"));
}

// SIGTERM while pec-restore holds its complete temporary folder (UCPKIT_TEST_PAUSE_STAGED=1: every
// file written, not yet renamed): the folder is removed and the process dies by SIGTERM.
TEST(PecReliability, SigtermDuringRestoreRemovesItsTemporaryFolder) {
  const std::string d = ucpkit::testing::scratch_dir("pec_rel_sigterm");
  two_steps(d + "/store");
  ASSERT_EQ(run_logged(restore_cmd(d + "/store", d + "/ref")), 0);
  const auto expected = names_under(d + "/ref/global_step200");
  ASSERT_GT(expected.size(), 10u);
  fs::create_directories(d + "/o");
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("UCPKIT_TEST_PAUSE_STAGED", "1", 1);
    const std::string bin = kBin + "/pec-restore", store = d + "/store", out = d + "/o";
    execl(bin.c_str(), "pec-restore", "-q", "--store", store.c_str(), "--output", out.c_str(), (char*)nullptr);
    _exit(127);
  }
  // The child is stopped on every way out of this test (support/process.h).
  ucpkit::testing::ChildGuard stop(pid);
  const fs::path staged = d + "/o/.global_step200.pec-restore-tmp-" + std::to_string(pid);
  bool reached = false, ended = false;
  int st = 0;
  for (int i = 0; i < 6000 && !reached; ++i) {  // up to 60 s for the run to reach its pause
    if (waitpid(pid, &st, WNOHANG) == pid) {
      ended = true;
      break;
    }
    reached = names_under(staged) == expected;
    if (!reached) usleep(10000);
  }
  if (!ended) {
    kill(pid, SIGTERM);
    waitpid(pid, &st, 0);
  }
  stop.reaped();
  EXPECT_TRUE(reached) << "the run never reached its pause";
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) << st;
  EXPECT_TRUE(temporaries(d + "/o").empty());
  EXPECT_FALSE(fs::exists(d + "/o/global_step200"));
  EXPECT_FALSE(fs::exists(d + "/o/latest"));
}

// A manifest whose first non-expert file claims 2^40 bytes (its checksum recomputed): a clear
// error naming the file, exit 1, no output (std::bad_alloc with the in-memory restore).
TEST(PecReliability, HugeFileSizeInAManifestIsAClearError) {
  const std::string d = ucpkit::testing::scratch_dir("pec_rel_huge");
  two_steps(d + "/store");
  const std::string mpath = d + "/store/manifests/step-000000000200.json";
  json j = json::parse(file_bytes(mpath));
  json& f = j["manifest"]["non_expert"][0];
  const std::string victim = f["path"].get<std::string>();
  f["size"] = uint64_t{1} << 40;
  j["checksum"] = ucpkit::pec::digest(j["manifest"].dump()).hex();
  std::ofstream(mpath, std::ios::binary | std::ios::trunc) << j.dump();
  const int rc = run_logged(restore_cmd(d + "/store", d + "/o", "--step 200"), d + "/log");
  EXPECT_EQ(rc, 1) << file_bytes(d + "/log");
  expect_error_naming(d + "/log", victim, 2);  // the warning that step 200's state is damaged, then the error
  EXPECT_EQ(file_bytes(d + "/log").find("bad_alloc"), std::string::npos) << file_bytes(d + "/log");
  EXPECT_FALSE(fs::exists(d + "/o/global_step200"));
  EXPECT_TRUE(temporaries(d + "/o").empty());
  // Without --step the damaged state is skipped with a warning and step 100 restored.
  ASSERT_EQ(run_logged(restore_cmd(d + "/store", d + "/o2"), d + "/log2"), 0) << file_bytes(d + "/log2");
  EXPECT_EQ(file_bytes(d + "/o2/latest"), "global_step100");
}

// A truncated expert file (half its bytes, as a copy cut short leaves it) and a truncated model file:
// pec-save refuses with one line naming the file, exit 1, and creates no store.
TEST(PecReliability, TruncatedExpertFileIsRefusedBeforeAnythingIsStored) {
  const std::string d = ucpkit::testing::scratch_dir("pec_rel_trunc");
  for (const char* name : {"layer_1_expert_2_mp_rank_00_model_states.pt", "mp_rank_00_model_states.pt"}) {
    const std::string c = d + "/c_" + name;
    fs::copy(ckpt(100), c, fs::copy_options::recursive);
    const std::string file = c + "/global_step100/" + name;
    fs::resize_file(file, fs::file_size(file) / 2);
    const std::string store = d + "/store_" + name;
    const int rc = run_logged(kBin + "/pec-save --checkpoint " + c + " --store " + store + " --step 100 --policy sequential --k 1",
                      d + "/log");
    EXPECT_EQ(rc, 1) << name << ": " << file_bytes(d + "/log");
    expect_error_naming(d + "/log", name);
    EXPECT_FALSE(fs::exists(store)) << name;
    // The intact copy saves (control).
    fs::copy_file(ckpt(100) + "/global_step100/" + name, file, fs::copy_options::overwrite_existing);
    EXPECT_EQ(run_logged(kBin + "/pec-save --checkpoint " + c + " --store " + store + " --step 100 --policy sequential --k 1"), 0);
  }
}

// Usage errors are found before the store folder is created: --k 0, a negative K, a policy that needs
// token counts without them, in a single save and in the watch loop.
TEST(PecReliability, UsageErrorsCreateNoStore) {
  const std::string d = ucpkit::testing::scratch_dir("pec_rel_usage");
  fs::create_directories(d + "/watched");
  const std::vector<std::string> bad = {"--policy sequential --k 0", "--policy sequential --k -1",
                                        "--policy load-aware --k 1", "--policy sequential --k 1 --zstd-level 40"};
  int n = 0;
  for (const auto& args : bad) {
    const std::string store = d + "/s" + std::to_string(n++);
    EXPECT_EQ(run_logged(kBin + "/pec-save --checkpoint " + ckpt(100) + " --store " + store + " --step 100 " + args, d + "/log"), 2)
        << args << ": " << file_bytes(d + "/log");
    EXPECT_FALSE(fs::exists(store)) << args;
    EXPECT_EQ(run_logged(kBin + "/pec-save --watch " + d + "/watched --store " + store + " " + args, d + "/log"), 2)
        << "--watch " << args << ": " << file_bytes(d + "/log");
    EXPECT_FALSE(fs::exists(store)) << "--watch " << args;
  }
}

// A store nobody may write (files 0444, folders 0555; as root the restore runs as user nobody, since
// root ignores permissions) restores bit-exactly; the accumulated PLT cannot be recorded (warning).
TEST(PecReliability, ReadOnlyStoreCanBeRestored) {
  const std::string d = ucpkit::testing::scratch_dir("pec_rel_readonly");
  two_steps(d + "/store");
  ASSERT_EQ(run_logged(restore_cmd(d + "/store", d + "/ref")), 0);
  fs::remove(d + "/store/plt-history.json");
  for (const auto& e : fs::recursive_directory_iterator(d + "/store"))
    fs::permissions(e.path(), e.is_directory() ? fs::perms(0555) : fs::perms(0444));
  fs::permissions(d + "/store", fs::perms(0555));
  fs::create_directories(d + "/o");
  fs::permissions(d + "/o", fs::perms::all);
  fs::permissions(d, fs::perms(0755));
  const std::string as_other = ::geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups " : "";
  const int rc = run_logged(as_other + restore_cmd(d + "/store", d + "/o"), d + "/log");
  for (const auto& e : fs::recursive_directory_iterator(d + "/store")) fs::permissions(e.path(), fs::perms(0755));
  fs::permissions(d + "/store", fs::perms(0755));
  ASSERT_EQ(rc, 0) << file_bytes(d + "/log");
  EXPECT_EQ(tree_bytes(d + "/o/global_step200"), tree_bytes(d + "/ref/global_step200"));
  EXPECT_FALSE(fs::exists(d + "/store/plt-history.json"));
  EXPECT_NE(file_bytes(d + "/log").find("not recorded"), std::string::npos) << file_bytes(d + "/log");
  // Without a lock file (never written there) the read-only store restores too.
  fs::remove(d + "/store/.lock");
  fs::create_directories(d + "/o2");
  fs::permissions(d + "/o2", fs::perms::all);
  for (const auto& e : fs::recursive_directory_iterator(d + "/store"))
    fs::permissions(e.path(), e.is_directory() ? fs::perms(0555) : fs::perms(0444));
  fs::permissions(d + "/store", fs::perms(0555));
  const int rc2 = run_logged(as_other + restore_cmd(d + "/store", d + "/o2"), d + "/log2");
  for (const auto& e : fs::recursive_directory_iterator(d + "/store")) fs::permissions(e.path(), fs::perms(0755));
  fs::permissions(d + "/store", fs::perms(0755));
  EXPECT_EQ(rc2, 0) << file_bytes(d + "/log2");
}

}  // namespace reliability_test
