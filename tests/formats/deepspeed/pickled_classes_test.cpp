// formats/deepspeed/pickled_classes: each builder pickles as the instances in the fixtures' optimizer
// shards do (tests/formats/fixtures.py; dsgen pickles DeepSpeed's own class paths with torch.save):
// fragment_address (utils/tensor_fragment.py), ZeroStageEnum (runtime/zero/config.py) and the loss
// scalers (runtime/fp16/loss_scaler.py), compared as protocol-2 bytes of the one object.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "formats/deepspeed/fixture_files.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/deepspeed/pickled_classes.h"
#include "io/pickle/pickler.h"
#include "io/torch/torch_file.h"

namespace deepspeed_pickled_classes_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;
using pickle::Kind;

namespace {

std::string bytes(const pickle::ValuePtr& v) { return pickle::pickle(v, {}); }

// The optimizer_state_dict of a fixture's first ZeRO shard.
pickle::ValuePtr first_osd(const std::string& checkpoint) {
  const std::string path = fx::files_with(checkpoint, "zero_pp_rank_0_mp_rank_00_optim_states.pt").at(0);
  return ds::raw_optimizer_state_dict(load_torch_file(path).root);
}

}  // namespace

// Every param_slice_mappings entry of every ZeRO-1/2 fixture is fragment_address(numel, start).
TEST(PickledClasses, FragmentAddressAsSaved) {
  size_t n = 0;
  for (const char* c : {"gpt_tp2dp2_z2_fp16", "gpt_tp2pp2dp2_gpu", "moe_line_0.14", "moe_line_0.19.5",
                        "autoep_dp4_ep2_zero1_bf16"}) {
    const auto psm = first_osd(c)->get("param_slice_mappings");
    ASSERT_TRUE(psm && psm->is_sequence()) << c;
    for (const auto& group : psm->items)
      for (const auto& [name, addr] : group->entries) {
        ASSERT_EQ(addr->kind, Kind::Object) << c << " " << name->as_str();
        const auto& st = addr->object->state;
        EXPECT_EQ(bytes(ds::fragment_address(st->get("numel")->as_int(), st->get("start")->as_int())), bytes(addr))
            << c << " " << name->as_str();
        ++n;
      }
  }
  EXPECT_GT(n, 50u);
}

// ZeroStageEnum(stage): the same member as the ZeRO-1/2 shards hold (BF16_Optimizer saves none). Not
// the same bytes: the fixtures were pickled by Python >= 3.12, which writes getattr(ZeroStageEnum,
// 'optimizer_states') where the builder writes REDUCE ZeroStageEnum((1,)) (Python < 3.12's form);
// torch.load rebuilds the same member from both.
TEST(PickledClasses, ZeroStageEnumAsSaved) {
  for (const auto& [checkpoint, stage] : {std::pair{"gpt_tp2dp2_z2_fp16", 2}, std::pair{"gpt_tp2pp2dp2_gpu", 1}}) {
    const auto saved = first_osd(checkpoint)->get("zero_stage");
    ASSERT_TRUE(saved && saved->kind == Kind::Object) << checkpoint;
    const auto built = ds::zero_stage_enum(stage);
    EXPECT_EQ(built->as_int(), saved->as_int()) << checkpoint;
    EXPECT_EQ(built->as_int(), stage);
    const auto& args = saved->object->args->items;  // (ZeroStageEnum, 'optimizer_states') or (stage,)
    ASSERT_FALSE(args.empty());
    if (args[0]->kind == Kind::Global) EXPECT_EQ(args[0]->name, built->object->callable->name);
    else EXPECT_EQ(saved->object->callable->name, built->object->callable->name);
  }
  EXPECT_FALSE(first_osd("llama_tp2_bf16opt")->contains("zero_stage"));
}

// The loss scaler an fp16 run starts with (DynamicLossScaler, init_scale 2**16, scale_window 1000,
// min_scale 1) and the static one of bf16 / fp32 runs (LossScaler, cur_scale 1).
TEST(PickledClasses, LossScalersAsSaved) {
  const auto fp16 = first_osd("gpt_tp2dp2_z2_fp16")->get("loss_scaler");
  ASSERT_TRUE(fp16 && fp16->kind == Kind::Object);
  EXPECT_EQ(fp16->object->callable->name, "DynamicLossScaler");
  // The fixture's run has moved cur_scale (2**12 after overflows); every other field is the start state.
  const auto moved = pickle::deep_copy(fp16);
  EXPECT_EQ(moved->object->state->get("cur_scale")->f, 4096.0);
  moved->object->state->set_item("cur_scale", pickle::Value::real(65536.0));
  EXPECT_EQ(bytes(ds::loss_scaler(DType::Float16)), bytes(moved));
  const auto bf16 = first_osd("moe_line_0.19.5")->get("loss_scaler");
  ASSERT_TRUE(bf16 && bf16->kind == Kind::Object);
  EXPECT_EQ(bf16->object->callable->name, "LossScaler");
  EXPECT_EQ(bytes(ds::loss_scaler(DType::BFloat16)), bytes(bf16));
}

// SubparamShape (checkpoint/universal_checkpoint.py): the partition dimension holds the sub-parameter
// sizes (a tuple) or their count; patterns, shape and partition_dim are its __dict__.
TEST(PickledClasses, SubparamShapeFields) {
  const auto v = ds::subparam_shape({"attn.qkv.weight"}, {96, 32}, 0, {32, 32, 32}, true);
  ASSERT_EQ(v->kind, Kind::Object);
  EXPECT_EQ(v->object->callable->s, "deepspeed.checkpoint.universal_checkpoint");
  EXPECT_EQ(v->object->callable->name, "SubparamShape");
  const auto shape = v->object->state->get("shape");
  ASSERT_EQ(shape->items.size(), 2u);
  EXPECT_EQ(shape->items[0]->items.size(), 3u);
  EXPECT_EQ(shape->items[1]->as_int(), 32);
  EXPECT_EQ(v->object->state->get("partition_dim")->as_int(), 0);
  const auto counted = ds::subparam_shape({"attn.qkv.weight"}, {96, 32}, 0, {32, 32, 32}, false);
  EXPECT_EQ(counted->object->state->get("shape")->items[0]->as_int(), 3);
}

}  // namespace deepspeed_pickled_classes_test
