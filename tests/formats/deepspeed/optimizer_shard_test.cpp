// OptimizerShard: every `*_optim_states.pt` of the load, ucp, autoep and pec fixtures (torch.save
// files of DeepSpeed's layouts, every version line and flavour they hold) read and written back gives
// the pickle of the original `optimizer_state_dict`; malformed shards are refused naming file and key.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/deepspeed/pickled_classes.h"
#include "formats/deepspeed/version_line.h"
#include "io/pickle/pickler.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"

namespace deepspeed_optimizer_shard_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::deepspeed::OptimizerShard;
using formats::deepspeed::read_optimizer_shard;
using formats::deepspeed::to_pickle;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// Protocol-2 bytes of `v`, storages numbered in order of first use (so two trees that reference the
// same storages in the same places pickle alike).
std::string pickled(const ValuePtr& v) {
  std::map<const Storage*, int> ids;
  pickle::PickleOptions o;
  o.storage_id = [&](const std::shared_ptr<Storage>& s) {
    auto [it, fresh] = ids.try_emplace(s.get(), static_cast<int>(ids.size()));
    return Value::tuple({Value::str("storage"), Value::str(std::to_string(it->second))});
  };
  return pickle::pickle(v, o);
}

// The fixtures' optimizer shards as DeepSpeed (or its generator) wrote them: not the ucp-load outputs
// under runs/, not the damaged bad_* copies.
// Value equality: what torch.load would rebuild, sharing aside. The pickler memoizes shared values,
// and a file torch.save wrote names each DeepSpeed class once (later uses are memo gets) while the
// model builds one class reference per object: same values, other bytes.
bool same(const ValuePtr& a, const ValuePtr& b);
bool same_seq(const std::vector<ValuePtr>& a, const std::vector<ValuePtr>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}
bool same(const ValuePtr& a, const ValuePtr& b) {
  if (!a || !b) return !a && !b;
  if (a->kind != b->kind || a->b != b->b || a->i != b->i || a->s != b->s || a->name != b->name ||
      a->ordered != b->ordered || a->shape != b->shape || a->dtype != b->dtype || !same_seq(a->items, b->items) ||
      a->entries.size() != b->entries.size() || !same(a->dict_state, b->dict_state))
    return false;
  if (a->kind == Kind::Float && !(a->f == b->f)) return false;
  for (size_t i = 0; i < a->entries.size(); ++i)
    if (!same(a->entries[i].first, b->entries[i].first) || !same(a->entries[i].second, b->entries[i].second))
      return false;
  if (a->kind == Kind::Tensor) {
    const Tensor &x = *a->tensor, &y = *b->tensor;
    if (x.storage() != y.storage() || x.storage_offset() != y.storage_offset() || x.shape() != y.shape() ||
        x.strides() != y.strides() || x.dtype() != y.dtype() || !same(a->tensor_type, b->tensor_type) ||
        !same(a->tensor_state, b->tensor_state))
      return false;
  }
  if (a->kind == Kind::Object) {
    const auto &x = *a->object, &y = *b->object;
    if (x.build != y.build || !same(x.callable, y.callable) || !same(x.args, y.args) || !same(x.kwargs, y.kwargs) ||
        !same(x.state, y.state) || !same_seq(x.list_items, y.list_items) || x.dict_items.size() != y.dict_items.size())
      return false;
  }
  return true;
}

