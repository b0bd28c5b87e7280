// pec-save / pec-restore end to end on generated native DeepSpeed MoE and universal checkpoints:
// bit-exact restores (checked independently in Python), K = E, PLT from the token counts, kill-during-
// save, corrupted and missing objects, retention, two tiers, exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "support/process.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
const std::string kFx = UCPKIT_FIXTURES_DIR;
const std::string kBin = UCPKIT_BIN_DIR;
const std::vector<int64_t> kSteps = {100, 200, 300, 400, 500};

std::string ckpt(const std::string& family, int64_t step) { return kFx + "/" + family + "/step" + std::to_string(step); }
std::string step_dir(const std::string& family, int64_t step) {
  return ckpt(family, step) + "/global_step" + std::to_string(step);
}
std::string universal(int64_t step) { return ckpt("ds", step) + "/truth/universal"; }
std::string tokens(int64_t step) { return kFx + "/tokens/step" + std::to_string(step) + ".json"; }

// A fresh folder per test process (name + pid): tests running at once never share one.
std::string scratch(const std::string& name) { return ucpkit::testing::scratch_dir(name); }

// Runs a shell command; returns its exit code (128 + signal when killed). Output goes to `log`.
int sh(const std::string& cmd, const std::string& log = "/dev/null") {
  int st = std::system((cmd + " >" + log + " 2>&1").c_str());
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int save(const std::string& src, const std::string& store, int64_t step, const std::string& extra,
         const std::string& env = "", const std::string& log = "/dev/null") {
  return sh(env + " " + kBin + "/pec-save --checkpoint " + src + " --store " + store + " --step " + std::to_string(step) + " " + extra,
            log);
}

int restore(const std::string& store, const std::string& out, const std::string& extra, const std::string& log = "/dev/null") {
  return sh(kBin + "/pec-restore --store " + store + " --output " + out + " --report " + out + "/report.json " + extra, log);
}

json report_of(const std::string& out) { return json::parse(slurp(out + "/report.json")); }

std::map<std::pair<int, int>, int64_t> restored_steps(const json& r) {
  std::map<std::pair<int, int>, int64_t> m;
  for (const auto& e : r["experts"]) m[{e["moe_layer"].get<int>(), e["expert"].get<int>()}] = e["restored_step"].get<int64_t>();
  return m;
}

// The Python check (tests/pec/verify_restore.py) of a native restore against the fixture chain.
int verify_native(const std::string& out, int64_t step, const std::string& family = "ds", bool dbe = false) {
  std::string cmd = std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR + "/tests/pec/verify_restore.py " + out + "/global_step" +
                    std::to_string(step) + " " + out + "/report.json 2 " + (dbe ? "1" : "0");
  for (int64_t s : kSteps)
    if (fs::exists(step_dir(family, s))) cmd += " " + std::to_string(s) + "=" + step_dir(family, s);
  return sh(cmd, out + "/verify.log");
}

std::map<std::string, std::string> tree_bytes(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[fs::relative(e.path(), dir).string()] = slurp(e.path().string());
  return m;
}

void save_chain(const std::string& family, const std::string& store, const std::string& extra, size_t n = 5) {
  for (size_t i = 0; i < n && i < kSteps.size(); ++i) {
    if (!fs::exists(step_dir(family, kSteps[i]))) break;
    ASSERT_EQ(save(ckpt(family, kSteps[i]), store, kSteps[i], extra + " --tokens " + tokens(kSteps[i])), 0) << kSteps[i];
  }
}
}  // namespace

TEST(PecTools, NativeChainRestoresBitExact) {
  std::string d = scratch("native");
  save_chain("ds", d + "/store", "--policy sequential --k 1");
  ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/restore.log"), 0) << slurp(d + "/restore.log");
  EXPECT_EQ(slurp(d + "/out/latest"), "global_step500");
  json r = report_of(d + "/out");
  for (const char* key : {"step", "experts", "plt", "plt_threshold", "next_k", "capacity_plan"}) EXPECT_TRUE(r.contains(key)) << key;
  EXPECT_EQ(r["step"], 500);
  EXPECT_EQ(r["experts"].size(), 8u);
  std::set<int64_t> steps;
  for (const auto& [k, s] : restored_steps(r)) steps.insert(s);
  EXPECT_GT(steps.size(), 1u);  // K=1 of 4: experts come from several steps
  EXPECT_EQ(verify_native(d + "/out", 500), 0) << slurp(d + "/out/verify.log");
}

