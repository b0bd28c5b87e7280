// moe-replace cases of issue 16's "should fix" list: an absurd --added-nodes is refused before any
// memory is taken, a failing --svg write leaves no plan behind, --svg-layer out of range is a usage
// error, and a value of the wrong JSON type is one line naming the file and the key. Each case fails
// on the code before the fix (bad_alloc under a memory limit, a plan written, exit 0, nlohmann's text
// without the file or key).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include "support/paths.h"
#include "support/process.h"
#include "support/files.h"

namespace moe_replace_test {

namespace fs = std::filesystem;

using ucpkit::testing::file_bytes;

namespace {

// Exit status of `cmd`, stdout and stderr in *out.
int sh(const std::string& cmd, std::string* out = nullptr) { return ucpkit::testing::run_command_status(cmd, out); }

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ucpkit_moe_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

void expect_one_line(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  EXPECT_EQ(s.find('\n'), std::string::npos) << out;
  EXPECT_LE(s.size(), 300u) << out;
  EXPECT_EQ(s.find("json.exception"), std::string::npos) << out;
}

std::string cluster(const fs::path& d) {
  return " --loads " + (d / "loads.json").string() + " --nodes 2 --gpus-per-node 2 --slots-per-gpu 2";
}

}  // namespace

// --added-nodes 2000000000 built the list of 2e9 node ids (8 GB) before the cluster size check
// refused it; under a 1 GB address-space limit that was std::bad_alloc, exit 1.
TEST(MoeReplaceInput, AbsurdAddedNodesRefusedBeforeAllocating) {
  const fs::path d = scratch("added");
  write(d / "loads.json", "[[1, 2, 3, 4], [4, 3, 2, 1]]");
  std::string out;
  ASSERT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + " --output " + (d / "cur.json").string(), &out), 0) << out;
  for (const char* added : {"2000000000", "600000000"}) {
    EXPECT_EQ(sh("ulimit -v 1000000; " + kBin + "/moe-replace -q" + cluster(d) + " --current " + (d / "cur.json").string() +
                     " --added-nodes " + added + " --output " + (d / "next.json").string(),
                 &out),
              2)
        << added << ": " << out;
    EXPECT_NE(out.find("--added-nodes"), std::string::npos) << out;
    expect_one_line(out);
    EXPECT_FALSE(fs::exists(d / "next.json"));
  }
  // A sane number of added nodes still plans.
  EXPECT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + " --current " + (d / "cur.json").string() +
                   " --added-nodes 2 --output " + (d / "next.json").string(),
               &out),
            0)
      << out;
  fs::remove_all(d);
}

// The plan was renamed into place before the SVG was written; an SVG path that cannot take the file
// (here an existing folder) then failed with exit 1 and the plan left behind.
TEST(MoeReplaceOutput, FailingSvgLeavesNoPlan) {
  const fs::path d = scratch("svg");
  write(d / "loads.json", "[[1, 2, 3, 4], [4, 3, 2, 1]]");
  fs::create_directories(d / "drawing.svg");
  std::string out;
  EXPECT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + " --output " + (d / "plan.json").string() + " --svg " +
                   (d / "drawing.svg").string(),
               &out),
            1)
      << out;
  EXPECT_NE(out.find("drawing.svg"), std::string::npos) << out;
  expect_one_line(out);
  EXPECT_FALSE(fs::exists(d / "plan.json"));
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "temporary left: " << e.path();
  // With --previous too (the SVG was not drawn there at all: an empty file was written).
  ASSERT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + " --output " + (d / "prev.json").string(), &out), 0) << out;
  EXPECT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + " --previous " + (d / "prev.json").string() + " --output " +
                   (d / "plan.json").string() + " --svg " + (d / "re.svg").string(),
               &out),
            0)
      << out;
  EXPECT_NE(file_bytes(d / "re.svg").find("<svg"), std::string::npos);
  EXPECT_NE(file_bytes(d / "re.svg").find("previous plan"), std::string::npos);
  fs::remove_all(d);
}