std::vector<std::string> fixture_shards(std::vector<std::string>* missing) {
  std::vector<std::string> out;
  for (const char* area : {"reshard", "to_universal", "autoep", "pec"}) {
    const fs::path dir = fs::path(UCPKIT_BUILD_DIR) / "fixtures" / area;
    if (!fs::is_directory(dir)) {
      missing->push_back(area);
      continue;
    }
    for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
      const std::string name = it->path().filename().string();
      if (it->is_directory() && (name == "runs" || name.rfind("bad_", 0) == 0 || name == "ref")) {
        it.disable_recursion_pending();  // ref/: ucp-load's reference outputs of our own writer
        continue;
      }
      // expp_rank_*_optim_states.pt: a native-MoE expert file (its parameters' optimizer states), no shard.
      if (it->is_regular_file() && name.ends_with("_optim_states.pt") && name.rfind("expp_rank_", 0) != 0)
        out.push_back(it->path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string flavor_name(const OptimizerShard& s) {
  switch (s.flavor) {
    case OptimizerShard::Flavor::Zero12: return "zero12";
    case OptimizerShard::Flavor::Bf16Optimizer: return "bf16_optimizer";
    case OptimizerShard::Flavor::Zero3: return s.partition_groups.empty() ? "zero3" : "zero3_autoep";
  }
  return "?";
}

}  // namespace

TEST(OptimizerShard, FixturesRoundTripToTheSamePickle) {
  std::vector<std::string> missing;
  const auto files = fixture_shards(&missing);
  if (!missing.empty())
    GTEST_SKIP() << "fixtures not built; run ctest -R '^fixtures_(load|ucp|autoep|pec)$' first (missing: "
                 << missing.size() << " areas)";
  std::map<std::string, int> flavors, lines, same_values;
  int same_bytes = 0;
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const TorchFile tf = load_torch_file(f);
    const OptimizerShard s = read_optimizer_shard(tf);
    ++flavors[flavor_name(s)];
    if (auto v = tf.root->get("ds_version"); v && v->kind == Kind::Str)
      if (auto line = formats::deepspeed::moe_line_of_release(v->s)) ++lines[*line];
    const ValuePtr original = tf.root->get("optimizer_state_dict");
    if (!s.elastic) {  // the list ds_to_universal lifts into the universal optimizer_state.pt
      const ValuePtr groups = formats::deepspeed::saved_param_groups(original);
      ASSERT_TRUE(groups);
      EXPECT_EQ(groups->items, s.param_groups);
    }
    const ValuePtr written = to_pickle(s);
    if (pickled(original) == pickled(written)) {
      ++same_bytes;
    } else {
      EXPECT_TRUE(same(original, written)) << "to_pickle(read) is not the file's optimizer_state_dict";
      ++same_values[flavor_name(s)];
    }
  }
  // Which files give other bytes (and why), so a change there is seen: the ZeRO-1/2 and BF16 files
  // torch.save wrote memoize the fragment_address class (one GLOBAL, then memo gets).
  std::string other;
  for (const auto& [fl, n] : same_values) other += " " + fl + ":" + std::to_string(n);
  std::cout << files.size() << " shards: " << same_bytes << " the same pickle, the others the same values (" << other
            << " )\n";
  // Every flavour the fixtures offer, and every version line (formats/deepspeed/version_line.h).
  for (const char* fl : {"zero12", "bf16_optimizer", "zero3", "zero3_autoep"})
    EXPECT_GT(flavors[fl], 0) << "no fixture shard of flavour " << fl;
  for (const char* line : {"0.14", "0.17.1", "0.19.2", "0.19.3", "0.19.5"})
    EXPECT_GT(lines[line], 0) << "no fixture shard of version line " << line;
  EXPECT_GT(files.size(), 100u);
}

// A ZeRO-1 shard built the way stage_1_and_2.py `_rigid_state_dict` writes it: one group of two
// parameters (4 + 2 elements) on a rank with 2 elements of padding.
ValuePtr small_zero1_osd() {
  auto m = Value::dict(true);
  m->set_item("a.weight", formats::deepspeed::fragment_address(4, 0));
  m->set_item("a.bias", formats::deepspeed::fragment_address(2, 4));
  auto st = Value::dict();
  st->set_item("step", Value::integer(7));
  st->set_item("exp_avg", Value::of_tensor(Tensor::from_vector(DType::Float32, {8}, std::vector<float>(8, 1.0f))));
  auto state = Value::dict();
  state->entries.emplace_back(Value::integer(0), st);
  auto pg = Value::dict();
  pg->set_item("lr", Value::real(0.1));
  pg->set_item("params", Value::list({Value::integer(0)}));
  auto base = Value::dict();
  base->set_item("state", state);
  base->set_item("param_groups", Value::list({pg}));
  auto osd = Value::dict(true);
  osd->set_item("loss_scaler", formats::deepspeed::loss_scaler(DType::BFloat16));
  osd->set_item("dynamic_loss_scale", Value::boolean(false));
  osd->set_item("overflow", Value::boolean(false));
  osd->set_item("clip_grad", Value::real(1.0));
  osd->set_item("base_optimizer_state", base);
  osd->set_item("single_partition_of_fp32_groups",
                Value::list({Value::of_tensor(Tensor::from_vector(DType::Float32, {6}, std::vector<float>(6, 2.0f)))}));
  osd->set_item("zero_stage", formats::deepspeed::zero_stage_enum(1));
  osd->set_item("group_paddings", Value::list({Value::integer(2)}));
  osd->set_item("partition_count", Value::list({Value::integer(2)}));
  osd->set_item("ds_version", Value::str("0.16.4"));
  osd->set_item("param_slice_mappings", Value::list({m}));
  return osd;
}

ValuePtr root_of(ValuePtr osd) {
  auto root = Value::dict();
  root->set_item("optimizer_state_dict", std::move(osd));
  return root;
}

TEST(OptimizerShard, ReadsTheFieldsDeepSpeedNames) {
  const auto osd = small_zero1_osd();
  const auto s = read_optimizer_shard(root_of(osd), "r/optim.pt");
  EXPECT_EQ(s.flavor, OptimizerShard::Flavor::Zero12);
  ASSERT_EQ(s.groups.size(), 1u);
  const auto& g = s.groups[0];
  ASSERT_EQ(g.fragments.size(), 2u);
  EXPECT_EQ(g.fragments[1].param, "a.bias");
  EXPECT_EQ(g.fragments[1].start, 4);
  EXPECT_EQ(g.fragments[1].numel, 2);
  EXPECT_EQ(g.fp32.numel(), 6);
  EXPECT_EQ(g.step->as_int(), 7);
  ASSERT_EQ(g.moments.size(), 1u);
  EXPECT_EQ(g.moments[0].first, "exp_avg");
  EXPECT_EQ(g.padding, 2);
  EXPECT_EQ(g.partition_count, 2);
  EXPECT_EQ(s.zero_stage->as_int(), 1);
  // Written back: the same keys in the same order (stage_1_and_2.py `_rigid_state_dict`) and the same
  // pickle, tensors shared with the read tree (zero-copy).
  const auto back = to_pickle(s);
  std::vector<std::string> keys;
  for (const auto& [k, v] : back->entries) keys.push_back(k->s);
  EXPECT_EQ(keys, (std::vector<std::string>{"loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad",
                                            "base_optimizer_state", "single_partition_of_fp32_groups", "zero_stage",
                                            "group_paddings", "partition_count", "ds_version", "param_slice_mappings"}));
  EXPECT_EQ(pickled(back), pickled(osd));
}

TEST(OptimizerShard, ShardedStatesAreWhatDsToUniversalLeavesOut) {
  // ds_to_universal.py _save_optimizer_state: sharded_states = [BASE_OPTIMIZER_STATE,
  // PARAM_SLICE_MAPPINGS, SINGLE_PARTITION_OF_FP32_GROUPS].
  std::vector<std::string> sharded;
  const auto osd = small_zero1_osd();
  for (const auto& [k, v] : osd->entries)
    if (formats::deepspeed::is_sharded_state(k->s)) sharded.push_back(k->s);
  EXPECT_EQ(sharded, (std::vector<std::string>{"base_optimizer_state", "single_partition_of_fp32_groups",
                                               "param_slice_mappings"}));
}

TEST(OptimizerShard, Bf16OptimizerHasNoLossScalingKeys) {
  // bf16_optimizer.py `state_dict`: clip_grad, base_optimizer_state, single_partition_of_fp32_groups,
  // group_paddings, partition_count, ds_version, param_slice_mappings.
  auto osd = small_zero1_osd();
  for (const char* k : {"loss_scaler", "dynamic_loss_scale", "overflow", "zero_stage"}) osd->erase(k);
  const auto s = read_optimizer_shard(root_of(osd), "r/optim.pt");
  EXPECT_EQ(s.flavor, OptimizerShard::Flavor::Bf16Optimizer);
  EXPECT_EQ(pickled(to_pickle(s)), pickled(osd));
}

TEST(OptimizerShard, ErrorsNameTheFileAndTheKey) {
  using ucpkit::testing::error_of;
  const std::string path = "ckpt/global_step1/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt";
  auto read = [&](const ValuePtr& osd) { return [&, osd] { read_optimizer_shard(root_of(osd), path); }; };
  auto without = [](const char* key) {
    auto osd = small_zero1_osd();
    osd->erase(key);
    return osd;
  };
  EXPECT_NE(error_of([&] { read_optimizer_shard(Value::dict(), path); }).find(path + ": no optimizer_state_dict"),
            std::string::npos);
  for (const char* k : {"param_slice_mappings", "single_partition_of_fp32_groups", "base_optimizer_state"}) {
    const std::string e = error_of(read(without(k)));
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_NE(e.find(k), std::string::npos) << e;
  }
  auto bad_fragment = small_zero1_osd();
  bad_fragment->get("param_slice_mappings")->items[0]->set_item("a.bias", Value::str("x"));
  std::string e = error_of(read(bad_fragment));
  EXPECT_NE(e.find(path + ": param_slice_mappings[0] of a.bias"), std::string::npos) << e;
  auto not_tensor = small_zero1_osd();
  not_tensor->get("single_partition_of_fp32_groups")->items[0] = Value::integer(3);
  e = error_of(read(not_tensor));
  EXPECT_NE(e.find(path + ": single_partition_of_fp32_groups[0] is not a tensor"), std::string::npos) << e;
  auto bad_padding = small_zero1_osd();
  bad_padding->get("group_paddings")->items[0] = Value::integer(-1);
  e = error_of(read(bad_padding));
  EXPECT_NE(e.find(path + ": group_paddings[0] is not a count"), std::string::npos) << e;
  auto wrong_group = small_zero1_osd();
  wrong_group->get("base_optimizer_state")->get("state")->entries[0].first = Value::integer(1);
  e = error_of(read(wrong_group));
  EXPECT_NE(e.find(path + ": optimizer state is keyed under 1 but the shard has 1 param groups"), std::string::npos)
      << e;
  auto zero3 = Value::dict(true);
  zero3->set_item("zero_stage", formats::deepspeed::zero_stage_enum(3));
  zero3->set_item("optimizer_state_dict", Value::dict());
  e = error_of(read(zero3));
  EXPECT_NE(e.find(path + ": ZeRO-3 optimizer_state_dict has no fp32_flat_groups"), std::string::npos) << e;
}

TEST(OptimizerShard, Zero3SubGroupOwnersFollowTheParamGroupsLists) {
  // Two optimizer groups; sub-groups 0 and 2 in group 0, sub-group 1 in group 1 (what
  // _set_fp32_optimizer_param_groups records when group 0's parameters span two sub-groups).
  auto group = [](std::vector<int64_t> ids) {
    auto g = Value::dict();
    auto l = Value::list();
    for (auto i : ids) l->items.push_back(Value::integer(i));
    g->set_item("params", l);
    return g;
  };
  const std::string path = "u/zero/optimizer_state.pt";
  EXPECT_EQ(formats::deepspeed::zero3_sub_group_owners({group({0, 2}), group({1})}, 3, path),
            (std::vector<int>{0, 1, 0}));
  using ucpkit::testing::error_of;
  auto owners = [&](std::vector<ValuePtr> groups, size_t n) {
    return error_of([&] { formats::deepspeed::zero3_sub_group_owners(groups, n, path); });
  };
  EXPECT_NE(owners({group({0, 1}), group({1})}, 3).find(path + ": param_groups[1] lists sub-group 1"), std::string::npos);
  EXPECT_NE(owners({group({0, 3})}, 3).find("lists sub-group 3 but the model file has 3"), std::string::npos);
  EXPECT_NE(owners({group({0, 1})}, 3).find(path + ": ZeRO-3 sub-group 2 is in no param group"), std::string::npos);
  EXPECT_NE(owners({Value::dict()}, 1).find(path + ": param_groups[0] has no params list"), std::string::npos);
}

}  // namespace deepspeed_optimizer_shard_test