TEST(PecTools, DataBeforeExpertBf16OptimizerRestoresBitExact) {
  std::string d = scratch("dbe");
  save_chain("dbe", d + "/store", "--policy load-aware --k 1 --data-before-expert");
  ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/restore.log"), 0) << slurp(d + "/restore.log");
  EXPECT_EQ(verify_native(d + "/out", 300, "dbe", true), 0) << slurp(d + "/out/verify.log");
}

TEST(PecTools, KEqualsERestoresTheFullCheckpointExactly) {
  std::string d = scratch("k_eq_e");
  save_chain("ds", d + "/store", "--policy sequential --k 4", 3);
  ASSERT_EQ(restore(d + "/store", d + "/out", ""), 0);
  EXPECT_EQ(tree_bytes(d + "/out/global_step300"), tree_bytes(step_dir("ds", 300)));
  json r = report_of(d + "/out");
  EXPECT_EQ(r["plt"]["overall"].get<double>(), 0.0);
  EXPECT_TRUE(r["capacity_plan"].empty());
}

TEST(PecTools, PltMatchesTokenCounts) {
  std::string d = scratch("plt");
  save_chain("ds", d + "/store", "--policy load-aware --k 1 --keep 5");
  ASSERT_EQ(restore(d + "/store", d + "/out", "--plt-threshold 0.01"), 0);
  json r = report_of(d + "/out");
  // Independent computation: lost = tokens of the intervals after the expert's restored step.
  std::map<int64_t, json> tok;
  for (int64_t s : kSteps) tok[s] = json::parse(slurp(tokens(s)));
  auto from = restored_steps(r);
  std::vector<double> per_layer;
  double overall = 0;
  for (int l = 0; l < 2; ++l) {
    double lost = 0, all = 0;
    for (int e = 0; e < 4; ++e)
      for (int64_t s : kSteps) {
        double t = tok[s][l][e].get<double>();
        all += t;
        if (s > from[{l, e}]) lost += t;
      }
    per_layer.push_back(lost / all);
    overall += lost / all / 2;
  }
  for (int l = 0; l < 2; ++l) EXPECT_NEAR(r["plt"]["per_layer"][l].get<double>(), per_layer[l], 1e-12);
  EXPECT_NEAR(r["plt"]["overall"].get<double>(), overall, 1e-12);
  EXPECT_GT(overall, 0.0);
  int k = r["k"].get<int>();
  EXPECT_EQ(r["next_k"].get<int>(), overall > 0.01 ? std::min(2 * k, 4) : k);
  size_t losing = 0;
  for (const auto& e : r["experts"]) losing += e["lost_tokens"].get<int64_t>() > 0;
  EXPECT_EQ(r["capacity_plan"].size(), losing);
  for (const auto& c : r["capacity_plan"]) {
    EXPECT_DOUBLE_EQ(c["capacity_factor"].get<double>(), 1.1);
    EXPECT_GT(c["iterations"].get<int64_t>(), 0);
  }
}

