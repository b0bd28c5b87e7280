// formats/deepspeed/shard_version: a fixture ZeRO shard's ds_version (top level and inside
// optimizer_state_dict, engine.py _save_zero_checkpoint) patched in place: both keys read back with
// the new release, every other value and every tensor byte as before, and the zip's CRCs right by
// Python's zipfile (independent of our zip reader). Another length is left as saved and said.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "formats/deepspeed/fixture_files.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/deepspeed/shard_version.h"
#include "io/torch/torch_file.h"
#include "support/process.h"

namespace deepspeed_shard_version_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;
namespace fs = std::filesystem;

namespace {

// A scratch copy of the fixture shard.
std::string copy_of(const std::string& checkpoint, const std::string& name, const std::string& as) {
  const std::string dst = fx::scratch_path(as);
  fs::copy_file(fx::step_dir(checkpoint) / name, dst, fs::copy_options::overwrite_existing);
  return dst;
}

// Python's zipfile: every record's CRC-32 matches its bytes.
bool zip_crcs_ok(const std::string& path) {
  return ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " -c \"import sys, zipfile; "
                                      "sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)\" '" + path + "'") == 0;
}

}  // namespace

TEST(ShardVersion, PatchedInPlaceBothKeys) {
  const std::string name = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt";
  const std::string path = copy_of("moe_line_0.17.1", name, "patched.pt");
  const TorchFile before = load_torch_file(path);
  ASSERT_EQ(ds::ds_version_of(before.root), "0.17.1");
  const std::string tensors_before = fx::saved(ds::raw_optimizer_state_dict(before.root)->get("single_partition_of_fp32_groups"), "t0.pt");

  const auto r = ds::patch_ds_version(path, [](const std::string&) { return std::string("0.19.5"); });
  EXPECT_EQ(r.found, "0.17.1");
  EXPECT_GE(r.rewritten, 1);  // the second key may be a memo reference to the same string object
  EXPECT_EQ(r.skipped, "");
  EXPECT_EQ(fs::file_size(path), fs::file_size(fx::step_dir("moe_line_0.17.1") / name));
  EXPECT_TRUE(zip_crcs_ok(path));

  const TorchFile after = load_torch_file(path);
  EXPECT_EQ(ds::ds_version_of(after.root), "0.19.5");
  const auto osd = ds::raw_optimizer_state_dict(after.root);
  ASSERT_TRUE(osd->get("ds_version"));
  EXPECT_EQ(osd->get("ds_version")->as_str(), "0.19.5");
  EXPECT_EQ(fx::saved(osd->get("single_partition_of_fp32_groups"), "t1.pt"), tensors_before);

  // Patched back, the file is the fixture's, byte for byte.
  ds::patch_ds_version(path, [](const std::string&) { return std::string("0.17.1"); });
  EXPECT_EQ(ucpkit::testing::file_bytes(path), ucpkit::testing::file_bytes((fx::step_dir("moe_line_0.17.1") / name).string()));
}

TEST(ShardVersion, OtherLengthLeftAsSaved) {
  const std::string name = "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt";
  const std::string path = copy_of("moe_line_0.19.3", name, "other_length.pt");
  const auto r = ds::patch_ds_version(path, [](const std::string&) { return std::string("0.19.10"); });
  EXPECT_EQ(r.rewritten, 0);
  EXPECT_NE(r.skipped.find("another length"), std::string::npos) << r.skipped;
  EXPECT_EQ(ucpkit::testing::file_bytes(path), ucpkit::testing::file_bytes((fx::step_dir("moe_line_0.19.3") / name).string()));
  // The same release: nothing to do.
  EXPECT_EQ(ds::patch_ds_version(path, [](const std::string& have) { return have; }).rewritten, 0);
}

}  // namespace deepspeed_shard_version_test
