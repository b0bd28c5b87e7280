// formats/deepspeed/save_identity: every file of one fixture save repeats the same identity fields
// (engine.py:4897-4919 _common_checkpoint_state, Megatron's client state, checkpointing.py:255-258),
// files of two saves differ in them, and identity_text renders values as Python would compare them.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "formats/deepspeed/fixture_files.h"
#include "formats/deepspeed/save_identity.h"
#include "io/torch/torch_file.h"

namespace deepspeed_save_identity_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;
using pickle::Value;

namespace {

std::map<std::string, std::string> as_map(const ds::IdentityFields& f) { return {f.begin(), f.end()}; }

}  // namespace

// The mp_rank files of one save (TP 2 x PP 2) agree on every field; the fields include the step
// (fixtures.py: global_step100, Megatron iteration 100), world sizes and args of the run.
TEST(SaveIdentity, FilesOfOneSaveAgree) {
  const auto files = fx::files_with("gpt_tp2pp2dp2_gpu", "mp_rank_");
  std::map<std::string, std::string> first;
  size_t model_files = 0;
  for (const auto& path : files) {
    if (path.find("model_states") == std::string::npos || path.find("zero_pp") != std::string::npos) continue;
    const auto id = as_map(ds::model_file_identity(load_torch_file(path).root));
    if (first.empty()) first = id;
    EXPECT_EQ(id, first) << path;
    ++model_files;
  }
  EXPECT_EQ(model_files, 4u);
  EXPECT_EQ(first.at("global_steps"), "100");
  EXPECT_EQ(first.at("iteration"), "100");
  EXPECT_EQ(first.at("dp_world_size"), "2");
  EXPECT_EQ(first.at("mp_world_size"), "4");
  EXPECT_EQ(first.at("args.tensor_model_parallel_size"), "2");
  EXPECT_EQ(first.at("args.pipeline_model_parallel_size"), "2");
  EXPECT_EQ(first.count("args.rank"), 0u);  // differs per rank (megatron/arguments.py:66)

  std::map<std::string, std::string> optim;
  for (const auto& path : fx::files_with("gpt_tp2pp2dp2_gpu", "optim_states.pt")) {
    const auto id = as_map(ds::optim_file_identity(load_torch_file(path).root));
    if (optim.empty()) optim = id;
    EXPECT_EQ(id, optim) << path;
  }
  ASSERT_FALSE(optim.empty());
}

// Two saves of other layouts tell themselves apart by their fields.
TEST(SaveIdentity, SavesOfOtherRunsDiffer) {
  const auto a = as_map(ds::model_file_identity(
      load_torch_file((fx::step_dir("gpt_tp2pp2dp2_gpu") / "mp_rank_00_model_states.pt").string()).root));
  const auto b = as_map(ds::model_file_identity(
      load_torch_file((fx::step_dir("gpt_tp2dp2_z2_fp16") / "mp_rank_00_model_states.pt").string()).root));
  EXPECT_NE(a.at("mp_world_size"), b.at("mp_world_size"));
  EXPECT_NE(a.at("args.pipeline_model_parallel_size"), b.at("args.pipeline_model_parallel_size"));
}

// Values as text: ints, strings quoted as repr does, booleans, None, a 0-d tensor by its value.
TEST(SaveIdentity, IdentityText) {
  EXPECT_EQ(ds::identity_text(Value::integer(42)), "42");
  EXPECT_EQ(ds::identity_text(Value::str("0.16.4")), "'0.16.4'");
  EXPECT_EQ(ds::identity_text(Value::boolean(true)), "True");
  EXPECT_EQ(ds::identity_text(Value::none()), "None");
  const Tensor step = Tensor::from_vector(DType::Int64, {}, std::vector<int64_t>{7});
  EXPECT_EQ(ds::identity_text(Value::of_tensor(step)).rfind("tensor(7, dtype=", 0), 0u);
  EXPECT_NE(ds::identity_text(Value::integer(7)), ds::identity_text(Value::str("7")));
}

}  // namespace deepspeed_save_identity_test