TEST(PecTools, UniversalLayoutRestoresBitExact) {
  std::string d = scratch("universal");
  for (int64_t s : {100, 200, 300})
    ASSERT_EQ(save(universal(s), d + "/store", s, "--policy sequential --k 1 --ep 2"), 0);
  ASSERT_EQ(restore(d + "/store", d + "/out", ""), 0);
  EXPECT_EQ(slurp(d + "/out/latest_universal"), "global_step300");
  json r = report_of(d + "/out");
  auto from = restored_steps(r);
  std::set<int64_t> used;
  auto got = tree_bytes(d + "/out/global_step300");
  auto want = tree_bytes(universal(300));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [rel, bytes] : got) {
    int64_t step = 300;
    // zero/<...layers.L.mlp.deepspeed_moe.experts.deepspeed_experts.E.../file: from the expert's step.
    auto pos = rel.find("deepspeed_experts.");
    if (pos != std::string::npos) {
      int layer = std::stoi(rel.substr(rel.find("layers.") + 7));
      int expert = std::stoi(rel.substr(pos + 18));
      step = from.at({layer == 1 ? 0 : 1, expert});
      used.insert(step);
    }
    EXPECT_EQ(bytes, slurp(universal(step) + "/" + rel)) << rel;
  }
  EXPECT_GT(used.size(), 1u);
}

TEST(PecTools, KillDuringSaveNeverDamagesTheLastCommit) {
  std::string d = scratch("kill");
  // Reference stores (no crash): restores at steps 200 and 300.
  save_chain("ds", d + "/ref", "--policy sequential --k 1", 3);
  ASSERT_EQ(restore(d + "/ref", d + "/ref300", ""), 0);
  ASSERT_EQ(restore(d + "/ref", d + "/ref200", "--step 200"), 0);
  auto ref300 = tree_bytes(d + "/ref300/global_step300");
  auto ref200 = tree_bytes(d + "/ref200/global_step200");
  int points = 0;
  for (int n = 1; n < 400; ++n) {
    std::string store = d + "/s";
    fs::remove_all(store);
    fs::remove_all(d + "/o");
    save_chain("ds", store, "--policy sequential --k 1", 2);
    int rc = save(ckpt("ds", 300), store, 300, "--policy sequential --k 1 --tokens " + tokens(300),
                  "UCPKIT_PEC_CRASH_AFTER=" + std::to_string(n));
    if (rc == 0) break;  // n is past the last crash point
    ++points;
    EXPECT_EQ(rc, 137) << "crash point " << n;
    ASSERT_EQ(restore(store, d + "/o", "", d + "/o.log"), 0) << "crash point " << n << ": " << slurp(d + "/o.log");
    int64_t step = report_of(d + "/o")["step"].get<int64_t>();
    ASSERT_TRUE(step == 200 || step == 300) << n;
    EXPECT_EQ(tree_bytes(d + "/o/global_step" + std::to_string(step)), step == 300 ? ref300 : ref200) << "crash point " << n;
    if (step == 200 && n % 5 == 0) {
      // The save can simply be run again.
      ASSERT_EQ(save(ckpt("ds", 300), store, 300, "--policy sequential --k 1 --tokens " + tokens(300)), 0) << n;
      fs::remove_all(d + "/o");
      ASSERT_EQ(restore(store, d + "/o", ""), 0);
      EXPECT_EQ(tree_bytes(d + "/o/global_step300"), ref300) << "rerun after crash point " << n;
    }
  }
  EXPECT_GT(points, 20);
}

