// formats/deepspeed/autoep against the AutoEP fixtures (tests/formats/fixtures.py: dsgen/autoep.py,
// torch.save of what DeepSpeed v0.19.5 saves; dp 4, ep 2, 2 layers of 4 experts): ds_autoep_layers
// read and written back (retarget_autoep_layers to the file's own layout and place) gives the same
// pickle, ds_zero_partition_groups likewise, the expert-file key rule and the expert file check.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"
#include "formats/deepspeed/fixture_files.h"

namespace deepspeed_autoep_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;
using pickle::Kind;
using ucpkit::testing::error_of;
using pickle::Value;

namespace {

const char* kZero1 = "autoep_dp4_ep2_zero1_bf16";
const char* kZero3 = "autoep_dp4_ep2_zero3_bf16";

}  // namespace

// engine.py:4986-5017 as the fixture generator spells it: layer i is model.layers.<i>.mlp with 4
// experts, 2 per EP rank; ZeRO-1's mp_rank file is rank 0's (EP rank 0, expert-DP rank 0).
TEST(AutoEpFormat, LayersParsedAsSaved) {
  const std::string path = (fx::step_dir(kZero1) / "mp_rank_00_model_states.pt").string();
  const auto m = ds::read_model_states(load_torch_file(path), path);
  const auto layers = ds::autoep_layers(m, path);
  ASSERT_EQ(layers.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const auto& a = layers[i];
    EXPECT_EQ(a.moe_layer_id, i);
    EXPECT_EQ(a.module_path, "model.layers." + std::to_string(i) + ".mlp");
    EXPECT_EQ(a.expert_key_prefix, a.module_path + ".experts");
    EXPECT_EQ(a.num_experts, 4);
    EXPECT_EQ(a.num_local_experts, 2);
    EXPECT_EQ(a.ep_size, 2);
    EXPECT_EQ(a.checkpoint_format, "per_expert_files");
    EXPECT_FALSE(a.zero3_partitioned());
    EXPECT_EQ(a.ep_rank, 0);
    EXPECT_EQ(a.expert_data_parallel_world_size, 2);
    EXPECT_EQ(a.global_expert_end, 2);
  }
  EXPECT_EQ(ds::num_experts(m), (std::vector<int>{4, 4}));
}

// write(read(f)): every model file's ds_autoep_layers rewritten for its own layout and place is the
// list it had, byte for byte (fields, their types, None for ZeRO-1's format version).
TEST(AutoEpFormat, LayersRetargetedToTheirOwnPlaceAreUnchanged) {
  size_t files = 0;
  for (const char* c : {kZero1, kZero3})
    for (const auto& path : fx::files_with(c, "model_states.pt")) {
      const TorchFile f = load_torch_file(path);
      const auto m = ds::read_model_states(f, path);
      if (!ds::has_autoep_layers(m)) continue;  // ZeRO-1's per-expert files
      SCOPED_TRACE(path);
      const auto layers = ds::autoep_layers(m, path);
      const auto copy = pickle::deep_copy(m.get("ds_autoep_layers"));
      const auto& a = layers.at(0);
      ds::retarget_autoep_layers(copy, a.ep_size, a.ep_size * a.expert_data_parallel_world_size, a.zero3_partitioned(),
                                 a.ep_rank, a.expert_data_parallel_rank);
      EXPECT_EQ(fx::first_difference(fx::saved(copy, "got.pt"), fx::saved(m.get("ds_autoep_layers"), "want.pt")), "");
      ++files;
    }
  EXPECT_EQ(files, 5u);  // ZeRO-1's mp_rank file, ZeRO-3's 4 DP ranks
}

// Under ZeRO-3 every rank records its own place; the layers check holds for each.
TEST(AutoEpFormat, Zero3RanksRecordTheirPlace) {
  std::map<std::pair<int, int>, int> places;  // (ep_rank, expert-DP rank) -> files
  for (const auto& path : fx::files_with(kZero3, "model_states.pt")) {
    const auto m = ds::read_model_states(load_torch_file(path), path);
    const auto layers = ds::autoep_layers(m, path);
    ds::check_autoep_zero3_layers(layers, path);
    ASSERT_EQ(layers.size(), 2u);
    const auto& a = layers[0];
    EXPECT_TRUE(a.zero3_partitioned());
    EXPECT_EQ(a.checkpoint_format_version, 1);
    EXPECT_EQ(a.global_expert_start, a.ep_rank * 2);
    ++places[{a.ep_rank, a.expert_data_parallel_rank}];
  }
  EXPECT_EQ(places.size(), 4u);  // dp 4 = ep 2 x expert-DP 2, each place once
}

