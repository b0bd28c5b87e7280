// pec-save on a universal checkpoint that ucp-union wrote: which zero/<param>/ folders hold which
// (MoE layer, expert) comes from its manifest.json (formats/universal/manifest.h), and is the same as
// what the folder names give for a universal folder without one (ds_to_universal's); a manifest that
// lists an expert the folder lacks, or is malformed, is refused naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/paths.h"
#include "support/process.h"
#include "support/files.h"

namespace universal_manifest_source_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::testing::run_command;

using ucpkit::testing::file_bytes;

namespace {

// (MoE layer, expert) -> the stored files' paths, and experts per layer, from the store's one manifest.
std::pair<std::map<std::pair<int, int>, std::vector<std::string>>, json> stored_experts(const fs::path& store) {
  std::map<std::pair<int, int>, std::vector<std::string>> out;
  json per_layer;
  int manifests = 0;
  for (const auto& e : fs::recursive_directory_iterator(store))
    if (e.path().parent_path().filename() == "manifests" && e.path().extension() == ".json") {
      ++manifests;
      const json m = json::parse(file_bytes(e.path()))["manifest"];
      per_layer = m["experts_per_layer"];
      for (const auto& x : m["experts"])
        for (const auto& f : x["files"]) out[{x["moe_layer"].get<int>(), x["expert"].get<int>()}].push_back(f["path"]);
    }
  EXPECT_EQ(manifests, 1) << store;
  return {out, per_layer};
}

std::map<std::string, std::string> tree_bytes(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out[fs::relative(e.path(), root).string()] = file_bytes(e.path());
  return out;
}

int save(const fs::path& src, const fs::path& store, std::string* out) {
  return run_command(kBin + "/pec-save -q --checkpoint " + src.string() + " --store " + store.string() +
                         " --step 100 --policy sequential --k 1 --ep 2",
                     out);
}
}  // namespace

TEST(PecUniversalManifest, ExpertsFromTheManifestAreThoseOfTheFolderNames) {
  const fs::path d = ucpkit::testing::scratch_dir("pec_universal_manifest");
  std::string out;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + kFx + "/ds/step100 --output " + (d / "u").string(), &out), 0) << out;
  const json manifest = json::parse(file_bytes(d / "u" / "manifest.json"));
  size_t expert_files = 0;  // each expert parameter's state files and step.pt
  for (const auto& p : manifest["params"])
    if (p.contains("expert")) expert_files += p["states"].size() + (p["step"].get<bool>() ? 1 : 0);
  ASSERT_GT(expert_files, 0u) << "the fixture has no native MoE expert";
  fs::copy(d / "u", d / "nameonly", fs::copy_options::recursive);
  fs::remove(d / "nameonly" / "manifest.json");

  ASSERT_EQ(save(d / "u", d / "store_manifest", &out), 0) << out;
  ASSERT_EQ(save(d / "nameonly", d / "store_names", &out), 0) << out;
  const auto [by_manifest, layers] = stored_experts(d / "store_manifest");
  const auto [by_names, layers_names] = stored_experts(d / "store_names");
  EXPECT_EQ(layers, layers_names);
  EXPECT_EQ(by_manifest, by_names);
  size_t files = 0;
  for (const auto& [key, paths] : by_manifest) files += paths.size();
  EXPECT_EQ(files, expert_files);

  // The restore gives back the universal folder byte for byte.
  ASSERT_EQ(run_command(kBin + "/pec-restore -q --store " + (d / "store_manifest").string() + " --output " +
                            (d / "restored").string(),
                        &out),
            0)
      << out;
  EXPECT_EQ(tree_bytes(d / "restored" / "global_step100"), tree_bytes(d / "u"));
}

TEST(PecUniversalManifest, AnExpertTheFolderLacksOrABadManifestIsRefused) {
  const fs::path d = ucpkit::testing::scratch_dir("pec_universal_manifest_bad");
  std::string out;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + kFx + "/ds/step100 --output " + (d / "u").string(), &out), 0) << out;
  json manifest = json::parse(file_bytes(d / "u" / "manifest.json"));
  // The last expert of the last MoE layer: without the manifest nothing would tell it is missing.
  size_t last = 0;
  for (size_t i = 0; i < manifest["params"].size(); ++i)
    if (manifest["params"][i].contains("expert")) last = i;
  const std::string file = manifest["params"][last]["states"]["fp32"]["file"];
  const fs::path folder = fs::path(file).parent_path();
  fs::copy(d / "u", d / "gone", fs::copy_options::recursive);
  fs::remove_all(d / "gone" / folder);
  EXPECT_EQ(save(d / "gone", d / "store_gone", &out), 1) << out;
  EXPECT_NE(out.find((d / "gone" / "manifest.json").string() + ": expert parameter folder " + folder.string() + " has no files"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(d / "store_gone" / "manifests")) << "nothing committed";

  fs::copy(d / "u", d / "bad", fs::copy_options::recursive);
  manifest["params"][last]["expert"]["layer"] = "one";
  std::ofstream(d / "bad" / "manifest.json") << manifest.dump(1);
  EXPECT_EQ(save(d / "bad", d / "store_bad", &out), 1) << out;
  EXPECT_NE(out.find((d / "bad" / "manifest.json").string() + ": malformed: params[" + std::to_string(last) +
                     "].expert.layer must be an integer"),
            std::string::npos)
      << out;
}

}  // namespace universal_manifest_source_test
