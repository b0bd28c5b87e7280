// formats/deepspeed/line_rewrite: a native-MoE step folder of one version line rewritten as another
// gives the files that line's own save writes. Truth: tests/formats/fixtures.py saves the same model
// once per line (dsgen, each line's save code: engine.py _save_checkpoint / _save_moe_checkpoint of
// that release), so the rewritten mp_rank and expp_rank files must equal the other line's fixture
// (as value trees through our writer: same keys, order, kinds, sharing, tensor bytes).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "formats/deepspeed/fixture_files.h"
#include "formats/deepspeed/line_rewrite.h"
#include "formats/deepspeed/version_line.h"
#include "io/torch/torch_file.h"
#include "support/process.h"

namespace deepspeed_line_rewrite_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;
namespace fs = std::filesystem;

namespace {

// The files the rewrite owns (the ZeRO shards and expert files are the same in every line).
bool rewritten_kind(const std::string& name) {
  return name == "mp_rank_00_model_states.pt" || name.rfind("expp_rank_", 0) == 0;
}

std::string tree_bytes(const fs::path& file, const std::string& as) { return fx::saved(load_torch_file(file.string()).root, as); }

}  // namespace

TEST(LineRewrite, EveryLineRewrittenAsEveryOtherIsThatLinesSave) {
  const auto& lines = ds::moe_version_lines();
  ASSERT_GE(lines.size(), 5u);
  size_t compared = 0;
  for (const auto& from : lines)
    for (const auto& to : lines) {
      if (from.name == to.name) continue;
      SCOPED_TRACE(from.name + " -> " + to.name);
      const fs::path src = fx::step_dir("moe_line_" + from.name);
      const fs::path want = fx::step_dir("moe_line_" + to.name);
      const fs::path dir = fs::path(fx::scratch_path("rewrite")) / "global_step100";
      fs::remove_all(dir.parent_path());
      fs::create_directories(dir.parent_path());
      fs::copy(src, dir, fs::copy_options::recursive);
      EXPECT_EQ(ds::rewrite_as_line(dir.string(), to), from.name);
      for (const auto& e : fs::directory_iterator(want)) {
        const std::string name = e.path().filename().string();
        if (!rewritten_kind(name)) continue;
        ASSERT_TRUE(fs::exists(dir / name)) << name;
        const std::string diff = fx::first_difference(tree_bytes(dir / name, "got.pt"), tree_bytes(e.path(), "want.pt"));
        EXPECT_EQ(diff, "") << name;
        if (!diff.empty())  // kept for a look: scratch/mismatch_<from>_<to>_<name>
          fs::copy_file(dir / name, fx::scratch_path("mismatch_" + from.name + "_" + to.name + "_" + name),
                        fs::copy_options::overwrite_existing);
        ++compared;
      }
      for (const auto& e : fs::directory_iterator(dir))
        EXPECT_TRUE(fs::exists(want / e.path().filename())) << e.path().filename() << " is not in " << to.name;
    }
  EXPECT_GE(compared, 20u);  // 20 ordered pairs, the mp_rank file each (expp files where the line has them)
}

}  // namespace deepspeed_line_rewrite_test
