// tool::run_ucp_load (lib/tool/ucp_load.cpp) on the area's tiny dense GPT (a DeepSpeed checkpoint:
// TP 1, DP 2, ZeRO-1) and on a DCP save of it: --plan, --dry-run, a conversion to safetensors, the
// DCP input converted first through a scratch universal folder (and the refusals that route makes),
// the whole rewrite of a DCP input into DCP, and --template refused for an input it does not read.
// The options' own rules are tests/tool/ucp_load_options_test.cpp's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <filesystem>

#include "support/errors.h"
#include "support/paths.h"
#include "tool/ucp_load.h"

namespace ucp_load_test {

namespace fs = std::filesystem;
using ucpkit::testing::error_of;
using ucpkit::tool::Result;
using ucpkit::tool::UcpLoadOptions;

namespace {

const std::string kGpt = std::string(UCPKIT_FIXTURES_DIR) + "/gpt";

class UcpLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kGpt)) GTEST_SKIP() << kGpt << " absent (tests/tool/fixtures.py makes it)";
    dir_ = fs::temp_directory_path() / ("ucp_load_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // ucp-load --input `input` --output `output` --format `format`, nothing else given.
  static UcpLoadOptions options(const std::string& input, const std::string& output, const std::string& format) {
    UcpLoadOptions o;
    o.load.input = input;
    o.load.output = output;
    o.format = format;
    o.given = {false, false, false, false, false, false};
    o.load.sync = false;
    return o;
  }
  static Result run(UcpLoadOptions o) {
    o.check();
    return ucpkit::tool::run_ucp_load(o);
  }
  // A DCP save of the GPT fixture, made by ucp-load itself.
  std::string dcp_of_gpt() {
    const std::string out = path("dcp");
    const Result r = run(options(kGpt, out, "dcp"));
    EXPECT_EQ(r.output, out);
    return out;
  }
  // Names in `dir_` that hold `part`.
  std::vector<std::string> names_with(const std::string& part) const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().find(part) != std::string::npos) v.push_back(e.path().filename().string());
    return v;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(UcpLoad, PlanIsAJsonDocumentAndWritesNothing) {
  UcpLoadOptions o = options(kGpt, "", "deepspeed");
  o.plan = true;
  o.dp = 4;  // a DeepSpeed target needs its DP; TP, PP and ZeRO come from the source (1, 1, 1)
  o.given.dp = true;
  const Result r = run(o);
  EXPECT_FALSE(r.output);
  EXPECT_TRUE(r.fields.is_null());
  ASSERT_FALSE(r.document.empty());
  EXPECT_EQ(r.document.back(), '\n');
  const auto plan = nlohmann::json::parse(r.document);
  EXPECT_TRUE(plan.is_object());
  const auto& t = plan.at("target");
  EXPECT_EQ(t.at("dp"), 4);
  EXPECT_EQ(t.at("tp"), 1);
  EXPECT_EQ(t.at("pp"), 1);
  EXPECT_EQ(t.at("zero_stage"), 1);
  ASSERT_FALSE(r.notes.empty());  // the values taken from the source are said
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(UcpLoad, DryRunSaysWhatWouldBeWrittenAndWritesNothing) {
  const std::string out = path("out");
  UcpLoadOptions o = options(kGpt, out, "safetensors");
  o.dry_run = true;
  const Result r = run(o);
  EXPECT_FALSE(r.output);
  EXPECT_EQ(r.fields.at("dry_run"), true);
  EXPECT_EQ(r.fields.at("would_write"), out);
  EXPECT_EQ(r.fields.at("format"), "safetensors");
  EXPECT_EQ(r.text.rfind("ucp-load --dry-run: would write " + out + ": ", 0), 0u) << r.text;
  EXPECT_NE(r.text.find("nothing written"), std::string::npos) << r.text;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(UcpLoad, ConvertsTheCheckpointToSafetensors) {
  const std::string out = path("st");
  const Result r = run(options(kGpt, out, "safetensors"));
  EXPECT_EQ(r.exit_code, 0);
  ASSERT_EQ(r.output, out);
  EXPECT_TRUE(r.fields.is_object());
  ASSERT_FALSE(r.notes.empty());
  EXPECT_EQ(r.notes.back().rfind("28 parameters -> " + out + " (", 0), 0u) << r.notes.back();  // dry_run_test's count
  EXPECT_NE(r.notes.back().find("-> " + out + " ("), std::string::npos) << r.notes.back();
  bool safetensors = false;
  for (const auto& e : fs::directory_iterator(out)) safetensors = safetensors || e.path().extension() == ".safetensors";
  EXPECT_TRUE(safetensors);
  // The output exists now: a second run is refused, naming it.
  const std::string msg = error_of([&] { run(options(kGpt, out, "safetensors")); });
  EXPECT_NE(msg.find(out), std::string::npos) << msg;
}

// A DCP input is converted to universal form first: --plan points to the two steps, --dry-run says
// so, and a DeepSpeed output (which needs model files) is refused before anything is converted.
TEST_F(UcpLoad, DcpInputIsConvertedFirstAndItsRefusalsNameTheInput) {
  const std::string dcp = dcp_of_gpt();
  {
    UcpLoadOptions o = options(dcp, "", "safetensors");
    o.plan = true;
    const std::string msg = error_of([&] { run(o); });
    EXPECT_NE(msg.find("--plan of a "), std::string::npos) << msg;
    EXPECT_NE(msg.find("ucp-union --input " + dcp), std::string::npos) << msg;
  }
  {
    UcpLoadOptions o = options(dcp, path("ds"), "deepspeed");
    o.dry_run = true;
    const std::string msg = error_of([&] { run(o); });
    EXPECT_EQ(msg.rfind(dcp + ": a ", 0), 0u) << msg;
    EXPECT_NE(msg.find("has no DeepSpeed model files"), std::string::npos) << msg;
  }
  {
    UcpLoadOptions o = options(dcp, path("st"), "safetensors");
    o.dry_run = true;
    const Result r = run(o);
    EXPECT_EQ(r.fields.at("dry_run"), true);
    EXPECT_EQ(r.fields.at("format"), "safetensors");
    EXPECT_GT(r.fields.at("params").get<long long>(), 0);
    EXPECT_NE(r.text.find("would be converted into a scratch universal folder beside " + path("st")), std::string::npos)
        << r.text;
    EXPECT_FALSE(fs::exists(path("st")));
  }
}

TEST_F(UcpLoad, DcpInputLoadsThroughAScratchFolderThatIsRemoved) {
  const std::string dcp = dcp_of_gpt();
  const std::string out = path("st");
  const Result r = run(options(dcp, out, "safetensors"));
  EXPECT_EQ(r.output, out);
  EXPECT_TRUE(fs::is_directory(out));
  EXPECT_TRUE(names_with(".ucp-load-universal-").empty());
}

// Under mpirun every rank converts into and loads from one scratch folder (rank 0's): each rank named its own
// after its pid, so rank 1 loaded an empty folder ("no such folder") while rank 0 waited for it.
TEST_F(UcpLoad, DcpInputUnderMpirunSharesOneScratchFolder) {
  if (std::system("command -v mpirun > /dev/null") != 0) GTEST_SKIP() << "no mpirun";
  const std::string dcp = dcp_of_gpt();
  const std::string out = path("st");
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --oversubscribe -np 2 " +
                          kBin + "/ucp-load -q --no-sync --input " + dcp + " --format safetensors --output " +
                          out + " > " + path("log") + " 2>&1 < /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_TRUE(fs::exists(fs::path(out) / "model.safetensors.index.json"));
  EXPECT_TRUE(names_with(".ucp-load-universal-").empty());
}

// A failure of one rank alone (rank 1 given a folder that does not exist, rank 0 a DCP it converts) ends the job
// with an error, nothing written or left, rather than leaving rank 0 waiting for rank 1.
TEST_F(UcpLoad, ALoneRankFailureUnderMpirunEndsTheJob) {
  if (std::system("command -v mpirun > /dev/null") != 0) GTEST_SKIP() << "no mpirun";
  const std::string dcp = dcp_of_gpt();
  const std::string script = path("lone.sh");
  {
    std::ofstream f(script);
    f << "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then in=" << path("missing") << "; else in=" << dcp << "; fi\n"
      << "exec " << kBin << "/ucp-load -q --no-sync --input \"$in\" --format safetensors --output " << path("st") << "\n";
  }
  fs::permissions(script, fs::perms::owner_all);
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 90 mpirun --oversubscribe -np 2 " +
                          script + " > " + path("log") + " 2>&1 < /dev/null";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st)) << cmd;
  EXPECT_NE(WEXITSTATUS(st), 0);
  EXPECT_NE(WEXITSTATUS(st), 124) << "the job hung until timeout ended it";
  EXPECT_FALSE(fs::exists(path("st")));
  EXPECT_TRUE(names_with(".ucp-load-universal-").empty());
}