TEST(PecTools, CorruptOrMissingObjectFallsBackToAnOlderCopy) {
  std::string d = scratch("corrupt");
  save_chain("ds", d + "/store", "--policy sequential --k 2 --keep 5");
  ASSERT_EQ(restore(d + "/store", d + "/clean", ""), 0);
  json clean = report_of(d + "/clean");
  // Damage the newest copy of expert (layer 0, e) saved at step 500.
  json m = json::parse(slurp(d + "/store/manifests/step-000000000500.json"))["manifest"];
  const json& victim = m["experts"][0];
  int layer = victim["moe_layer"].get<int>(), expert = victim["expert"].get<int>();
  std::string id = victim["files"][0]["chunks"][0]["object"].get<std::string>();
  std::string obj = d + "/store/objects/" + id.substr(0, 2) + "/" + id;
  {
    std::fstream f(obj, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    char c = 0x5a;
    f.write(&c, 1);
  }
  ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/out.log"), 0) << slurp(d + "/out.log");
  EXPECT_NE(slurp(d + "/out.log").find("damaged"), std::string::npos);
  json r = report_of(d + "/out");
  auto was = restored_steps(clean), now = restored_steps(r);
  EXPECT_EQ(was.at({layer, expert}), 500);
  EXPECT_LT(now.at({layer, expert}), 500);
  EXPECT_GT(r["plt"]["overall"].get<double>(), clean["plt"]["overall"].get<double>());
  EXPECT_FALSE(r["warnings"].empty());
  EXPECT_EQ(verify_native(d + "/out", 500), 0) << slurp(d + "/out/verify.log");
  // Missing object: same fallback.
  fs::remove(obj);
  fs::remove_all(d + "/out");
  ASSERT_EQ(restore(d + "/store", d + "/out", ""), 0);
  EXPECT_LT(restored_steps(report_of(d + "/out")).at({layer, expert}), 500);
  // No intact copy at all: a clear failure, exit 1, nothing written.
  for (int64_t s : kSteps) {
    json ms = json::parse(slurp(d + "/store/manifests/step-000000000" + std::to_string(s) + ".json"))["manifest"];
    for (const auto& e : ms["experts"])
      if (e["moe_layer"] == layer && e["expert"] == expert)
        for (const auto& f : e["files"])
          for (const auto& c : f["chunks"]) {
            std::string i = c["object"].get<std::string>();
            fs::remove(d + "/store/objects/" + i.substr(0, 2) + "/" + i);
          }
  }
  fs::remove_all(d + "/out");
  EXPECT_EQ(restore(d + "/store", d + "/out", "", d + "/fail.log"), 1);
  EXPECT_NE(slurp(d + "/fail.log").find("has no intact copy"), std::string::npos) << slurp(d + "/fail.log");
  EXPECT_FALSE(fs::exists(d + "/out/global_step500"));
}

TEST(PecTools, RetentionKeepsExactlyWhatTheLatestStepsNeed) {
  std::string d = scratch("gc");
  save_chain("ds", d + "/store", "--policy sequential --k 1 --keep 2");
  ASSERT_EQ(restore(d + "/store", d + "/o500", ""), 0);
  ASSERT_EQ(restore(d + "/store", d + "/o400", "--step 400"), 0);
  EXPECT_EQ(restore(d + "/store", d + "/o300", "--step 300", d + "/o300.log"), 1);  // non-expert state collected
  EXPECT_EQ(verify_native(d + "/o400", 400), 0) << slurp(d + "/o400/verify.log");
  // Every object on disk is named by a manifest (no leftovers), and dropping any expert copy would
  // break a kept step: the same chain with --keep 5 holds strictly more.
  save_chain("ds", d + "/all", "--policy sequential --k 1 --keep 5");
  auto count = [](const std::string& s) {
    size_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(s + "/objects")) n += e.is_regular_file();
    return n;
  };
  EXPECT_LT(count(d + "/store"), count(d + "/all"));
}

TEST(PecTools, TwoTiersPreferTheNewerCopy) {
  std::string d = scratch("tiers");
  for (int64_t s : {100, 200, 300, 400})
    ASSERT_EQ(save(ckpt("ds", s), d + "/durable", s,
                   "--policy sequential --k-persist 1 --fast-store " + d + "/fast --k-snapshot 2 --tokens " + tokens(s)),
              0);
  size_t fast_manifests = 0;
  for (const auto& e : fs::directory_iterator(d + "/fast/manifests")) fast_manifests += e.is_regular_file();
  EXPECT_LE(fast_manifests, 3u);  // retention keeps the fast tier small
  ASSERT_EQ(restore(d + "/durable", d + "/both", "--fast-store " + d + "/fast"), 0);
  ASSERT_EQ(restore(d + "/durable", d + "/slow", ""), 0);
  json both = report_of(d + "/both"), slow = report_of(d + "/slow");
  EXPECT_LT(both["plt"]["overall"].get<double>(), slow["plt"]["overall"].get<double>());
  EXPECT_EQ(verify_native(d + "/both", 400), 0) << slurp(d + "/both/verify.log");
  EXPECT_EQ(verify_native(d + "/slow", 400), 0) << slurp(d + "/slow/verify.log");
}