// ds_zero_partition_groups (stage3.py v0.19.5:3117-3144) read and written back: the same pickle.
TEST(AutoEpFormat, PartitionGroupsRoundTrip) {
  size_t shards = 0;
  for (const auto& path : fx::files_with(kZero3, "optim_states.pt")) {
    SCOPED_TRACE(path);
    const TorchFile f = load_torch_file(path);
    const auto osd = ds::raw_optimizer_state_dict(f.root);
    const auto groups = ds::parse_zero3_partition_groups(osd, path);
    const auto shard = ds::read_optimizer_shard(f);
    ASSERT_FALSE(groups.empty());
    size_t experts = 0;
    for (const auto& g : groups) experts += g.autoep_expert;
    EXPECT_GT(experts, 0u);
    EXPECT_LT(experts, groups.size());  // dense sub-groups too ('replicated')
    EXPECT_EQ(fx::first_difference(fx::saved(ds::zero3_partition_groups_value(groups, shard.expert_group_name), "got.pt"),
                                   fx::saved(osd->get("ds_zero_partition_groups"), "want.pt")),
              "");
    ++shards;
  }
  EXPECT_EQ(shards, 4u);
}

// engine.py:5037-5040: the key of global expert g of <prefix>.<w> in its file is <prefix>.<w>.<g>.
TEST(AutoEpFormat, ExpertFileKeys) {
  EXPECT_EQ(ds::autoep_expert_file_key("model.layers.3.mlp.experts", "w2", 5), "model.layers.3.mlp.experts.w2.5");
  EXPECT_EQ(ds::autoep_weight_names(), (std::vector<std::string>{"w1", "w2", "w3"}));
}

// Every ZeRO-1 per-expert file passes the check; a folded shard, a missing or an extra key and a
// wrong shape are refused naming the file.
TEST(AutoEpFormat, ExpertFilesChecked) {
  const std::string model = (fx::step_dir(kZero1) / "mp_rank_00_model_states.pt").string();
  const auto m = ds::read_model_states(load_torch_file(model), model);
  const auto layers = ds::autoep_layers(m, model);
  const auto shapes = ds::saved_param_shapes(m);
  ASSERT_TRUE(shapes);
  std::map<std::string, std::vector<int64_t>> by_name;
  for (const auto& g : shapes->groups)
    for (const auto& [n, s] : g) by_name[n] = s;
  auto fused = [&](const ds::AutoEpLayer& a) {
    std::map<std::string, std::vector<int64_t>> out;
    for (const auto& w : ds::autoep_weight_names()) out[w] = by_name.at(a.expert_key_prefix + "." + w);
    return out;
  };
  size_t files = 0;
  for (const auto& path : fx::files_with(kZero1, "_expert_")) {
    const auto name = ds::parse_file_name(std::filesystem::path(path).filename().string());
    ASSERT_TRUE(name) << path;
    const auto& a = layers.at(name->moe_layer);
    const auto root = load_torch_file(path).root;
    EXPECT_EQ(error_of([&] { ds::check_autoep_expert_file(root, path, a, name->expert, fused(a)); }), "") << path;
    ++files;
  }
  EXPECT_EQ(files, 8u);  // 2 layers x 4 experts

  const std::string path = fx::files_with(kZero1, "layer_1_expert_3_")[0];
  const auto& a = layers.at(1);
  auto refused = [&](const std::function<void(const pickle::ValuePtr&)>& damage) {
    auto root = pickle::deep_copy(load_torch_file(path).root);
    damage(root);
    return error_of([&] { ds::check_autoep_expert_file(root, path, a, 3, fused(a)); });
  };
  EXPECT_NE(refused([](const auto& r) { r->set_item("folding", Value::boolean(true)); }).find(path + ": folded"),
            std::string::npos);
  EXPECT_NE(refused([](const auto& r) { r->erase("model.layers.1.mlp.experts.w3.3"); }).find("missing key model.layers.1.mlp.experts.w3.3"),
            std::string::npos);
  EXPECT_NE(refused([](const auto& r) { r->set_item("model.layers.1.mlp.experts.w3.2", r->get("model.layers.1.mlp.experts.w3.3")); })
                .find("unexpected key model.layers.1.mlp.experts.w3.2"),
            std::string::npos);
  EXPECT_NE(refused([](const auto& r) { r->set_item("model.layers.1.mlp.experts.w1.3", r->get("model.layers.1.mlp.experts.w2.3")); })
                .find("has shape"),
            std::string::npos);
  // Against another expert index, every key is unexpected.
  EXPECT_NE(error_of([&] { ds::check_autoep_expert_file(load_torch_file(path).root, path, a, 2, fused(a)); })
                .find("unexpected key"),
            std::string::npos);
}

// The expert-DP group of an EP rank (engine.py:1882-1890, utils/groups.py:304), worked for dp 4, ep 2:
// expert-major order puts EP rank r on DP ranks {r, r + 2}; data-before-expert on {2r, 2r + 1}.
TEST(AutoEpFormat, ExpertDataParallelRanks) {
  EXPECT_EQ(ds::autoep_expert_dp_ranks(0, 4, 2, false), (std::vector<int>{0, 2}));
  EXPECT_EQ(ds::autoep_expert_dp_ranks(1, 4, 2, false), (std::vector<int>{1, 3}));
  EXPECT_EQ(ds::autoep_expert_dp_ranks(0, 4, 2, true), (std::vector<int>{0, 1}));
  EXPECT_EQ(ds::autoep_expert_dp_ranks(1, 4, 2, true), (std::vector<int>{2, 3}));
  EXPECT_EQ(ds::autoep_group_name(2), "ep_size_2");
}

}  // namespace deepspeed_autoep_test
