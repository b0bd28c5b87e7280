// ucp-load trusted manifest.json's shape when its element count matched the stored tensor (issue
// "Reliability" item 8): a transposed shape cut the TP slices along the wrong rows, exit 0. The
// stored tensor's own shape must be the manifest's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/process.h"

namespace load_shape_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::testing::quote;
using ucpkit::testing::run_command;
using ucpkit::testing::scratch_dir;

TEST(LoadShape, ManifestShapeMustBeTheStoredShape) {
  const std::string bin = UCPKIT_BIN_DIR, fx = UCPKIT_FIXTURES_DIR;
  const fs::path d = scratch_dir("load_shape");
  const fs::path u = d / "u";
  std::string log;
  ASSERT_EQ(run_command(bin + "/ucp-union -q --no-sync --input " + fx + "/gpt --output " + quote(u.string()), &log), 0) << log;
  json m;
  std::ifstream(u / "manifest.json") >> m;
  const json original = m;
  // A column-parallel [ffn, hidden] weight recorded as [hidden, ffn]: same element count, and TP 2
  // still divides the first dimension.
  std::string name;
  for (auto& p : m["params"])
    if (p["name"].get<std::string>().find("dense_h_to_4h.weight") != std::string::npos) {
      name = p["name"];
      auto shape = p["shape"].get<std::vector<int64_t>>();
      ASSERT_EQ(shape.size(), 2u);
      ASSERT_NE(shape[0], shape[1]);
      p["shape"] = std::vector<int64_t>{shape[1], shape[0]};
      break;
    }
  ASSERT_FALSE(name.empty()) << "no dense_h_to_4h weight in the fixture";
  std::ofstream(u / "manifest.json") << m.dump(1);
  const std::string load = bin + "/ucp-load -q --no-sync --tp 2 --pp 1 --dp 1 --zero-stage 1 --input " + quote(u.string()) +
                           " --output " + quote((d / "t").string());
  EXPECT_EQ(run_command(load, &log), 1) << log;
  EXPECT_NE(log.find(name), std::string::npos) << log;  // the state file's path names the parameter
  EXPECT_NE(log.find("state tensor has shape"), std::string::npos) << log;
  EXPECT_NE(log.find("but manifest.json says"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(d / "t"));
  // --no-verify skips the checksums, not the shape.
  EXPECT_EQ(run_command(load + " --no-verify", &log), 1) << log;
  EXPECT_FALSE(fs::exists(d / "t"));
  std::ofstream(u / "manifest.json") << original.dump(1);  // control
  EXPECT_EQ(run_command(load, &log), 0) << log;
  fs::remove_all(d);
}

}  // namespace load_shape_test