// --svg-layer beyond the loads' layers (or negative) drew layer 0 / the last one and exited 0.
TEST(MoeReplaceInput, SvgLayerOutOfRangeIsAUsageError) {
  const fs::path d = scratch("svglayer");
  write(d / "loads.json", "[[1, 2, 3, 4], [4, 3, 2, 1]]");
  std::string out;
  for (const char* layer : {"2", "-1", "99"}) {
    EXPECT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + " --output " + (d / "plan.json").string() + " --svg " +
                     (d / "p.svg").string() + " --svg-layer " + layer,
                 &out),
              2)
        << layer << ": " << out;
    EXPECT_NE(out.find("--svg-layer"), std::string::npos) << out;
    expect_one_line(out);
    EXPECT_FALSE(fs::exists(d / "plan.json"));
    EXPECT_FALSE(fs::exists(d / "p.svg"));
  }
  // --svg-layer without --svg has nothing to draw.
  EXPECT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + " --output " + (d / "plan.json").string() + " --svg-layer 1", &out),
            2)
      << out;
  EXPECT_FALSE(fs::exists(d / "plan.json"));
  EXPECT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + " --output " + (d / "plan.json").string() + " --svg " +
                   (d / "p.svg").string() + " --svg-layer 1",
               &out),
            0)
      << out;
  EXPECT_NE(file_bytes(d / "p.svg").find("layer 1"), std::string::npos);
  fs::remove_all(d);
}

// A plan (--previous / --current) or router trace value of the wrong type printed nlohmann's
// "[json.exception.type_error.302] type must be number, but is string" (trace: without the file),
// and 1.5 in phy2log was cut to 1 silently.
TEST(MoeReplaceInput, JsonTypeErrorsNameTheFileAndTheKey) {
  const fs::path d = scratch("types");
  write(d / "loads.json", "[[1, 2, 3, 4], [4, 3, 2, 1]]");
  std::string out;
  ASSERT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + " --output " + (d / "good.json").string(), &out), 0) << out;
  const nlohmann::json good = nlohmann::json::parse(file_bytes(d / "good.json"));
  struct Case {
    std::string key;     // what the message must name
    nlohmann::json plan;
  };
  std::vector<Case> cases;
  auto with = [&](const std::string& key, const nlohmann::json& v) {
    nlohmann::json p = good;
    p[key] = v;
    return p;
  };
  cases.push_back({"\"nodes\"", with("nodes", "2")});
  cases.push_back({"\"slots_per_gpu\"", with("slots_per_gpu", nlohmann::json::array({2}))});
  cases.push_back({"\"experts\"", with("experts", 4.5)});
  cases.push_back({"\"algorithm\"", with("algorithm", 3)});
  cases.push_back({"\"node_ids\"", with("node_ids", nlohmann::json::object({{"a", 1}}))});
  cases.push_back({"\"layers\"", with("layers", "x")});
  {
    nlohmann::json p = good;
    p["layers"][1]["phy2log"][3] = 1.5;
    cases.push_back({"layers[1].phy2log[3]", p});
  }
  {
    nlohmann::json p = good;
    p["layers"][0]["phy2log"] = "0123";
    cases.push_back({"layers[0].phy2log", p});
  }
  for (const auto& c : cases) {
    write(d / "bad.json", c.plan.dump());
    for (const std::string& how : {std::string(" --previous "), std::string(" --added-nodes 1 --current ")}) {
      EXPECT_EQ(sh(kBin + "/moe-replace -q" + cluster(d) + how + (d / "bad.json").string() + " --output " +
                       (d / "out.json").string(),
                   &out),
                1)
          << c.key << how << out;
      EXPECT_NE(out.find("bad.json"), std::string::npos) << out;
      EXPECT_NE(out.find(c.key), std::string::npos) << c.key << ": " << out;
      expect_one_line(out);
      EXPECT_FALSE(fs::exists(d / "out.json"));
    }
  }
  // Router traces (JSONL): fields of the wrong type, named with the file, the line and the key.
  for (const auto& [line, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"layer": "x", "top_indices": [[0, 1], [2, 3]]})", "\"layer\""},
           {R"({"layer": 0, "num_experts": "4", "top_indices": [[0, 1]]})", "\"num_experts\""},
           {R"({"layer": 0, "iteration": 1.5, "top_indices": [[0, 1]]})", "\"iteration\""},
           {R"({"layer": 1e30, "top_indices": [[0, 1]]})", "\"layer\""},
           {R"({"layer": 0, "top_indices": 5})", "\"top_indices\""}}) {
    write(d / "trace.jsonl", line + "\n");
    EXPECT_EQ(sh(kBin + "/moe-replace -q --loads " + (d / "trace.jsonl").string() +
                     " --nodes 2 --gpus-per-node 2 --slots-per-gpu 2 --output " + (d / "out.json").string(),
                 &out),
              1)
        << line << out;
    EXPECT_NE(out.find("trace.jsonl: line 1: " + key), std::string::npos) << line << ": " << out;
    expect_one_line(out);
    EXPECT_FALSE(fs::exists(d / "out.json"));
  }
  fs::remove_all(d);
}

}  // namespace moe_replace_test