TEST_F(UcpLoad, DcpIntoDcpIsRewrittenWhole) {
  const std::string dcp = dcp_of_gpt();
  {
    UcpLoadOptions o = options(dcp, path("again"), "dcp");
    o.dry_run = true;
    const Result r = run(o);
    EXPECT_EQ(r.fields.at("dry_run"), true);
    EXPECT_EQ(r.fields.at("format"), "dcp");
    EXPECT_NE(r.text.find("would be rewritten whole as --format dcp into " + path("again")), std::string::npos)
        << r.text;
    EXPECT_FALSE(fs::exists(path("again")));
  }
  {
    UcpLoadOptions o = options(dcp, path("again"), "dcp");
    o.optimizer = "fp32";
    const std::string msg = error_of([&] { run(o); });
    EXPECT_NE(msg.find("--optimizer does not apply when " + dcp + " is written into its own format (dcp)"),
              std::string::npos)
        << msg;
  }
  const Result r = run(options(dcp, path("again"), "dcp"));
  EXPECT_EQ(r.output, path("again"));
  EXPECT_EQ(r.fields.at("route"), "whole");
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.back().find("rewritten whole"), std::string::npos) << r.notes.back();
}

TEST_F(UcpLoad, TemplateNeedsATorchDistInput) {
  UcpLoadOptions o = options(kGpt, path("out"), "deepspeed");
  o.check();
  o.load.template_dir = kGpt;  // set past check(), which has its own rules for --template
  const std::string msg = error_of([&] { ucpkit::tool::run_ucp_load(o); });
  EXPECT_EQ(msg.rfind(kGpt + ": --template needs a Megatron-Core torch_dist checkpoint as --input", 0), 0u) << msg;
  EXPECT_FALSE(fs::exists(path("out")));
}

// A DeepSpeed output records its layout: loaded again with --reuse-output into the same layout, it is
// kept and nothing is written.
TEST_F(UcpLoad, ReuseOutputKeepsAnOutputOfTheSameLayout) {
  const std::string out = path("ds");
  auto dp1 = [&] {
    UcpLoadOptions o = options(kGpt, out, "deepspeed");
    o.dp = 1;
    o.given.dp = true;
    return o;
  };
  const Result first = run(dp1());
  ASSERT_EQ(first.output, out);
  UcpLoadOptions again = dp1();
  again.load.reuse_output = true;
  const Result r = run(again);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_EQ(r.notes.back().rfind(out + " already holds this layout (", 0), 0u) << r.notes.back();
  EXPECT_NE(r.notes.back().find("reused, nothing written"), std::string::npos) << r.notes.back();
}

}  // namespace ucp_load_test
