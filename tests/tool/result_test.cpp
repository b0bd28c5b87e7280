// tool::print_result: where each part of a tool's result goes (docs/commands.md, The --json envelope):
// the envelope with --json, the text without, a --plan document either way, messages on stderr.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/mapped_file.h"
#include "support/process.h"
#include "tool/result.h"
#include "tool/tool.h"

namespace result_test {

using ucpkit::tool::print_result;
using ucpkit::tool::Result;

namespace {

struct Printed {
  std::string out, err;
  int rc = -1;
};

Printed print(const Result& r, bool json, int verbosity = 0) {
  ucpkit::tool::set_verbosity(verbosity);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  Printed p;
  p.rc = print_result("ucp-x", r, json);
  p.out = ::testing::internal::GetCapturedStdout();
  p.err = ::testing::internal::GetCapturedStderr();
  ucpkit::tool::set_verbosity(0);
  return p;
}

Result summary() {
  Result r;
  r.output = "out";
  r.fields = {{"params", 3}};
  r.text = "three parameters\n";
  r.notes_before = {"first"};
  r.notes = {"last"};
  r.text_notes = {"for people"};
  return r;
}

}  // namespace

TEST(Result, JsonPrintsTheEnvelopeOnStdoutAndNoText) {
  const auto p = print(summary(), true);
  const auto j = nlohmann::ordered_json::parse(p.out);
  EXPECT_EQ(j["tool"], "ucp-x");
  EXPECT_EQ(j["output"], "out");
  EXPECT_EQ(j["params"], 3);
  EXPECT_EQ(p.out.find("three parameters"), std::string::npos);
  EXPECT_NE(p.err.find("first"), std::string::npos);
  EXPECT_NE(p.err.find("last"), std::string::npos);
  EXPECT_EQ(p.err.find("for people"), std::string::npos);
  EXPECT_LT(p.err.find("first"), p.err.find("last"));
}

TEST(Result, WithoutJsonTheTextAndItsMessages) {
  const auto p = print(summary(), false);
  EXPECT_EQ(p.out, "three parameters\n");
  EXPECT_LT(p.err.find("first"), p.err.find("for people"));
  EXPECT_LT(p.err.find("for people"), p.err.find("last"));
}

TEST(Result, NoOutputIsNullAndNoFieldsIsNoEnvelope) {
  Result r;
  r.fields = nlohmann::json::object();
  EXPECT_TRUE(nlohmann::json::parse(print(r, true).out)["output"].is_null());
  EXPECT_EQ(print(Result{}, true).out, "");  // another MPI rank, --watch
}

TEST(Result, APlanDocumentIsPrintedAsIsWithOrWithoutJson) {
  Result r = summary();
  r.document = "{\"plan\": 1}\n";
  EXPECT_EQ(print(r, true).out, r.document);
  EXPECT_EQ(print(r, false).out, r.document);
}

TEST(Result, TextOnStderrWithJsonWhenAsked) {
  Result r = summary();
  r.text_on_stderr_with_json = true;
  const auto p = print(r, true);
  EXPECT_NE(p.err.find("three parameters\n"), std::string::npos);
  EXPECT_EQ(p.out.find("three parameters"), std::string::npos);
}

TEST(Result, QuietSilencesMessagesNotTheEnvelope) {
  const auto p = print(summary(), true, -1);
  EXPECT_EQ(p.err, "");
  EXPECT_EQ(nlohmann::json::parse(p.out)["params"], 3);
}

TEST(Result, ExitCodeAndFailureAfterPrinting) {
  Result r = summary();
  r.exit_code = 3;
  EXPECT_EQ(print(r, false).rc, 3);
  r.failure = "out: a check failed";
  ucpkit::tool::set_verbosity(0);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    print_result("ucp-x", r, false);
    ADD_FAILURE() << "no error thrown";
  } catch (const ucpkit::Error& e) {
    EXPECT_STREQ(e.what(), "out: a check failed");
  }
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "three parameters\n");  // the summary came first
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("last"), std::string::npos);
}

// Issue 32 cause 1 for the tools that write nothing: a result read from a file that shrank meanwhile is
// refused (exit 1) before anything is printed. In a child process: the "shrank" record is sticky.
TEST(ToolResult, NothingIsPrintedFromAnInputThatShrank) {
  const std::filesystem::path f = std::filesystem::path(ucpkit::testing::scratch_dir("result_shrink")) / "in.pt";
  const size_t page = ::sysconf(_SC_PAGESIZE);
  std::ofstream(f, std::ios::binary) << std::string(3 * page, 'x');
  EXPECT_EXIT(
      {
        auto m = ucpkit::MappedFile::open(f.string());
        std::filesystem::resize_file(f, page);
        volatile uint8_t past = m->data()[2 * page];
        (void)past;
        Result r;
        r.text = "equal\n";
        try {
          print_result("ucp-x", r, false);
        } catch (const ucpkit::Error& e) {
          std::exit(std::string(e.what()).find("shrank") != std::string::npos ? 7 : 8);
        }
        std::exit(9);
      },
      ::testing::ExitedWithCode(7), "");
}

}  // namespace result_test
