// pec-save / pec-restore end to end on generated native DeepSpeed MoE and universal checkpoints:
// bit-exact restores (checked independently in Python), K = E, PLT from the token counts, kill-during-
// save, corrupted and missing objects, retention, two tiers, exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <chrono>
#include <thread>
#include <tuple>

#include "io/torch/torch_file.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace pec_tools_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::testing::file_bytes;
using ucpkit::testing::run_logged;
using ucpkit::testing::tree_bytes;

namespace {
const std::vector<int64_t> kSteps = {100, 200, 300, 400, 500};

std::string ckpt(const std::string& family, int64_t step) { return kFx + "/" + family + "/step" + std::to_string(step); }
std::string step_dir(const std::string& family, int64_t step) {
  return ckpt(family, step) + "/global_step" + std::to_string(step);
}
std::string universal(int64_t step) { return ckpt("ds", step) + "/truth/universal"; }
std::string tokens(int64_t step) { return kFx + "/tokens/step" + std::to_string(step) + ".json"; }

// A fresh folder per test process (name + pid): tests running at once never share one.
std::string scratch(const std::string& name) { return ucpkit::testing::scratch_dir(name); }

int save(const std::string& src, const std::string& store, int64_t step, const std::string& extra,
         const std::string& env = "", const std::string& log = "/dev/null") {
  return run_logged(env + " " + kBin + "/pec-save --checkpoint " + src + " --store " + store + " --step " + std::to_string(step) + " " + extra,
            log);
}

int restore(const std::string& store, const std::string& out, const std::string& extra, const std::string& log = "/dev/null") {
  return run_logged(kBin + "/pec-restore --store " + store + " --output " + out + " --report " + out + "/report.json " + extra, log);
}

json report_of(const std::string& out) { return json::parse(file_bytes(out + "/report.json")); }

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
  return run_logged(cmd, out + "/verify.log");
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
  ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/restore.log"), 0) << file_bytes(d + "/restore.log");
  EXPECT_EQ(file_bytes(d + "/out/latest"), "global_step500");
  json r = report_of(d + "/out");
  for (const char* key : {"step", "experts", "plt", "plt_threshold", "next_k", "capacity_plan"}) EXPECT_TRUE(r.contains(key)) << key;
  EXPECT_EQ(r["step"], 500);
  EXPECT_EQ(r["experts"].size(), 8u);
  std::set<int64_t> steps;
  for (const auto& [k, s] : restored_steps(r)) steps.insert(s);
  EXPECT_GT(steps.size(), 1u);  // K=1 of 4: experts come from several steps
  EXPECT_EQ(verify_native(d + "/out", 500), 0) << file_bytes(d + "/out/verify.log");
}

TEST(PecTools, DataBeforeExpertBf16OptimizerRestoresBitExact) {
  std::string d = scratch("dbe");
  save_chain("dbe", d + "/store", "--policy load-aware --k 1 --data-before-expert");
  ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/restore.log"), 0) << file_bytes(d + "/restore.log");
  EXPECT_EQ(verify_native(d + "/out", 300, "dbe", true), 0) << file_bytes(d + "/out/verify.log");
}

TEST(PecTools, UncompressedStoreRestoresBitExact) {
  std::string d = scratch("level0");
  save_chain("ds", d + "/store", "--policy sequential --k 1 --zstd-level 0", 3);
  ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/restore.log"), 0) << file_bytes(d + "/restore.log");
  EXPECT_EQ(verify_native(d + "/out", 300), 0) << file_bytes(d + "/out/verify.log");
  size_t raw = 0;
  for (const auto& e : fs::recursive_directory_iterator(d + "/store/objects"))
    if (e.is_regular_file()) raw += file_bytes(e.path().string()).rfind("UCPKOBJ0", 0) == 0;
  EXPECT_GT(raw, 10u);
}

