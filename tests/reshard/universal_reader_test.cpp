// convert_from_fp32 (reshard/universal_reader.h): the writers' fp32 -> low-precision rounding. Its bf16
// loop is branch-free so that it vectorizes; it must give f32_to_bf16's bits (torch's rounding, tested
// against torch in tests/io) for every input, NaN and the tails of a vector included. UniversalReader:
// a folder of more state files than the process may hold open is read all the same.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "io/dtype.h"
#include "reshard/universal_reader.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"
#include "universal_fixture.h"

namespace universal_reader_test {

namespace {

using ucpkit::DType;

std::vector<uint16_t> converted(const std::vector<uint32_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = std::bit_cast<float>(bits[i]);
  std::vector<uint16_t> out(bits.size(), 0xdead);
  ucpkit::reshard::convert_from_fp32(f.data(), f.size(), DType::BFloat16, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

TEST(ConvertFromFp32, Bf16EqualsTheScalarRoundingOnEveryKindOfValue) {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
                                0x7f800001, 0xff800001, 0x7fbfffff, 0x7fffffff, 0x00000001, 0x807fffff,
                                0x3f808000, 0x3f818000, 0x3f808001, 0x3f80ffff, 0x7f7fffff, 0xff7fffff,
                                0x7f7f8000, 0x00008000, 0x00018000, 0x3f7fffff, 0xbf808000, 0xbf818000};
  std::mt19937 rng(7);
  for (int i = 0; i < 1000003; ++i) bits.push_back(rng());  // an odd count: the vector loop's tail too
  const auto out = converted(bits);
  for (size_t i = 0; i < bits.size(); ++i)
    ASSERT_EQ(out[i], ucpkit::f32_to_bf16(std::bit_cast<float>(bits[i]))) << "input bits 0x" << std::hex << bits[i];
}

TEST(ConvertFromFp32, EveryLengthUpToTwoVectors) {
  for (size_t n = 0; n <= 40; ++n) {
    std::vector<uint32_t> bits(n);
    for (size_t i = 0; i < n; ++i) bits[i] = 0x3f808000u + static_cast<uint32_t>(i) * 0x00010000u;
    const auto out = converted(bits);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], ucpkit::f32_to_bf16(std::bit_cast<float>(bits[i]))) << n;
  }
}

// ucp-load of the GPT case's universal folder (210 state files) with the limit of open files at 48 writes the
// same files as without a limit: the reader kept every state file open (a 25,000-parameter folder failed
// with EMFILE under this machine's limit of 20,000, "cannot read file: Too many open files").
TEST(UniversalReader, MoreStateFilesThanTheOpenFileLimitAreRead) {
  const std::string u = ucpkit::loadtest::gpt_case().universal.string();
  const std::string dir = ucpkit::testing::scratch_dir("universal_reader_fd_limit");
  for (const std::string target : {"--format safetensors", "--format deepspeed --tp 2 --dp 3"}) {
    const std::string load = kBin + "/ucp-load -q --input " + ucpkit::testing::quote(u) + " " + target + " --output ";
    std::filesystem::remove_all(dir + "/free");
    std::filesystem::remove_all(dir + "/limited");
    std::string out;
    ASSERT_EQ(ucpkit::testing::run_command(load + ucpkit::testing::quote(dir + "/free"), &out), 0) << target << out;
    ASSERT_EQ(ucpkit::testing::run_command("ulimit -n 48 && " + load + ucpkit::testing::quote(dir + "/limited"), &out), 0)
        << target << out;
    EXPECT_EQ(ucpkit::testing::tree_bytes(dir + "/free"), ucpkit::testing::tree_bytes(dir + "/limited")) << target;
  }
}

}  // namespace

}  // namespace universal_reader_test
