// Paths from files are confined (issue "Reliability" item 5): ucp-union copied whatever file a work
// folder's plan.json named, ucp-load opened any path in manifest.json, pec-restore wrote (and read)
// outside its output and store folders through a store manifest whose checksum anyone can recompute.
// Names must be relative, normalized and inside their folder; object ids must be object ids. Each
// case first makes the tool's own output, then points one name outside at a valid copy of the same
// file (so nothing but the path is wrong): the tool must refuse, naming the file the path came from,
// and touch nothing outside its output.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "pec/checksum.h"
#include "support/paths.h"
#include "support/process.h"

namespace confine_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::testing::quote;
using ucpkit::testing::run_command;
using ucpkit::testing::scratch_dir;

namespace {

json read_json(const fs::path& p) {
  std::ifstream in(p);
  json j;
  in >> j;
  return j;
}

void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(1); }

size_t entries(const fs::path& dir) { return std::distance(fs::directory_iterator(dir), fs::directory_iterator()); }

// Runs `cmd`; it must fail (exit 1) naming `source` and `name`, and leave `out` uncreated.
void expect_refused(const std::string& cmd, const std::string& source, const std::string& name, const fs::path& out) {
  std::string log;
  EXPECT_EQ(run_command(cmd, &log), 1) << log;
  EXPECT_NE(log.find(source), std::string::npos) << log;
  EXPECT_NE(log.find("'" + name + "' is not a relative path inside"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out)) << log;
}

}  // namespace

