// SGLang / vLLM files: the outputs checked by tests/placement/engine_files.py against the loaders'
// semantics (SGLang init_by_mapping, vLLM EplbState.add_model), and the engines' load dumps (made
// there by torch and by hand) read as --loads, against sums computed there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "placement/loads.h"
#include "test_data.h"

namespace engine_formats_test {

namespace fs = std::filesystem;
using namespace ucpkit::placement;

namespace {

struct ShellRun {
  int rc;
  std::string out;
};

ShellRun sh(const std::string& cmd, const fs::path& dir) {
  fs::path log = dir / "cmd.log";
  int status = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  return {WEXITSTATUS(status), ss.str()};
}

class EngineFormats : public ::testing::Test {
 protected:
  // The engine files are made once for the suite (one Python start).
  static void SetUpTestSuite() {
    made_dir = fs::temp_directory_path() / ("engine_formats_" + std::to_string(::getpid()));
    fs::create_directories(made_dir);
    made = sh(python + " " + script() + " make " + made_dir.string(), made_dir);
  }
  static void TearDownTestSuite() { fs::remove_all(made_dir); }
  static std::string script() {
    return (placement_test::source_root() / "tests" / "placement" / "engine_files.py").string();
  }
  void SetUp() override {
    tool = placement_test::tool_dir() + "/moe-replace";
    if (!fs::exists(tool)) GTEST_SKIP() << "moe-replace not built";
    if (!fs::exists(python)) GTEST_SKIP() << python << " absent";
    ASSERT_EQ(made.rc, 0) << made.out;
    dir = made_dir / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir);
    for (const auto& f : fs::directory_iterator(made_dir))
      if (f.is_regular_file()) fs::copy_file(f.path(), dir / f.path().filename(), fs::copy_options::overwrite_existing);
    std::ofstream(dir / "loads.json") << "[[90,132,40,61,104,165,39,4,73,56,183,86],[20,107,104,64,19,197,187,157,172,86,16,27]]";
  }
  std::string p(const std::string& name) const { return (dir / name).string(); }
  LoadMatrix json_matrix(const std::string& name) const {
    auto m = nlohmann::json::parse(std::ifstream(dir / name)).get<std::vector<std::vector<double>>>();
    LoadMatrix out;
    out.layers = m.size();
    out.experts = m[0].size();
    for (const auto& row : m) out.values.insert(out.values.end(), row.begin(), row.end());
    return out;
  }
  static inline const std::string python = "/usr/bin/python3";
  static inline fs::path made_dir;
  static inline ShellRun made{1, "not made"};
  std::string tool;
  fs::path dir;
};

}  // namespace

TEST_F(EngineFormats, OutputsMatchTheLoadersSemantics) {
  std::string triples;
  int i = 0;
  for (const char* cluster : {"--nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 1",
                              "--nodes 4 --gpus-per-node 2 --slots-per-gpu 3 --fault-tolerance 2",
                              "--nodes 3 --gpus-per-node 2 --slots-per-gpu 4 --algorithm eplb-global"}) {
    const std::string n = std::to_string(i++);
    ShellRun r = sh(tool + " --loads " + p("loads.json") + " " + cluster + " --output " + p("plan" + n + ".json") +
                        " --sglang-expert-location " + p("sglang" + n + ".json") + " --vllm-eplb-state " +
                        p("vllm" + n + ".safetensors") + " -q",
                    dir);
    ASSERT_EQ(r.rc, 0) << cluster << ": " << r.out;
    triples += " " + p("plan" + n + ".json") + " " + p("sglang" + n + ".json") + " " + p("vllm" + n + ".safetensors");
  }
  ShellRun c = sh(python + " " + script() + " check" + triples, dir);
  EXPECT_EQ(c.rc, 0) << c.out;
}

TEST_F(EngineFormats, ReadsSglangDumpAndVllmLoadWindow) {
  LoadMatrix sg = read_loads(p("sglang_dump.pt"));
  LoadMatrix sg_want = json_matrix("sglang_sum.json");
  EXPECT_EQ(sg.layers, sg_want.layers);
  EXPECT_EQ(sg.experts, sg_want.experts);
  EXPECT_EQ(sg.values, sg_want.values);
  LoadMatrix vl = read_loads(p("vllm_window.safetensors"));
  LoadMatrix vl_want = json_matrix("vllm_logical.json");
  EXPECT_EQ(vl.layers, vl_want.layers);
  EXPECT_EQ(vl.experts, vl_want.experts);
  EXPECT_EQ(vl.values, vl_want.values);
  // The CLI places the dump exactly as the equivalent matrix.
  const std::string cluster = " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 -q --output ";
  ASSERT_EQ(sh(tool + " --loads " + p("sglang_dump.pt") + cluster + p("a.json"), dir).rc, 0);
  ASSERT_EQ(sh(tool + " --loads " + p("sglang_sum.json") + cluster + p("b.json"), dir).rc, 0);
  auto a = nlohmann::json::parse(std::ifstream(dir / "a.json"));
  auto b = nlohmann::json::parse(std::ifstream(dir / "b.json"));
  for (size_t l = 0; l < a["layers"].size(); ++l) EXPECT_EQ(a["layers"][l]["phy2log"], b["layers"][l]["phy2log"]);
}

TEST_F(EngineFormats, BadDumpsFailCleanly) {
  // Truncated safetensors, a .pt without logical_count, a window without its map.
  {
    std::ifstream in(dir / "vllm_window.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir / "short.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() - 9);
    std::ofstream(dir / "blankheader.safetensors", std::ios::binary) << bytes.substr(0, 8) << std::string(bytes.size() - 8, ' ');
  }
  for (const char* bad : {"short.safetensors", "sglang_no_counts.pt", "blankheader.safetensors"}) {
    ShellRun r = sh(tool + " --loads " + p(bad) + " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --output " + p("out.json") +
                   " --sglang-expert-location " + p("s.json"),
               dir);
    EXPECT_EQ(r.rc, 1) << bad << ": " << r.out;
    EXPECT_NE(r.out.find(bad), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_FALSE(fs::exists(dir / "out.json"));
    EXPECT_FALSE(fs::exists(dir / "s.json"));
  }
  // An engine file in a folder that does not exist: nothing is written, not even the plan.
  ShellRun r = sh(tool + " --loads " + p("loads.json") + " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --output " +
                      p("out.json") + " --vllm-eplb-state " + p("missing/v.safetensors"),
                  dir);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("missing"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out.json"));
}

}  // namespace engine_formats_test
