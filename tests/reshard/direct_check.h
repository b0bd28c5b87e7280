// The direct-mode equality check shared by tests/reshard/direct_test.cpp and direct_autoep_test.cpp:
// the two-step target (ucp-union, then ucp-load from the universal checkpoint) and the direct
// targets of one source must be the same bytes (one process, and mpirun -np 2 with
// --verify-against the two-step universal checkpoint); --plan's source runs and source -> target
// copies must hold what they say (tests/reshard/check_direct_plan.py, Python torch and zipfile).
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "support/process.h"

namespace ucpkit::testing {

inline void expect_direct_equals_two_step(const std::string& src, const std::string& args, const std::string& scratch) {
  namespace fs = std::filesystem;
  const std::string bin = UCPKIT_BIN_DIR, py = UCPKIT_PYTHON, root = UCPKIT_SOURCE_DIR;
  const std::string mpirun = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun "
                             "--allow-run-as-root --oversubscribe -np ";
  const fs::path d = scratch_dir(scratch);
  std::string out;
  ASSERT_EQ(run_command(bin + "/ucp-union -q --input " + src + " --output " + (d / "u").string(), &out), 0) << out;
  ASSERT_EQ(run_command(bin + "/ucp-load -q --input " + (d / "u").string() + " --output " + (d / "two").string() + args,
                        &out),
            0)
      << out;
  out.clear();
  ASSERT_EQ(run_command(bin + "/ucp-load --json -q --input " + src + " --output " + (d / "one").string() + args, &out), 0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["input_kind"], "native");
  EXPECT_EQ(run_command("diff -r " + (d / "two").string() + " " + (d / "one").string(), &out), 0) << out;
  EXPECT_FALSE(fs::exists(d / "one" / "manifest.json"));
  // --plan: every source run holds exactly the universal elements it names (read with torch from
  // the two-step universal checkpoint), each element once; every source -> target copy holds, in
  // the target file written above (read with zipfile), the source range's bytes converted to the
  // record's dtype; nothing written.
  out.clear();
  ASSERT_EQ(run_command(bin + "/ucp-load --plan --input " + src + args + " > " + (d / "plan.json").string(), &out), 0)
      << out;
  EXPECT_EQ(run_command(py + " " + root + "/tests/reshard/check_direct_plan.py " + (d / "plan.json").string() + " " +
                            (d / "u").string() + " " + (d / "one").string(),
                        &out),
            0)
      << out;
  if (run_command("command -v mpirun") != 0) return;
  out.clear();
  ASSERT_EQ(run_command(mpirun + "2 " + bin + "/ucp-load --json -q --batch-mb 0.05 --input " + src + " --output " +
                            (d / "two_ranks").string() + " --verify-against " + (d / "u").string() + args +
                            " 2>/dev/null </dev/null",
                        &out),
            0)
      << out;
  const auto m = nlohmann::json::parse(out);
  EXPECT_EQ(m["mode"], "exchange");
  EXPECT_EQ(m["mpi_ranks"], 2);
  EXPECT_GT(m["checksums_compared"].get<int>(), 10);
  EXPECT_EQ(run_command("diff -r " + (d / "two").string() + " " + (d / "two_ranks").string(), &out), 0) << out;
}

}  // namespace ucpkit::testing