TEST(Confine, UnionReadsOnlyFilesInsideTheWorkFolder) {
  const fs::path d = scratch_dir("confine_work");
  const fs::path w = d / "w";
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-extract -q --no-sync --input " + kFx + "/gpt --output " + quote(w.string()), &log), 0) << log;
  const json plan = read_json(w / "plan.json");
  const std::string union_cmd = kBin + "/ucp-union -q --no-sync --input " + quote(w.string()) + " --output " + quote((d / "u").string());
  {  // a model file beside the work folder (a copy of the right one)
    fs::copy_file(w / plan["model_files"][0].get<std::string>(), d / "outside.pt");
    json p = plan;
    p["model_files"][0] = "../outside.pt";
    write_json(w / "plan.json", p);
    expect_refused(union_cmd, "plan.json", "../outside.pt", d / "u");
  }
  {  // a fragment file by absolute path (a copy of the right one)
    const std::string abs = (d / "fragment.pt").string();
    fs::copy_file(w / plan["files"][0].get<std::string>(), abs);
    json p = plan;
    p["files"][0] = abs;
    write_json(w / "plan.json", p);
    expect_refused(union_cmd, "plan.json", abs, d / "u");
  }
  {  // any file of the machine as the optimizer state
    json p = plan;
    p["optimizer_state_file"] = "/etc/hostname";
    write_json(w / "plan.json", p);
    expect_refused(union_cmd, "plan.json", "/etc/hostname", d / "u");
  }
  {  // "." and empty parts are not normal form either
    json p = plan;
    p["optimizer_state_file"] = "./optimizer_state.pt";
    write_json(w / "plan.json", p);
    expect_refused(union_cmd, "plan.json", "./optimizer_state.pt", d / "u");
  }
  {  // a parameter named ".." would be written beside zero/<param>/
    json p = plan;
    p["params"][0]["name"] = "..";
    write_json(w / "plan.json", p);
    EXPECT_EQ(run_command(union_cmd, &log), 1) << log;
    EXPECT_NE(log.find("parameter name '..' cannot name a folder"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(d / "u"));
  }
  write_json(w / "plan.json", plan);  // control: the unchanged plan converts
  EXPECT_EQ(run_command(union_cmd, &log), 0) << log;
  fs::remove_all(d);
}

TEST(Confine, LoadOpensOnlyFilesInsideTheUniversalFolder) {
  const fs::path d = scratch_dir("confine_load");
  const fs::path u = d / "u";
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --no-sync --input " + kFx + "/gpt --output " + quote(u.string()), &log), 0) << log;
  const json manifest = read_json(u / "manifest.json");
  const std::string load_cmd = kBin + "/ucp-load -q --no-sync --tp 1 --pp 1 --dp 2 --zero-stage 1 --input " + quote(u.string()) +
                               " --output " + quote((d / "t").string());
  {  // a state file beside the universal folder
    const std::string rel = manifest["params"][0]["states"]["fp32"]["file"];
    fs::create_directories(d / "elsewhere");
    fs::copy_file(u / rel, d / "elsewhere" / "fp32.pt");
    json m = manifest;
    m["params"][0]["states"]["fp32"]["file"] = "../elsewhere/fp32.pt";
    write_json(u / "manifest.json", m);
    expect_refused(load_cmd, "manifest.json", "../elsewhere/fp32.pt", d / "t");
  }
  {  // a model file by absolute path
    const std::string abs = (d / "model.pt").string();
    fs::copy_file(u / manifest["model_files"][0].get<std::string>(), abs);
    json m = manifest;
    m["model_files"][0] = abs;
    write_json(u / "manifest.json", m);
    expect_refused(load_cmd, "manifest.json", abs, d / "t");
  }
  write_json(u / "manifest.json", manifest);
  EXPECT_EQ(run_command(load_cmd, &log), 0) << log;
  fs::remove_all(d);
}

// pec-restore: a store manifest (checksum recomputed, as anyone can) whose file path climbs out of
// the checkpoint folder, or whose object id climbs out of objects/.
TEST(Confine, RestoreStaysInsideItsOutputAndStore) {
  const fs::path d = scratch_dir("confine_pec");
  const fs::path store = d / "store";
  std::string log;
  ASSERT_EQ(run_command(kBin + "/pec-save -q --checkpoint " + kFx + "/moe --store " + quote(store.string()) + " --step 10 --policy sequential --k 2", &log), 0)
      << log;
  const fs::path mpath = store / "manifests" / "step-000000000010.json";
  const json original = read_json(mpath);
  auto forge = [&](const std::function<void(json&)>& change) {
    json j = original;
    change(j["manifest"]);
    j["checksum"] = ucpkit::pec::digest(j["manifest"].dump()).hex();
    write_json(mpath, j);
  };
  const fs::path out = d / "out" / "restored";
  fs::create_directories(out.parent_path());
  const std::string restore_cmd = kBin + "/pec-restore -q --store " + quote(store.string()) + " --output " + quote(out.string());

  forge([](json& m) { m["non_expert"][0]["path"] = "../../escaped.pt"; });
  EXPECT_EQ(run_command(restore_cmd, &log), 1) << log;
  EXPECT_NE(log.find("step-000000000010.json"), std::string::npos) << log;
  EXPECT_NE(log.find("'../../escaped.pt' is not a relative path inside"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(d / "out" / "escaped.pt"));
  EXPECT_FALSE(fs::exists(d / "escaped.pt"));
  EXPECT_EQ(entries(d), 2u) << "something was written beside the store and the output";

  forge([](json& m) { m["non_expert"][0]["path"] = "/tmp/ucpkit_confine_escaped.pt"; });
  EXPECT_EQ(run_command(restore_cmd, &log), 1) << log;
  EXPECT_FALSE(fs::exists("/tmp/ucpkit_confine_escaped.pt"));

  forge([](json& m) { m["non_expert"][0]["chunks"][0]["object"] = "../../../../../etc/hostname"; });
  EXPECT_EQ(run_command(restore_cmd, &log), 1) << log;
  EXPECT_NE(log.find("object id '../../../../../etc/hostname' is not 32 lowercase hex digits"), std::string::npos) << log;

  write_json(mpath, original);  // control
  EXPECT_EQ(run_command(restore_cmd, &log), 0) << log;
  EXPECT_TRUE(fs::exists(out / "global_step10"));
  fs::remove_all(d);
}

}  // namespace confine_test
