// ucp-load's direct mode (issue 18): a native DeepSpeed checkpoint as --input gives, byte for byte,
// the target of the two-step path (ucp-union, then ucp-load from the universal checkpoint), in one
// process and under mpirun -np 2 (the exchange); --plan's source runs hold what they say; --verify-against compares the universal checksums
// computed on the way with the two-step manifest; bad input: one-line error, exit 1, nothing written.
// The full matrix (every case, 1, 2 and 3 ranks) is scripts/checks/test_direct_matrix.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "reshard/direct_check.h"
#include "support/paths.h"
#include "support/process.h"

namespace direct_test {

namespace fs = std::filesystem;
using ucpkit::testing::run_command;

namespace {

nlohmann::json case_named(const std::string& name) {
  std::ifstream in(fs::path(kFx) / "cases.json");
  nlohmann::json j;
  in >> j;
  for (const auto& c : j)
    if (c["name"] == name) return c;
  ADD_FAILURE() << "no case " << name << " in cases.json";
  return {};
}

std::string args_of(const nlohmann::json& c) {
  std::string s;
  for (const auto& a : c["target_args"]) s += " " + a.get<std::string>();
  return s;
}

void expect_direct_equals_two_step(const std::string& name) {
  SCOPED_TRACE(name);
  const auto c = case_named(name);
  ASSERT_FALSE(c.is_null());
  ucpkit::testing::expect_direct_equals_two_step((fs::path(kFx) / name / "src").string(), args_of(c), "direct_" + name);
}

}  // namespace

// Pipeline source (BigScience numbering, tied embeddings), TP 1 -> 2: layer files, vocabulary rows.
TEST(LoadDirect, PipelineSourceSameBytesAsTwoStep) { expect_direct_equals_two_step("gpt_pp2_to_tp2pp4dp2"); }
// GQA sub-params, SwiGLU, averaged norms (joined by the union code), BF16_Optimizer, TP 2 -> 1.
TEST(LoadDirect, SubParamsAndAveragedNormsSameBytesAsTwoStep) {
  expect_direct_equals_two_step("llama_tp2_to_tp1dp5_bf16opt");
}
// Native DeepSpeed MoE, EP 4 -> 2.
TEST(LoadDirect, NativeMoeSameBytesAsTwoStep) { expect_direct_equals_two_step("dsmoe_ep4dp4_to_ep2dp6"); }
// ZeRO-3 TP 1 source (flat form, vocabulary padding in the partitions).
TEST(LoadDirect, ZeroThreeSourceSameBytesAsTwoStep) {
  expect_direct_equals_two_step("gpt_zero3_tp1dp2_subgroups_to_tp2dp3");
}

TEST(LoadDirect, BadInputClearErrorNothingWritten) {
  const auto c = case_named("gpt_tp1dp2_to_tp2dp3");
  ASSERT_FALSE(c.is_null());
  const fs::path d = ucpkit::testing::scratch_dir("direct_bad");
  const std::string src = (fs::path(kFx) / "gpt_tp1dp2_to_tp2dp3" / "src").string(), args = args_of(c);
  std::string out;
  // A universal checkpoint whose manifest has one wrong checksum: --verify-against names it.
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + src + " --output " + (d / "u").string(), &out), 0) << out;
  auto m = nlohmann::json::parse(std::ifstream(d / "u" / "manifest.json"));
  const std::string victim = m["params"][1]["name"];
  m["params"][1]["states"]["exp_avg"]["crc32"] = "00000000";
  std::ofstream(d / "u" / "manifest.json") << m.dump();
  fs::create_directories(d / "empty");
  // A shard cut short.
  fs::copy(src, d / "cut", fs::copy_options::recursive);
  fs::path shard;
  for (const auto& e : fs::recursive_directory_iterator(d / "cut"))
    if (e.path().filename().string().find("optim_states.pt") != std::string::npos) shard = e.path();
  ASSERT_FALSE(shard.empty());
  fs::resize_file(shard, fs::file_size(shard) / 2);
  // One bit flipped in the middle of a shard's largest record (tensor data the copy reads): the
  // CRC-32 computed on the bytes as they are read finds it at the end, before anything is renamed.
  fs::copy(src, d / "flip", fs::copy_options::recursive);
  fs::path flipped;
  for (const auto& e : fs::recursive_directory_iterator(d / "flip"))
    if (e.path().filename().string().find("optim_states.pt") != std::string::npos) flipped = e.path();
  ASSERT_EQ(run_command(kPy + " -c \"import sys, zipfile; p = sys.argv[1]; z = zipfile.ZipFile(p); "
                              "i = max(z.infolist(), key=lambda i: i.file_size); f = open(p, 'r+b'); "
                              "f.seek(i.header_offset); "
                              "h = f.read(30); o = i.header_offset + 30 + int.from_bytes(h[26:28], 'little') + "
                              "int.from_bytes(h[28:30], 'little') + i.file_size // 2; f.seek(o); b = f.read(1); "
                              "f.seek(o); f.write(bytes([b[0] ^ 16]))\" " + flipped.string(),
                        &out),
            0)
      << out;
  struct Bad {
    std::string what, cmd, message;
  };
  const std::vector<Bad> bad = {
      {"checksum differs", "--input " + src + " --output " + (d / "o1").string() + " --verify-against " + (d / "u").string(),
       victim + " exp_avg: crc32"},
      {"neither kind", "--input " + (d / "empty").string() + " --output " + (d / "o2").string(), "no manifest.json"},
      {"truncated shard", "--input " + (d / "cut").string() + " --output " + (d / "o3").string(), shard.filename().string()},
      {"output inside the input", "--input " + src + " --output " + src + "/global_step100/out", "--output"},
      {"flipped bit", "--input " + (d / "flip").string() + " --output " + (d / "o4").string(),
       flipped.filename().string() + ": zip: CRC-32 mismatch in record"},
      {"flipped bit, exchange", "--exchange on --batch-mb 0.05 --input " + (d / "flip").string() + " --output " +
                                    (d / "o5").string(),
       flipped.filename().string() + ": zip: CRC-32 mismatch in record"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(b.what);
    out.clear();
    EXPECT_EQ(run_command(kBin + "/ucp-load " + b.cmd + args, &out), b.what == "output inside the input" ? 2 : 1) << out;
    EXPECT_NE(out.find("ucp-load: error:"), std::string::npos) << out;
    EXPECT_NE(out.find(b.message), std::string::npos) << out;
  }
  // Under mpirun the rank that checks the damaged shard reports it; every rank stops, nothing written.
  if (run_command("command -v mpirun") == 0) {
    out.clear();
    EXPECT_NE(run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun "
                          "--allow-run-as-root --oversubscribe -np 2 " + kBin + "/ucp-load --batch-mb 0.05 --input " +
                              (d / "flip").string() + " --output " + (d / "o6").string() + args + " </dev/null",
                          &out),
              0)
        << out;
    EXPECT_NE(out.find(flipped.filename().string() + ": zip: CRC-32 mismatch in record"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(d / "o6"));
  }
  for (const char* o : {"o1", "o2", "o3", "o4", "o5"}) EXPECT_FALSE(fs::exists(d / o)) << o;
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename().string().find(".ucp-load-tmp"), std::string::npos) << e.path();
}

}  // namespace direct_test