TEST(PecTools, TokenFormatsPlanAndExitCodes) {
  std::string d = scratch("cli");
  EXPECT_EQ(save(ckpt("ds", 100), d + "/s", 100, "--policy load-aware --k 1 --tokens " + kFx + "/tokens/fixed.csv"), 0);
  EXPECT_EQ(save(ckpt("ds", 200), d + "/s", 200, "--policy budget --budget-bytes 200000 --tokens " + kFx + "/tokens/fixed.jsonl"), 0);
  EXPECT_EQ(save(ckpt("ds", 300), d + "/s", 300, "--policy sequential --k 1 --plan", "", d + "/plan.json"), 0);
  json plan = json::parse(slurp(d + "/plan.json"));
  EXPECT_EQ(plan["world_size"], 1);
  EXPECT_EQ(plan["ranks"].size(), 1u);
  EXPECT_FALSE(fs::exists(d + "/s/manifests/step-000000000300.json"));
  EXPECT_EQ(save(ckpt("ds", 300), d + "/s", 300, "--policy sequential"), 2);            // no --k
  EXPECT_EQ(save(ckpt("ds", 300), d + "/s", 300, "--policy nope --k 1"), 2);            // unknown policy
  EXPECT_EQ(save(ckpt("ds", 300), d + "/s", 300, "--policy load-aware --k 1"), 2);      // needs tokens
  EXPECT_EQ(save(d + "/missing", d + "/s", 300, "--policy sequential --k 1"), 1);       // no checkpoint
  EXPECT_EQ(save(ckpt("ds", 100), d + "/s", 100, "--policy sequential --k 1"), 1);      // step not newer
  EXPECT_EQ(restore(d + "/nostore", d + "/o", ""), 1);
  EXPECT_EQ(sh(kBin + "/pec-restore --output x"), 2);
  EXPECT_EQ(sh(kBin + "/pec-save --version"), 0);
  EXPECT_EQ(sh(kBin + "/pec-restore --store " + d + "/s --output " + d + "/o --json -q", d + "/restore.json"), 0);
  json s = json::parse(slurp(d + "/restore.json"));
  EXPECT_EQ(s["step"], 200);
}

TEST(PecTools, MpiSaveMatchesSingleProcess) {
  if (sh("command -v mpirun") != 0) GTEST_SKIP() << "no mpirun";
  std::string d = scratch("mpi");
  const std::string mpi = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 --oversubscribe ";
  for (int64_t s : {100, 200, 300}) {
    std::string args = " --checkpoint " + ckpt("ds", s) + " --step " + std::to_string(s) + " --policy sequential --k 1 --tokens " + tokens(s);
    ASSERT_EQ(sh(mpi + kBin + "/pec-save --store " + d + "/mpi" + args, d + "/mpi.log"), 0) << slurp(d + "/mpi.log");
    ASSERT_EQ(sh(kBin + "/pec-save --store " + d + "/one" + args), 0);
  }
  ASSERT_EQ(sh(mpi + kBin + "/pec-save --store " + d + "/mpi --checkpoint " + ckpt("ds", 400) +
                   " --step 400 --policy sequential --k 1 --plan", d + "/plan.json"), 0);
  json plan = json::parse(slurp(d + "/plan.json"));
  ASSERT_EQ(plan["ranks"].size(), 2u);
  for (const auto& r : plan["ranks"]) EXPECT_GT(r["bytes"].get<uint64_t>(), 0u);  // both ranks write
  ASSERT_EQ(restore(d + "/mpi", d + "/o_mpi", ""), 0);
  ASSERT_EQ(restore(d + "/one", d + "/o_one", ""), 0);
  EXPECT_EQ(tree_bytes(d + "/o_mpi/global_step300"), tree_bytes(d + "/o_one/global_step300"));
  EXPECT_EQ(verify_native(d + "/o_mpi", 300), 0) << slurp(d + "/o_mpi/verify.log");
}