// pec-save --watch beside a fake trainer that writes three steps the way DeepSpeed does (the step
// folder first, `latest` last): each step is saved once `latest` names it and not before, snapshots
// older than --keep-snapshots are removed, SIGTERM stops the agent with exit code 0, and the store
// restores the last step bit-exactly.
TEST(PecTools, WatchPersistsEachCompletedStepAndStopsOnSigterm) {
  std::string d = scratch("watch");
  const std::string shm = d + "/shm", store = d + "/store";
  fs::create_directories(shm);
  ASSERT_EQ(std::system(("(" + kBin + "/pec-save --watch " + shm + " --store " + store +
                         " --policy sequential --k 1 --poll-seconds 0.05 --keep-snapshots 1 >" + d +
                         "/watch.log 2>&1; echo $? >" + d + "/watch.rc) & echo $! >" + d + "/watch.pid")
                            .c_str()),
            0);
  auto manifest = [&](int64_t s) { return store + "/manifests/step-000000000" + std::to_string(s) + ".json"; };
  auto wait_for = [&](const std::string& path) {
    for (int i = 0; i < 1200 && !fs::exists(path); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return fs::exists(path);
  };
  for (int64_t s : {100, 200, 300}) {
    const std::string tag = "global_step" + std::to_string(s);
    fs::copy(step_dir("ds", s), shm + "/" + tag, fs::copy_options::recursive);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(fs::exists(manifest(s))) << "saved before `latest` named it: " << s;
    { std::ofstream(shm + "/latest.tmp") << tag; }
    fs::rename(shm + "/latest.tmp", shm + "/latest");
    ASSERT_TRUE(wait_for(manifest(s))) << s << ": " << file_bytes(d + "/watch.log");
  }
  // The watcher saved step 300; wait for its log line (pruning follows the commit), then stop it.
  for (int i = 0; i < 200 && file_bytes(d + "/watch.log").find("step 300 saved") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string pid = file_bytes(d + "/watch.pid");
  std::system(("pkill -TERM -P " + pid.substr(0, pid.find('\n'))).c_str());
  ASSERT_TRUE(wait_for(d + "/watch.rc")) << file_bytes(d + "/watch.log");
  EXPECT_EQ(file_bytes(d + "/watch.rc"), "0\n") << file_bytes(d + "/watch.log");
  const std::string log = file_bytes(d + "/watch.log");
  size_t lines = 0;
  for (size_t p = log.find(" saved from "); p != std::string::npos; p = log.find(" saved from ", p + 1)) ++lines;
  EXPECT_EQ(lines, 3u) << log;
  EXPECT_NE(log.find("stopped by signal after 3 saves"), std::string::npos) << log;
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(shm))
    if (e.is_directory()) left.insert(e.path().filename().string());
  EXPECT_EQ(left, std::set<std::string>({"global_step300"}));
  ASSERT_EQ(restore(store, d + "/out", "", d + "/restore.log"), 0) << file_bytes(d + "/restore.log");
  EXPECT_EQ(report_of(d + "/out")["step"], 300);
  EXPECT_EQ(verify_native(d + "/out", 300), 0) << file_bytes(d + "/out/verify.log");
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

// Every DeepSpeed version line of native MoE (the chain above is the 0.14 line): pec-save and
// pec-restore give back the source bytes, and ucp-union reads the restored folder as it reads the source.
TEST(PecTools, EveryDeepSpeedVersionLineRestoresBitExactAndConverts) {
  for (std::string line : {"0.17.1", "0.19.2", "0.19.3", "0.19.5"}) {
    SCOPED_TRACE(line);
    const std::string family = "line" + line, d = scratch("line" + line);
    ASSERT_EQ(save(ckpt(family, 100), d + "/store", 100, "--policy sequential --k 4 --tokens " + tokens(100)), 0);
    ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/restore.log"), 0) << file_bytes(d + "/restore.log");
    EXPECT_EQ(tree_bytes(d + "/out/global_step100"), tree_bytes(step_dir(family, 100)));
    ASSERT_EQ(run_logged(kBin + "/ucp-union -q --input " + d + "/out --output " + d + "/u_out", d + "/u.log"), 0) << file_bytes(d + "/u.log");
    ASSERT_EQ(run_logged(kBin + "/ucp-union -q --input " + ckpt(family, 100) + " --output " + d + "/u_src", d + "/u.log"), 0)
        << file_bytes(d + "/u.log");
    EXPECT_EQ(tree_bytes(d + "/u_out/zero"), tree_bytes(d + "/u_src/zero"));
    EXPECT_NE(file_bytes(d + "/u_out/manifest.json").find("\"ds_line\": \"" + line + "\""), std::string::npos);
    fs::remove_all(d);
  }
}

// pec-restore --ds-version: the 0.14 chain's step restored as every other line (then back as 0.14
// from a 0.19.5 checkpoint): laid out as that line (tests/reshard/check_moe_line.py), param_shapes as the
// generator writes them for that line, and ucp-union gives the same atomics as from the source.
TEST(PecTools, RestoreAsAnotherDeepSpeedVersionLine) {
  const std::string d = scratch("ds_version");
  ASSERT_EQ(save(ckpt("ds", 100), d + "/store", 100, "--policy sequential --k 4 --tokens " + tokens(100)), 0);
  ASSERT_EQ(save(ckpt("line0.19.5", 100), d + "/store95", 100, "--policy sequential --k 4 --tokens " + tokens(100)), 0);
  ASSERT_EQ(run_logged(kBin + "/ucp-union -q --input " + ckpt("ds", 100) + " --output " + d + "/u_src"), 0);
  ASSERT_EQ(run_logged(kBin + "/ucp-union -q --input " + ckpt("line0.19.5", 100) + " --output " + d + "/u_src95"), 0);
  std::string check = std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR + "/tests/reshard/check_moe_line.py";
  const std::string meta = ckpt("ds", 100) + "/truth/meta.json";
  for (std::string line : {"0.17.1", "0.19.2", "0.19.3", "0.19.5", "0.14"}) {
    SCOPED_TRACE(line);
    const bool from95 = line == "0.14";
    const std::string out = d + "/out" + line;
    ASSERT_EQ(restore(d + (from95 ? "/store95" : "/store"), out, "--ds-version " + line, d + "/r.log"), 0) << file_bytes(d + "/r.log");
    ASSERT_EQ(run_logged(kBin + "/ucp-union -q --input " + out + " --output " + d + "/u" + line, d + "/u.log"), 0) << file_bytes(d + "/u.log");
    // Every optimizer shard says the line's release (its first: DeepSpeed's tags of the line), at the
    // top level and in optimizer_state_dict; parsed with the CRC-32 check, so the patched record's CRC
    // is right too. ucp-union carries the shards' ds_version into zero/optimizer_state.pt: that file
    // differs from the source's union by the release string (same length) and what depends on it.
    const std::map<std::string, std::string> release = {
        {"0.17.1", "0.17.1"}, {"0.19.2", "0.19.2"}, {"0.19.3", "0.19.3"}, {"0.19.5", "0.19.5"}, {"0.14", "0.16.5"}};
    auto got = tree_bytes(d + "/u" + line + "/zero"), want = tree_bytes(d + (from95 ? "/u_src95" : "/u_src") + "/zero");
    const std::string a = got["optimizer_state.pt"], b = want["optimizer_state.pt"];
    ASSERT_EQ(a.size(), b.size());
    size_t differing = 0;
    for (size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
    // The string (6 bytes), the CRC-32 of data.pkl in its local header, data descriptor and central entry
    // (12), and the serialization id the writer derives from the content with its record's CRC-32s.
    EXPECT_LE(differing, 48u);
    EXPECT_EQ(ucpkit::load_torch(d + "/u" + line + "/zero/optimizer_state.pt")->get("ds_version")->as_str(), release.at(line));
    got.erase("optimizer_state.pt");
    want.erase("optimizer_state.pt");
    EXPECT_EQ(got, want);
    check += " " + out + " " + line + " 2 " + meta;
    int shards = 0;
    for (const auto& e : fs::directory_iterator(out + "/global_step100")) {
      const std::string n = e.path().filename().string();
      if (n.find("zero_pp_rank") == std::string::npos) continue;
      ++shards;
      auto root = ucpkit::load_torch(e.path().string());
      EXPECT_EQ(root->get("ds_version")->as_str(), release.at(line)) << n;
      EXPECT_EQ(root->get("optimizer_state_dict")->get("ds_version")->as_str(), release.at(line)) << n;
    }
    EXPECT_EQ(shards, 4);
  }
  EXPECT_EQ(run_logged(check, d + "/check.log"), 0) << file_bytes(d + "/check.log");
  // param_shapes built from the module and expert files = what the generator writes for 0.19.3.
  const std::string cmp = std::string(UCPKIT_PYTHON) + " -c \"import sys; sys.path.insert(0, '" + UCPKIT_SOURCE_DIR +
                          "/tests/generator'); import dsgen, torch; f = lambda p: [[(k, tuple(v)) for k, v in g.items()] for g in "
                          "torch.load(p, weights_only=False)['param_shapes']]; sys.exit(f(sys.argv[1]) != f(sys.argv[2]))\" " + d +
                          "/out0.19.3/global_step100/mp_rank_00_model_states.pt " + step_dir("line0.19.3", 100) +
                          "/mp_rank_00_model_states.pt";
  EXPECT_EQ(run_logged(cmp, d + "/cmp.log"), 0) << file_bytes(d + "/cmp.log");
  // An unknown line is a usage error before anything is written.
  EXPECT_EQ(restore(d + "/store", d + "/bad", "--ds-version 0.12", d + "/bad.log"), 2) << file_bytes(d + "/bad.log");
  EXPECT_FALSE(fs::exists(d + "/bad"));
  fs::remove_all(d);
}

TEST(PecTools, PltMatchesTokenCounts) {
  std::string d = scratch("plt");
  save_chain("ds", d + "/store", "--policy load-aware --k 1 --keep 5");
  ASSERT_EQ(restore(d + "/store", d + "/out", "--plt-threshold 0.01"), 0);
  json r = report_of(d + "/out");
  // Independent computation: lost = tokens of the intervals after the expert's restored step.
  std::map<int64_t, json> tok;
  for (int64_t s : kSteps) tok[s] = json::parse(file_bytes(tokens(s)));
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

// Accumulated PLT: a second restore of the same store adds its lost tokens to the first one's
// (recorded in the store); restoring an earlier step again drops the abandoned later record.
TEST(PecTools, AccumulatedPltAddsUpOverRestores) {
  std::string d = scratch("plt_acc");
  save_chain("ds", d + "/store", "--policy sequential --k 1 --keep 5");
  ASSERT_EQ(restore(d + "/store", d + "/a", "--step 300"), 0);
  json a = report_of(d + "/a");
  EXPECT_EQ(a["restores_counted"], 1);
  EXPECT_EQ(a["plt_accumulated"], a["plt"]);
  ASSERT_EQ(restore(d + "/store", d + "/b", "--step 500 --plt-threshold 0.01"), 0);
  json b = report_of(d + "/b");
  EXPECT_EQ(b["restores_counted"], 2);
  // Independently: lost tokens of both reports over all tokens up to step 500, per layer.
  std::map<int64_t, json> tok;
  for (int64_t s : kSteps) tok[s] = json::parse(file_bytes(tokens(s)));
  double overall = 0;
  for (int l = 0; l < 2; ++l) {
    double lost = 0, all = 0;
    for (const json* r : {&a, &b})
      for (const auto& e : (*r)["experts"])
        if (e["moe_layer"] == l) lost += e["lost_tokens"].get<double>();
    for (int e = 0; e < 4; ++e)
      for (int64_t s : kSteps) all += tok[s][l][e].get<double>();
    EXPECT_NEAR(b["plt_accumulated"]["per_layer"][l].get<double>(), lost / all, 1e-12);
    overall += lost / all / 2;
  }
  EXPECT_GT(b["plt_accumulated"]["overall"].get<double>(), b["plt"]["overall"].get<double>());
  int k = b["k"].get<int>();
  EXPECT_EQ(b["next_k"].get<int>(), overall > 0.01 ? std::min(2 * k, 4) : k);
  ASSERT_EQ(restore(d + "/store", d + "/c", "--step 400"), 0);
  json c = report_of(d + "/c");
  EXPECT_EQ(c["restores_counted"], 2);  // 300 and 400; the 500 record belonged to an abandoned timeline
}

TEST(PecTools, UniversalLayoutRestoresBitExact) {
  std::string d = scratch("universal");
  for (int64_t s : {100, 200, 300})
    ASSERT_EQ(save(universal(s), d + "/store", s, "--policy sequential --k 1 --ep 2"), 0);
  ASSERT_EQ(restore(d + "/store", d + "/out", ""), 0);
  EXPECT_EQ(file_bytes(d + "/out/latest_universal"), "global_step300");
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
    EXPECT_EQ(bytes, file_bytes(universal(step) + "/" + rel)) << rel;
  }
  EXPECT_GT(used.size(), 1u);
  // --ds-version is for native MoE: refused (exit 2) before the output folder is created.
  EXPECT_EQ(restore(d + "/store", d + "/refused", "--ds-version 0.19.5", d + "/refused.log"), 2) << file_bytes(d + "/refused.log");
  EXPECT_FALSE(fs::exists(d + "/refused")) << "the refusal left the output folder behind";
}

namespace {
// Kills the save of step 300 (after steps 100 and 200) at every `stride`-th crash point: the store
// always restores its last commit bit-exactly, and the save can be run again.
void kill_during_save(const std::string& family, const std::string& name, int stride, int min_points) {
  std::string d = scratch(name);
  // Reference stores (no crash): restores at steps 200 and 300.
  save_chain(family, d + "/ref", "--policy sequential --k 1", 3);
  ASSERT_EQ(restore(d + "/ref", d + "/ref300", ""), 0);
  ASSERT_EQ(restore(d + "/ref", d + "/ref200", "--step 200"), 0);
  auto ref300 = tree_bytes(d + "/ref300/global_step300");
  auto ref200 = tree_bytes(d + "/ref200/global_step200");
  int points = 0;
  for (int n = 1; n < 400; n += stride) {
    std::string store = d + "/s";
    fs::remove_all(store);
    fs::remove_all(d + "/o");
    save_chain(family, store, "--policy sequential --k 1", 2);
    int rc = save(ckpt(family, 300), store, 300, "--policy sequential --k 1 --tokens " + tokens(300),
                  "UCPKIT_PEC_CRASH_AFTER=" + std::to_string(n));
    if (rc == 0) break;  // n is past the last crash point
    ++points;
    EXPECT_EQ(rc, 137) << "crash point " << n;
    ASSERT_EQ(restore(store, d + "/o", "", d + "/o.log"), 0) << "crash point " << n << ": " << file_bytes(d + "/o.log");
    int64_t step = report_of(d + "/o")["step"].get<int64_t>();
    ASSERT_TRUE(step == 200 || step == 300) << n;
    EXPECT_EQ(tree_bytes(d + "/o/global_step" + std::to_string(step)), step == 300 ? ref300 : ref200) << "crash point " << n;
    if (step == 200 && (n / stride) % 5 == 0) {
      // The save can simply be run again.
      ASSERT_EQ(save(ckpt(family, 300), store, 300, "--policy sequential --k 1 --tokens " + tokens(300)), 0) << n;
      fs::remove_all(d + "/o");
      ASSERT_EQ(restore(store, d + "/o", ""), 0);
      EXPECT_EQ(tree_bytes(d + "/o/global_step300"), ref300) << "rerun after crash point " << n;
    }
  }
  EXPECT_GT(points, min_points);
}
}  // namespace

TEST(PecTools, KillDuringSaveNeverDamagesTheLastCommit) { kill_during_save("ds", "kill", 1, 20); }

// The same on AutoEP under ZeRO-3 (every third crash point: the shards are cut the same way).
TEST(PecAutoEpZero3Store, KillDuringSaveNeverDamagesTheLastCommit) { kill_during_save("autoep_z3", "z3_kill", 3, 6); }

// pec-restore killed (SIGKILL) at every crash point of the streaming writer: the output folder never
// holds a partial global_stepN nor a `latest` naming one; the next restore cleans up and succeeds.
TEST(PecTools, KillDuringRestoreLeavesNoOutput) {
  std::string d = scratch("kill_restore");
  save_chain("ds", d + "/store", "--policy sequential --k 1", 3);
  ASSERT_EQ(restore(d + "/store", d + "/ref", ""), 0);
  auto ref = tree_bytes(d + "/ref/global_step300");
  int points = 0;
  for (int n = 1; n < 400; ++n) {
    fs::remove_all(d + "/o");
    int rc = run_logged("UCPKIT_PEC_CRASH_AFTER=" + std::to_string(n) + " " + kBin + "/pec-restore --store " + d + "/store --output " + d + "/o");
    if (rc == 0) break;  // past the last crash point
    ++points;
    ASSERT_EQ(rc, 137) << "crash point " << n;
    if (fs::exists(d + "/o/global_step300")) {
      // Killed after the rename: the folder is complete (only `latest` may be missing).
      EXPECT_EQ(tree_bytes(d + "/o/global_step300"), ref) << "crash point " << n;
    } else {
      EXPECT_FALSE(fs::exists(d + "/o/latest")) << "crash point " << n;
    }
    if (n % 4 != 0) continue;  // every fourth point: the next restore cleans up and succeeds
    ASSERT_EQ(restore(d + "/store", d + "/o", "--force", d + "/o.log"), 0) << n << ": " << file_bytes(d + "/o.log");
    EXPECT_EQ(tree_bytes(d + "/o/global_step300"), ref) << "restore after crash point " << n;
    EXPECT_EQ(file_bytes(d + "/o/latest"), "global_step300");
    for (const auto& e : fs::directory_iterator(d + "/o"))
      EXPECT_EQ(e.path().filename().string().rfind(".", 0), std::string::npos) << "left over: " << e.path();
  }
  EXPECT_GT(points, 20);
}

TEST(PecTools, CorruptOrMissingObjectFallsBackToAnOlderCopy) {
  std::string d = scratch("corrupt");
  save_chain("ds", d + "/store", "--policy sequential --k 2 --keep 5");
  ASSERT_EQ(restore(d + "/store", d + "/clean", ""), 0);
  json clean = report_of(d + "/clean");
  // Damage the newest copy of expert (layer 0, e) saved at step 500.
  json m = json::parse(file_bytes(d + "/store/manifests/step-000000000500.json"))["manifest"];
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
  ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/out.log"), 0) << file_bytes(d + "/out.log");
  EXPECT_NE(file_bytes(d + "/out.log").find("damaged"), std::string::npos);
  json r = report_of(d + "/out");
  auto was = restored_steps(clean), now = restored_steps(r);
  EXPECT_EQ(was.at({layer, expert}), 500);
  EXPECT_LT(now.at({layer, expert}), 500);
  EXPECT_GT(r["plt"]["overall"].get<double>(), clean["plt"]["overall"].get<double>());
  EXPECT_FALSE(r["warnings"].empty());
  EXPECT_EQ(verify_native(d + "/out", 500), 0) << file_bytes(d + "/out/verify.log");
  // Missing object: same fallback.
  fs::remove(obj);
  fs::remove_all(d + "/out");
  ASSERT_EQ(restore(d + "/store", d + "/out", ""), 0);
  EXPECT_LT(restored_steps(report_of(d + "/out")).at({layer, expert}), 500);
  // No intact copy at all: a clear failure, exit 1, nothing written.
  for (int64_t s : kSteps) {
    json ms = json::parse(file_bytes(d + "/store/manifests/step-000000000" + std::to_string(s) + ".json"))["manifest"];
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
  EXPECT_NE(file_bytes(d + "/fail.log").find("has no intact copy"), std::string::npos) << file_bytes(d + "/fail.log");
  EXPECT_FALSE(fs::exists(d + "/out/global_step500"));
}

TEST(PecTools, RetentionKeepsExactlyWhatTheLatestStepsNeed) {
  std::string d = scratch("gc");
  save_chain("ds", d + "/store", "--policy sequential --k 1 --keep 2");
  ASSERT_EQ(restore(d + "/store", d + "/o500", ""), 0);
  ASSERT_EQ(restore(d + "/store", d + "/o400", "--step 400"), 0);
  EXPECT_EQ(restore(d + "/store", d + "/o300", "--step 300", d + "/o300.log"), 1);  // non-expert state collected
  EXPECT_EQ(verify_native(d + "/o400", 400), 0) << file_bytes(d + "/o400/verify.log");
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
  EXPECT_EQ(verify_native(d + "/both", 400), 0) << file_bytes(d + "/both/verify.log");
  EXPECT_EQ(verify_native(d + "/slow", 400), 0) << file_bytes(d + "/slow/verify.log");
}

// pec-restore --plan writes nothing (no output folder, the stores' bytes unchanged), and what it prints
// is what the restore then does: the target step, each expert's source tier and step (the restore's
// report says the same), and the restored files hold, per expert, the values of the fixture checkpoint
// of the step the plan names (tests/pec/verify_restore.py, independent of the C++ code).
TEST(PecTools, RestorePlanAgreesWithTheRestoreAndWritesNothing) {
  const std::string d = scratch("restore_plan");
  for (int64_t s : {100, 200, 300, 400})
    ASSERT_EQ(save(ckpt("ds", s), d + "/durable", s,
                   "--policy sequential --k-persist 1 --fast-store " + d + "/fast --k-snapshot 2 --tokens " + tokens(s)),
              0);
  const auto durable = tree_bytes(d + "/durable"), fast = tree_bytes(d + "/fast");
  const std::string tiers = " --store " + d + "/durable --fast-store " + d + "/fast";
  auto plan_of = [&](const std::string& extra) {
    return ucpkit::testing::run_command_status(kBin + "/pec-restore --plan" + tiers + " --output " + d + "/out --report " + d +
                                               "/out/report.json " + extra + " >" + d + "/plan.json 2>" + d + "/plan.log");
  };
  ASSERT_EQ(plan_of(""), 0) << file_bytes(d + "/plan.log");
  EXPECT_FALSE(fs::exists(d + "/out"));
  EXPECT_EQ(tree_bytes(d + "/durable"), durable);
  EXPECT_EQ(tree_bytes(d + "/fast"), fast);
  const json plan = json::parse(file_bytes(d + "/plan.json"));
  EXPECT_EQ(plan["step"], 400);
  EXPECT_EQ(plan["step_dir"], d + "/out/global_step400");
  // Every object the plan reads is in the store of its tier.
  auto has_object = [&](const json& source, const std::string& id) {
    return fs::exists(source["store"].get<std::string>() + "/objects/" + id.substr(0, 2) + "/" + id);
  };
  for (const auto& f : plan["non_expert"]["files"])
    for (const auto& id : f["objects"]) EXPECT_TRUE(has_object(plan["non_expert"], id.get<std::string>())) << id;
  for (const auto& e : plan["experts"])
    for (const auto& f : e["files"])
      for (const auto& id : f["objects"]) EXPECT_TRUE(has_object(e, id.get<std::string>())) << id;

  ASSERT_EQ(restore(d + "/durable", d + "/out", "--fast-store " + d + "/fast", d + "/restore.log"), 0) << file_bytes(d + "/restore.log");
  const json report = report_of(d + "/out");
  EXPECT_EQ(report["step"], plan["step"]);
  ASSERT_EQ(plan["experts"].size(), report["experts"].size());
  std::set<int64_t> steps;
  std::set<std::string> from_tiers;
  json plan_as_report = {{"step", plan["step"]}, {"experts", json::array()}};
  for (size_t i = 0; i < plan["experts"].size(); ++i) {
    const json &p = plan["experts"][i], &r = report["experts"][i];
    EXPECT_EQ(p["moe_layer"], r["moe_layer"]);
    EXPECT_EQ(p["expert"], r["expert"]);
    EXPECT_EQ(p["step"], r["restored_step"]) << p.dump();
    EXPECT_EQ(p["tier"], r["tier"]) << p.dump();
    steps.insert(p["step"].get<int64_t>());
    from_tiers.insert(p["tier"].get<std::string>());
    plan_as_report["experts"].push_back({{"moe_layer", p["moe_layer"]}, {"expert", p["expert"]}, {"restored_step", p["step"]}});
  }
  EXPECT_GT(steps.size(), 1u);       // a partial chain: experts from several steps,
  EXPECT_EQ(from_tiers.size(), 2u);  // and from both tiers
  std::ofstream(d + "/out/report.json", std::ios::trunc) << plan_as_report.dump();
  EXPECT_EQ(verify_native(d + "/out", 400), 0) << file_bytes(d + "/out/verify.log");

  // As the restore, --plan refuses an existing step folder without --force; with it, it still writes nothing.
  const auto out = tree_bytes(d + "/out");
  EXPECT_EQ(plan_of(""), 1) << file_bytes(d + "/plan.log");
  EXPECT_NE(file_bytes(d + "/plan.log").find("already exists (use --overwrite"), std::string::npos)
      << file_bytes(d + "/plan.log");  // the one vocabulary's name (--force is its old alias)
  EXPECT_EQ(plan_of("--force"), 0) << file_bytes(d + "/plan.log");
  EXPECT_EQ(plan_of("--overwrite"), 0) << file_bytes(d + "/plan.log");
  EXPECT_EQ(tree_bytes(d + "/out"), out);
}

TEST(PecTools, FastTierHoldsOnlyWhatTheDurableTierLacks) {
  // Five saves into two tiers (universal layout, so every expert's bytes are its own files and the
  // bound below is computed from the checkpoint's files, independently of pec-save).
  std::string d = scratch("fast_small");
  std::map<std::pair<int, int>, int64_t> durable_last, fast_last;
  for (int64_t s : kSteps) {
    ASSERT_EQ(save(universal(s), d + "/durable", s,
                   "--policy sequential --ep 2 --k-persist 1 --fast-store " + d + "/fast --k-snapshot 2 --json", "",
                   d + "/save.json"),
              0)
        << file_bytes(d + "/save.json");
    json out = json::parse(file_bytes(d + "/save.json"));
    for (const auto& t : out["tiers"]) {
      auto& last = t["tier"] == "fast" ? fast_last : durable_last;
      for (size_t l = 0; l < t["selection"].size(); ++l)
        for (const auto& e : t["selection"][l]) last[{static_cast<int>(l), e.get<int>()}] = s;
    }
  }
  // Experts the durable tier does not hold as new as the fast tier ("not yet persisted").
  std::set<std::pair<int, int>> pending;
  for (const auto& [key, s] : fast_last)
    if (s > durable_last.at(key)) pending.insert(key);
  ASSERT_FALSE(pending.empty());  // K_snapshot 2 > K_persist 1: some copies exist only in the fast tier
  ASSERT_LT(pending.size(), 8u);
  // Raw bytes of the checkpoint at the last step: non-expert files, and each expert's files (MoE layers
  // are transformer layers 1 and 3).
  uint64_t non_expert = 0;
  std::map<std::pair<int, int>, uint64_t> expert_bytes;
  for (const auto& [rel, bytes] : tree_bytes(universal(500))) {
    auto pos = rel.find("deepspeed_experts.");
    if (pos == std::string::npos) {
      non_expert += bytes.size();
      continue;
    }
    int layer = std::stoi(rel.substr(rel.find("layers.") + 7));
    expert_bytes[{layer == 1 ? 0 : 1, std::stoi(rel.substr(pos + 18))}] += bytes.size();
  }
  uint64_t bound = non_expert, objects = 0, on_disk = 0;
  for (const auto& key : pending) bound += expert_bytes.at(key);
  for (const auto& e : fs::recursive_directory_iterator(d + "/fast/objects"))
    if (e.is_regular_file()) {
      ++objects;
      on_disk += e.file_size();
    }
  // Each object adds a 32-byte header and a zstd frame (<= 18 B header + 4 B checksum + 3 B per block).
  EXPECT_LE(on_disk, bound + objects * 64) << "non-expert " << non_expert << ", pending experts " << pending.size();
  // The fast manifests name exactly the pending experts, each at the step the fast tier saved it.
  std::set<std::pair<int, int>> in_fast;
  size_t with_state = 0;
  for (const auto& e : fs::directory_iterator(d + "/fast/manifests")) {
    json m = json::parse(file_bytes(e.path().string()))["manifest"];
    with_state += !m["non_expert_pruned"].get<bool>();
    for (const auto& x : m["experts"]) {
      std::pair<int, int> key{x["moe_layer"].get<int>(), x["expert"].get<int>()};
      EXPECT_TRUE(in_fast.insert(key).second);
      EXPECT_EQ(m["step"].get<int64_t>(), fast_last.at(key));
    }
  }
  EXPECT_EQ(in_fast, pending);
  EXPECT_EQ(with_state, 1u);  // --keep-fast 1: only the latest non-expert state
  // Restore from both tiers: every expert from its newest copy in either tier, bit-exact.
  ASSERT_EQ(restore(d + "/durable", d + "/out", "--fast-store " + d + "/fast", d + "/restore.log"), 0) << file_bytes(d + "/restore.log");
  auto from = restored_steps(report_of(d + "/out"));
  for (const auto& [key, s] : durable_last) EXPECT_EQ(from.at(key), std::max(s, fast_last.count(key) ? fast_last.at(key) : -1));
  auto got = tree_bytes(d + "/out/global_step500");
  ASSERT_EQ(got.size(), tree_bytes(universal(500)).size());
  for (const auto& [rel, bytes] : got) {
    int64_t step = 500;
    auto pos = rel.find("deepspeed_experts.");
    if (pos != std::string::npos) {
      int layer = std::stoi(rel.substr(rel.find("layers.") + 7));
      step = from.at({layer == 1 ? 0 : 1, std::stoi(rel.substr(pos + 18))});
    }
    EXPECT_EQ(bytes, file_bytes(universal(step) + "/" + rel)) << rel;
  }
}

TEST(PecTools, DamagedNewestNonExpertStateFallsBackWithoutStep) {
  std::string d = scratch("ne_damaged");
  save_chain("ds", d + "/store", "--policy sequential --k 1 --keep 2");
  // Damage an object of step 500's non-expert state that step 400 does not share.
  json m500 = json::parse(file_bytes(d + "/store/manifests/step-000000000500.json"))["manifest"];
  json m400 = json::parse(file_bytes(d + "/store/manifests/step-000000000400.json"))["manifest"];
  std::set<std::string> shared;
  for (const auto& f : m400["non_expert"])
    for (const auto& c : f["chunks"]) shared.insert(c["object"].get<std::string>());
  std::string id;
  for (const auto& f : m500["non_expert"])
    for (const auto& c : f["chunks"])
      if (id.empty() && !shared.count(c["object"].get<std::string>())) id = c["object"].get<std::string>();
  ASSERT_FALSE(id.empty());
  {
    std::fstream f(d + "/store/objects/" + id.substr(0, 2) + "/" + id, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    char c = 0x33;
    f.write(&c, 1);
  }
  ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/out.log"), 0) << file_bytes(d + "/out.log");
  EXPECT_NE(file_bytes(d + "/out.log").find("falling back"), std::string::npos) << file_bytes(d + "/out.log");
  json r = report_of(d + "/out");
  EXPECT_EQ(r["step"], 400);
  EXPECT_FALSE(r["warnings"].empty());
  EXPECT_EQ(file_bytes(d + "/out/latest"), "global_step400");
  EXPECT_EQ(verify_native(d + "/out", 400), 0) << file_bytes(d + "/out/verify.log");
  // An explicit --step 500 fails clearly and writes nothing.
  EXPECT_EQ(restore(d + "/store", d + "/o500", "--step 500", d + "/o500.log"), 1);
  EXPECT_NE(file_bytes(d + "/o500.log").find("no intact non-expert state for step 500"), std::string::npos) << file_bytes(d + "/o500.log");
  EXPECT_FALSE(fs::exists(d + "/o500/global_step500"));
}

TEST(PecTools, BudgetReportGivesKPerLayerAndNextBudget) {
  std::string d = scratch("budget_report");
  const uint64_t budget = 200000;
  std::vector<int> last_selection;
  for (int64_t s : {100, 200, 300}) {
    ASSERT_EQ(save(ckpt("ds", s), d + "/store", s,
                   "--policy budget --budget-bytes " + std::to_string(budget) + " --tokens " + tokens(s) + " --json", "",
                   d + "/save.json"),
              0);
    json t = json::parse(file_bytes(d + "/save.json"))["tiers"][0];
    last_selection.clear();
    for (const auto& layer : t["selection"]) last_selection.push_back(static_cast<int>(layer.size()));
  }
  ASSERT_EQ(restore(d + "/store", d + "/out", "--plt-threshold 0", d + "/table.txt"), 0);
  json r = report_of(d + "/out");
  EXPECT_EQ(r["policy"], "budget");
  EXPECT_EQ(r["budget_bytes"].get<uint64_t>(), budget);
  EXPECT_EQ(r["k_per_layer"].get<std::vector<int>>(), last_selection);  // what step 300 saved per layer
  int largest = *std::max_element(last_selection.begin(), last_selection.end());
  EXPECT_GE(largest, 1);
  EXPECT_EQ(r["k"].get<int>(), largest);
  ASSERT_TRUE(r["plt_exceeded"].get<bool>());  // threshold 0
  EXPECT_EQ(r["next_budget_bytes"].get<uint64_t>(), 2 * budget);
  EXPECT_EQ(r["next_k"].get<int>(), std::min(2 * largest, 4));
  EXPECT_NE(file_bytes(d + "/table.txt").find("next budget 400000 B"), std::string::npos) << file_bytes(d + "/table.txt");
}

TEST(PecTools, PlanCountsTheBytesTheStoreReceives) {
  std::string d = scratch("plan_bytes");
  // Checks a plan (JSON) against the manifest of the same step saved for real.
  auto check = [&](const json& plan, const json& manifest, int world) {
    std::map<std::string, uint64_t> stored;  // name in the plan -> bytes the store received
    uint64_t total = 0;
    for (const auto& f : manifest["non_expert"]) {
      stored["durable:" + f["path"].get<std::string>()] = f["size"].get<uint64_t>();
      total += f["size"].get<uint64_t>();
    }
    std::map<std::pair<int, int>, uint64_t> expert;
    for (const auto& e : manifest["experts"])
      for (const auto& f : e["files"]) {
        expert[{e["moe_layer"].get<int>(), e["expert"].get<int>()}] += f["size"].get<uint64_t>();
        total += f["size"].get<uint64_t>();
      }
    ASSERT_EQ(plan["ranks"].size(), static_cast<size_t>(world));
    std::map<std::pair<int, int>, uint64_t> planned_expert;
    std::set<std::string> planned;
    uint64_t sum = 0, lo = UINT64_MAX, hi = 0, largest_module = 0;
    bool cut_seen = false;
    for (const auto& r : plan["ranks"]) {
      uint64_t rank = 0;
      for (const auto& m : r["non_expert"]) {
        std::string name = m["name"].get<std::string>();
        ASSERT_TRUE(stored.count(name)) << name;
        EXPECT_EQ(m["bytes"].get<uint64_t>(), stored.at(name)) << name;
        cut_seen = cut_seen || (name.find("optim_states") != std::string::npos &&
                                stored.at(name) < fs::file_size(step_dir("ds", manifest["step"].get<int64_t>()) + "/" + name.substr(8)));
        planned.insert(name);
        rank += m["bytes"].get<uint64_t>();
        largest_module = std::max(largest_module, m["bytes"].get<uint64_t>());
      }
      for (const auto& e : r["experts"]) {
        planned_expert[{e["moe_layer"].get<int>(), e["expert"].get<int>()}] += e["bytes"].get<uint64_t>();
        rank += e["bytes"].get<uint64_t>();
      }
      EXPECT_EQ(r["bytes"].get<uint64_t>(), rank);
      sum += rank;
      lo = std::min(lo, rank);
      hi = std::max(hi, rank);
    }
    EXPECT_TRUE(cut_seen);  // optimizer shards count their bytes minus the expert fragments
    EXPECT_EQ(planned.size(), stored.size());
    EXPECT_EQ(planned_expert, expert);
    EXPECT_EQ(sum, total);
    EXPECT_EQ(plan["max_rank_bytes"].get<uint64_t>(), hi);
    // Greedy split: no rank exceeds the least loaded one by more than the largest non-expert item.
    EXPECT_LE(hi - lo, largest_module) << "ranks " << lo << ".." << hi;
  };
  save_chain("ds", d + "/one", "--policy sequential --k 1", 2);
  ASSERT_EQ(save(ckpt("ds", 300), d + "/one", 300, "--policy sequential --k 1 --plan", "", d + "/plan1.json"), 0);
  ASSERT_EQ(save(ckpt("ds", 300), d + "/one", 300, "--policy sequential --k 1"), 0);
  check(json::parse(file_bytes(d + "/plan1.json")), json::parse(file_bytes(d + "/one/manifests/step-000000000300.json"))["manifest"], 1);
  if (run_logged("command -v mpirun") != 0) GTEST_SKIP() << "no mpirun";
  const std::string mpi = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 --oversubscribe ";
  const std::string args = " --store " + d + "/one --checkpoint " + ckpt("ds", 400) + " --step 400 --policy sequential --k 1";
  ASSERT_EQ(run_logged(mpi + kBin + "/pec-save" + args + " --plan", d + "/plan2.json"), 0) << file_bytes(d + "/plan2.json");
  ASSERT_EQ(run_logged(mpi + kBin + "/pec-save" + args, d + "/mpi.log"), 0) << file_bytes(d + "/mpi.log");
  check(json::parse(file_bytes(d + "/plan2.json")), json::parse(file_bytes(d + "/one/manifests/step-000000000400.json"))["manifest"], 2);
}

TEST(PecTools, GarbageCollectionSkippedOnADamagedManifestIsReported) {
  std::string d = scratch("gc_skip");
  save_chain("ds", d + "/store", "--policy sequential --k 1 --keep 1", 2);
  {
    std::ofstream f(d + "/store/manifests/step-000000000050.json");
    f << "{\"checksum\": \"0\", \"manifest\": {}}\n";  // a damaged manifest of an older step
  }
  ASSERT_EQ(save(ckpt("ds", 300), d + "/store", 300, "--policy sequential --k 1 --tokens " + tokens(300), "", d + "/save.log"), 0);
  EXPECT_NE(file_bytes(d + "/save.log").find("garbage collection"), std::string::npos) << file_bytes(d + "/save.log");
  EXPECT_TRUE(fs::exists(d + "/store/manifests/step-000000000200.json"));  // nothing was collected
}

TEST(PecTools, TokenFormatsPlanAndExitCodes) {
  std::string d = scratch("cli");
  EXPECT_EQ(save(ckpt("ds", 100), d + "/s", 100, "--policy load-aware --k 1 --tokens " + kFx + "/tokens/fixed.csv"), 0);
  EXPECT_EQ(save(ckpt("ds", 200), d + "/s", 200, "--policy budget --budget-bytes 200000 --tokens " + kFx + "/tokens/fixed.jsonl"), 0);
  EXPECT_EQ(save(ckpt("ds", 300), d + "/s", 300, "--policy sequential --k 1 --plan", "", d + "/plan.json"), 0);
  json plan = json::parse(file_bytes(d + "/plan.json"));
  EXPECT_EQ(plan["world_size"], 1);
  EXPECT_EQ(plan["ranks"].size(), 1u);
  EXPECT_FALSE(fs::exists(d + "/s/manifests/step-000000000300.json"));
  // --plan for a store that does not exist yet plans a first save and creates nothing.
  EXPECT_EQ(save(ckpt("ds", 300), d + "/new", 300, "--policy sequential --k 1 --plan", "", d + "/plan_new.json"), 0);
  EXPECT_FALSE(fs::exists(d + "/new"));
  EXPECT_EQ(json::parse(file_bytes(d + "/plan_new.json"))["ranks"].size(), 1u);
  std::ofstream(d + "/afile") << "x";  // --plan refuses what the save would: a store that is a file
  EXPECT_EQ(save(ckpt("ds", 300), d + "/afile", 300, "--policy sequential --k 1 --plan"), 1);
  EXPECT_EQ(save(ckpt("ds", 300), d + "/s", 300, "--policy sequential"), 2);            // no --k
  EXPECT_EQ(save(ckpt("ds", 300), d + "/s", 300, "--policy nope --k 1"), 2);            // unknown policy
  EXPECT_EQ(save(ckpt("ds", 300), d + "/s", 300, "--policy load-aware --k 1"), 2);      // needs tokens
  EXPECT_EQ(save(d + "/missing", d + "/s", 300, "--policy sequential --k 1"), 1);       // no checkpoint
  EXPECT_EQ(save(ckpt("ds", 100), d + "/s", 100, "--policy sequential --k 1"), 1);      // step not newer
  EXPECT_EQ(restore(d + "/nostore", d + "/o", ""), 1);
  // A --memory-mb below one worker's buffers: exit 2 before anything is written, --plan alike.
  EXPECT_EQ(restore(d + "/s", d + "/small", "--memory-mb 1"), 2);
  EXPECT_EQ(restore(d + "/s", d + "/small", "--memory-mb 1 --plan"), 2);
  EXPECT_FALSE(fs::exists(d + "/small"));
  EXPECT_EQ(run_logged(kBin + "/pec-restore --output x"), 2);
  EXPECT_EQ(run_logged(kBin + "/pec-save --version"), 0);
  EXPECT_EQ(run_logged(kBin + "/pec-restore --store " + d + "/s --output " + d + "/o --json -q", d + "/restore.json"), 0);
  json s = json::parse(file_bytes(d + "/restore.json"));
  EXPECT_EQ(s["step"], 200);
}

// Issue 21: an error on one rank only (UCPKIT_PEC_FAIL_AFTER=1: an I/O failure at its first crash
// point) must end every rank with that error; before the failure protocol, rank 0 waited for the
// failed rank in the gather forever (the timeout below then gives 124).
TEST(PecTools, MpiSaveFailingOnOneRankEndsEveryRank) {
  if (run_logged("command -v mpirun") != 0) GTEST_SKIP() << "no mpirun";
  std::string d = scratch("mpi_fail");
  const std::string args = " --store " + d + "/s --checkpoint " + ckpt("ds", 100) + " --step 100 --policy sequential --k 1";
  for (int failing : {1, 0}) {
    std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --oversubscribe";
    for (int r = 0; r < 2; ++r)
      cmd += std::string(r ? " :" : "") + " -np 1 " + (r == failing ? "env UCPKIT_PEC_FAIL_AFTER=1 " : "") + kBin + "/pec-save" + args;
    const std::string log = d + "/fail" + std::to_string(failing) + ".log";
    const int rc = run_logged(cmd + " < /dev/null", log);
    EXPECT_NE(rc, 124) << "a rank still waited after 120 s (rank " << failing << " failed)\n" << file_bytes(log);
    EXPECT_EQ(rc, 1) << file_bytes(log);
    EXPECT_NE(file_bytes(log).find("fault injection: failed at crash point 1"), std::string::npos) << file_bytes(log);
    EXPECT_FALSE(fs::exists(d + "/s/manifests/step-000000000100.json")) << "a step was committed";
  }
  const std::string mpi = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 --oversubscribe ";
  ASSERT_EQ(run_logged(mpi + kBin + "/pec-save" + args + " < /dev/null", d + "/ok.log"), 0) << file_bytes(d + "/ok.log");
  ASSERT_EQ(restore(d + "/s", d + "/o", ""), 0);
  EXPECT_EQ(verify_native(d + "/o", 100), 0) << file_bytes(d + "/o/verify.log");
}

TEST(PecTools, MpiSaveMatchesSingleProcess) {
  if (run_logged("command -v mpirun") != 0) GTEST_SKIP() << "no mpirun";
  std::string d = scratch("mpi");
  const std::string mpi = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 --oversubscribe ";
  for (int64_t s : {100, 200, 300}) {
    std::string args = " --checkpoint " + ckpt("ds", s) + " --step " + std::to_string(s) + " --policy sequential --k 1 --tokens " + tokens(s);
    ASSERT_EQ(run_logged(mpi + kBin + "/pec-save --store " + d + "/mpi" + args, d + "/mpi.log"), 0) << file_bytes(d + "/mpi.log");
    ASSERT_EQ(run_logged(kBin + "/pec-save --store " + d + "/one" + args), 0);
  }
  ASSERT_EQ(run_logged(mpi + kBin + "/pec-save --store " + d + "/mpi --checkpoint " + ckpt("ds", 400) +
                   " --step 400 --policy sequential --k 1 --plan", d + "/plan.json"), 0);
  json plan = json::parse(file_bytes(d + "/plan.json"));
  ASSERT_EQ(plan["ranks"].size(), 2u);
  for (const auto& r : plan["ranks"]) EXPECT_GT(r["bytes"].get<uint64_t>(), 0u);  // both ranks write
  ASSERT_EQ(restore(d + "/mpi", d + "/o_mpi", ""), 0);
  ASSERT_EQ(restore(d + "/one", d + "/o_one", ""), 0);
  EXPECT_EQ(tree_bytes(d + "/o_mpi/global_step300"), tree_bytes(d + "/o_one/global_step300"));
  EXPECT_EQ(verify_native(d + "/o_mpi", 300), 0) << file_bytes(d + "/o_mpi/verify.log");
  // pec-restore under mpirun: the ranks write disjoint files of one folder; same bytes, same report.
  ASSERT_EQ(run_logged(mpi + kBin + "/pec-restore --store " + d + "/one --output " + d + "/r_mpi --report " + d + "/r_mpi.json",
               d + "/r_mpi.log"), 0) << file_bytes(d + "/r_mpi.log");
  EXPECT_EQ(tree_bytes(d + "/r_mpi/global_step300"), tree_bytes(d + "/o_one/global_step300"));
  EXPECT_EQ(file_bytes(d + "/r_mpi/latest"), "global_step300");
  json a = json::parse(file_bytes(d + "/r_mpi.json")), b = report_of(d + "/o_one");
  EXPECT_EQ(a["experts"], b["experts"]);
  EXPECT_EQ(a["plt"], b["plt"]);
  // A damaged newest copy under MPI: every rank moves that expert to its older copy together.
  json m = json::parse(file_bytes(d + "/one/manifests/step-000000000300.json"))["manifest"];
  for (const auto& f : m["experts"][0]["files"]) {
    std::string id = f["chunks"][0]["object"].get<std::string>();
    std::fstream o(d + "/one/objects/" + id.substr(0, 2) + "/" + id, std::ios::in | std::ios::out | std::ios::binary);
    o.seekp(40);
    o.put(0x5a);
  }
  ASSERT_EQ(run_logged(mpi + kBin + "/pec-restore --store " + d + "/one --output " + d + "/r_bad --report " + d + "/r_bad.json",
               d + "/r_bad.log"), 0) << file_bytes(d + "/r_bad.log");
  json bad = json::parse(file_bytes(d + "/r_bad.json"));
  const int layer = m["experts"][0]["moe_layer"].get<int>(), expert = m["experts"][0]["expert"].get<int>();
  EXPECT_LT(restored_steps(bad).at({layer, expert}), 300);
  std::string rep = d + "/r_bad/report.json";
  fs::copy_file(d + "/r_bad.json", rep);
  EXPECT_EQ(verify_native(d + "/r_bad", 300), 0) << file_bytes(d + "/r_bad/verify.log");
}

// ---- DeepSpeed AutoEP under ZeRO-3 (partition-native, tests/generator/dsgen/autoep.py zero=3): no expert
// files; every expert lives in its rows of the fused w1/w2/w3 inside each rank's ZeRO-3 sub-group
// partitions (fp32_flat_groups, exp_avg, exp_avg_sq). Fixture chains (tests/pec/fixtures.py):
// autoep_z3 (DP 4, EP 2, bf16) and autoep_z3_dbe (DP 6, EP 2, fp16, expert-DP ranks first, padded
// partitions), steps 100-300, each with its own values and universal truth.
namespace {
// tests/pec/verify_autoep_zero3.py: with torch.load and zipfile only, every restored file against the
// chain (expert elements from the step the report names, everything else the target step's, CRCs
// right), and with `universal` (ucp-union of the restored folder) the universal values against truth.
int verify_autoep_zero3(const std::string& out, int64_t step, const std::string& family, const std::string& universal) {
  std::string cmd = std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR + "/tests/pec/verify_autoep_zero3.py " + out +
                    "/global_step" + std::to_string(step) + " " + out + "/report.json " + std::to_string(step);
  for (int64_t s : kSteps)
    if (fs::exists(step_dir(family, s))) cmd += " " + std::to_string(s) + "=" + ckpt(family, s);
  if (!universal.empty()) cmd += " --universal " + universal;
  return run_logged(cmd, out + "/verify.log");
}
}  // namespace

class PecAutoEpZero3 : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

// K = 1 of 4 experts per layer over three steps (the first save also saves every expert): the newest
// step restores with each expert from its last save, checked file by file in Python and through
// ucp-union against the generator's truth of each step.
TEST_P(PecAutoEpZero3, ChainRestoresEachExpertFromItsLastSave) {
  const std::string family = std::get<0>(GetParam()), policy = std::get<1>(GetParam());
  const std::string d = scratch("z3_" + family + "_" + policy);
  save_chain(family, d + "/store", "--policy " + policy + " --k 1");
  ASSERT_EQ(restore(d + "/store", d + "/out", "", d + "/restore.log"), 0) << file_bytes(d + "/restore.log");
  EXPECT_EQ(file_bytes(d + "/out/latest"), "global_step300");
  const json r = report_of(d + "/out");
  EXPECT_EQ(r["step"], 300);
  EXPECT_EQ(r["layout"], "deepspeed-autoep-zero3");
  EXPECT_EQ(r["experts"].size(), 8u);
  std::map<int64_t, int> from;
  for (const auto& [k, s] : restored_steps(r)) ++from[s];
  EXPECT_EQ(from[300], 2) << r["experts"].dump();  // K = 1 per layer saved at the target step
  EXPECT_GT(from.size(), 1u);
  ASSERT_EQ(run_logged(kBin + "/ucp-union -q --input " + d + "/out --output " + d + "/u", d + "/u.log"), 0) << file_bytes(d + "/u.log");
  EXPECT_EQ(verify_autoep_zero3(d + "/out", 300, family, d + "/u"), 0) << file_bytes(d + "/out/verify.log");
}

INSTANTIATE_TEST_SUITE_P(Chains, PecAutoEpZero3,
                         ::testing::Values(std::make_tuple("autoep_z3", "sequential"), std::make_tuple("autoep_z3", "load-aware"),
                                           std::make_tuple("autoep_z3_dbe", "sequential"),
                                           std::make_tuple("autoep_z3_dbe", "load-aware")),
                         [](const auto& info) {
                           std::string n = std::string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// What a step saved whole restores byte for byte (the bootstrap save, and K = E); a K = 1 save stores
// the shards minus the expert rows plus one expert per layer.
TEST(PecAutoEpZero3Store, WholeStepsRestoreByteIdenticalAndPartialSavesStoreLess) {
  const std::string d = scratch("z3_bytes");
  save_chain("autoep_z3", d + "/store", "--policy sequential --k 1 --keep 3");
  ASSERT_EQ(restore(d + "/store", d + "/o100", "--step 100", d + "/r.log"), 0) << file_bytes(d + "/r.log");
  EXPECT_EQ(tree_bytes(d + "/o100/global_step100"), tree_bytes(step_dir("autoep_z3", 100)));
  ASSERT_EQ(save(ckpt("autoep_z3", 300), d + "/all", 300, "--policy sequential --k 4"), 0);
  ASSERT_EQ(restore(d + "/all", d + "/o300", "", d + "/r.log"), 0) << file_bytes(d + "/r.log");
  EXPECT_EQ(tree_bytes(d + "/o300/global_step300"), tree_bytes(step_dir("autoep_z3", 300)));
  // Step 300 of the K = 1 chain: the store received the non-expert bytes (shards with every expert row
  // cut out, model files whole) and the rows of the two experts selected.
  const json m = json::parse(file_bytes(d + "/store/manifests/step-000000000300.json"))["manifest"];
  uint64_t non_expert = 0, expert = 0, full = 0, cut = 0;
  for (const auto& f : m["non_expert"]) {
    non_expert += f["size"].get<uint64_t>();
    if (f.contains("cut") && !f["cut"].is_null()) {
      const uint64_t size = f["cut"]["file_size"].get<uint64_t>();
      EXPECT_EQ(size, fs::file_size(step_dir("autoep_z3", 300) + "/" + f["path"].get<std::string>()));
      uint64_t n = 0;
      for (const auto& c : f["cut"]["cut"]) n += c[1].get<uint64_t>();
      EXPECT_EQ(f["size"].get<uint64_t>() + n, size);
      cut += n;
    }
  }
  EXPECT_EQ(m["experts"].size(), 2u);
  for (const auto& e : m["experts"])
    for (const auto& f : e["files"]) {
      EXPECT_TRUE(f.contains("ranges") && !f["ranges"].is_null());  // rows inside the shards, no expert files
      expert += f["size"].get<uint64_t>();
    }
  for (const auto& e : fs::directory_iterator(step_dir("autoep_z3", 300))) full += fs::file_size(e.path());
  EXPECT_EQ(non_expert + cut, full);                    // every byte is either stored or an expert row
  EXPECT_EQ(expert * 4, cut);                           // 2 of 8 experts, all experts of the same size
  EXPECT_LT(non_expert + expert, full);
}

// Bad input as for the other layouts: a truncated shard or model file, a rank whose recorded place
// contradicts its shard: exit 1, one line naming the file, no store. --ds-version (native MoE only) is
// a usage error before anything is written.
TEST(PecAutoEpZero3Store, BadInputFailsClearlyAndStoresNothing) {
  const std::string d = scratch("z3_bad");
  const std::string tag = "/global_step100/";
  for (const char* name : {"bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_pp_rank_2_mp_rank_00_model_states.pt"}) {
    const std::string c = d + "/c_" + name;
    fs::copy(ckpt("autoep_z3", 100), c, fs::copy_options::recursive);
    fs::resize_file(c + tag + name, fs::file_size(c + tag + name) / 2);
    const std::string store = d + "/store_" + name;
    EXPECT_EQ(save(c, store, 100, "--policy sequential --k 1", "", d + "/log"), 1) << name << ": " << file_bytes(d + "/log");
    const std::string log = file_bytes(d + "/log");
    EXPECT_NE(log.find(name), std::string::npos) << log;
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
    EXPECT_FALSE(fs::exists(store)) << name;
  }
  {
    const std::string c = kFx + "/autoep_z3_bad_place";
    const std::string store = d + "/store_place";
    EXPECT_EQ(save(c, store, 100, "--policy sequential --k 1", "", d + "/log"), 1) << file_bytes(d + "/log");
    const std::string log = file_bytes(d + "/log");
    EXPECT_NE(log.find("zero_pp_rank_2_mp_rank_00"), std::string::npos) << log;
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
    EXPECT_FALSE(fs::exists(store));
  }
  ASSERT_EQ(save(ckpt("autoep_z3", 100), d + "/store", 100, "--policy sequential --k 1"), 0);
  EXPECT_EQ(restore(d + "/store", d + "/out", "--ds-version 0.19.5", d + "/log"), 2) << file_bytes(d + "/log");
  EXPECT_NE(file_bytes(d + "/log").find("--ds-version"), std::string::npos) << file_bytes(d + "/log");
  EXPECT_FALSE(fs::exists(d + "/out")) << "the refusal left the output folder behind";
}

}  // namespace pec_tools_test
