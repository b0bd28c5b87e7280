// OutputFormat names: the values product.md's ucp-load synopsis lists for --format
// ("[--format deepspeed|safetensors]", plus issue 30's dcp and torch_dist and issue 49's hf, docs/commands.md), read back
// to the same format, nothing else accepted.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "reshard/output_format.h"
#include "reshard/output_writer.h"

namespace output_format_test {

using namespace ucpkit::reshard;

TEST(OutputFormat, NamesAreTheCliContractValues) {
  EXPECT_EQ(output_format_names(), (std::vector<std::string>{"deepspeed", "safetensors", "dcp", "torch_dist", "hf"}));
  EXPECT_EQ(output_format_name(OutputFormat::Hf), "hf");
  EXPECT_EQ(output_format_name(OutputFormat::Dcp), "dcp");
  EXPECT_EQ(output_format_name(OutputFormat::TorchDist), "torch_dist");
  EXPECT_EQ(output_format_name(OutputFormat::DeepSpeed), "deepspeed");
  EXPECT_EQ(output_format_name(OutputFormat::Safetensors), "safetensors");
}

TEST(OutputFormat, EveryNameParsesBackToItsFormat) {
  for (const auto& name : output_format_names()) {
    const auto f = output_format_from_name(name);
    ASSERT_TRUE(f.has_value()) << name;
    EXPECT_EQ(output_format_name(*f), name);
  }
  EXPECT_NE(*output_format_from_name("deepspeed"), *output_format_from_name("safetensors"));
}

TEST(OutputFormat, OtherNamesAreRefused) {
  for (const char* name : {"", "DeepSpeed", "safetensor", "torch", "deepspeed ", "HF", "huggingface"})
    EXPECT_FALSE(output_format_from_name(name).has_value()) << name;
}

// Every format's writer is registered from its own file (output_writer.h); run_load and plan_json ask
// only the registry, so the facts the common path asks of a writer are checked here.
TEST(OutputFormat, EveryFormatHasItsRegisteredWriter) {
  for (const auto& name : output_format_names()) EXPECT_NO_THROW((void)output_writer(*output_format_from_name(name))) << name;
  EXPECT_EQ(output_formats_that(&OutputWriter::reads_model), "deepspeed, safetensors, dcp");
  EXPECT_EQ(output_formats_that(&OutputWriter::takes_template), "deepspeed");
  EXPECT_EQ(output_formats_that(&OutputWriter::one_process), "hf");
}

}  // namespace output_format_test
