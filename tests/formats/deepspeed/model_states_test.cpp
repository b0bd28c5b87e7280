// ModelStates against the fixture checkpoints (tests/formats/fixtures.py: dsgen, which writes what
// DeepSpeed's save code writes, line by line): every model-states, layer and expert file read and
// written back gives the same pickle, and a native-MoE file written as its own version line too.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/version_line.h"
#include "io/torch/torch_file.h"
#include "formats/deepspeed/fixture_files.h"
#include "support/errors.h"
#include "support/paths.h"

namespace deepspeed_model_states_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fs = std::filesystem;

namespace {

using ucpkit::testing::fixtures::first_difference;
using ucpkit::testing::fixtures::saved;
using ucpkit::testing::fixtures::step_dir;

std::vector<std::string> model_files(const std::string& checkpoint) {
  return ucpkit::testing::fixtures::files_with(checkpoint, "model_states.pt");
}

const std::vector<std::string> kCheckpoints = {
    "moe_line_0.14", "moe_line_0.17.1", "moe_line_0.19.2", "moe_line_0.19.3", "moe_line_0.19.5",
    "gpt_pp2_bigscience", "gpt_tp2pp2dp2_gpu", "gpt_tp2dp2_z2_fp16", "gpt_zero3_tp2dp2_subgroups", "llama_tp2_bf16opt",
    "autoep_dp4_ep2_zero1_bf16", "autoep_dp4_ep2_zero3_bf16"};

}  // namespace

// Same pickle, not only the same values: DeepSpeed's files are plain dicts, OrderedDicts and
// torch.Size written once each, which the model keeps (entries in file order, the module tree's
// dicts and keys, param_shapes as OrderedDict(name -> torch.Size)).
TEST(ModelStates, EveryFixtureFileRoundTrips) {
  size_t files = 0;
  for (const auto& c : kCheckpoints)
    for (const auto& path : model_files(c)) {
      SCOPED_TRACE(path);
      const TorchFile f = load_torch_file(path);
      const std::string want = saved(f.root, "want.pt");
      const ds::ModelStates m = ds::read_model_states(f, path);
      EXPECT_EQ(first_difference(saved(ds::to_pickle(m), "got.pt"), want), "");
      ++files;
    }
  EXPECT_GE(files, 60u);  // 5 lines x (1 + 8 experts), 7 + 2 pipeline files, 4 ZeRO-3 files, ...
}

TEST(ModelStates, NativeMoeFileIsItsOwnLine) {
  for (const auto& line : ds::moe_version_lines()) {
    const std::string path = (fs::path(kFx) / ("moe_line_" + line.name) / "global_step100" / "mp_rank_00_model_states.pt").string();
    SCOPED_TRACE(path);
    const TorchFile f = load_torch_file(path);
    const ds::ModelStates m = ds::read_model_states(f, path);
    EXPECT_EQ(first_difference(saved(ds::to_pickle(m, line), "line.pt"), saved(f.root, "want.pt")), "");
  }
}

// Fields against the layouts fixtures.py asked dsgen for (dp=4, ep=2; TP 2 x PP 2, ...).
TEST(ModelStates, TypedFields) {
  const std::string moe = (fs::path(kFx) / "moe_line_0.19.5/global_step100/mp_rank_00_model_states.pt").string();
  const ds::ModelStates m = ds::read_model_states(load_torch_file(moe), moe);
  EXPECT_FALSE(m.module_only);
  EXPECT_EQ(m.dp_world_size, 4);
  EXPECT_EQ(m.mp_world_size, 1);
  EXPECT_EQ(m.ds_version, "0.19.5");
  ASSERT_TRUE(m.param_shapes);
  EXPECT_TRUE(m.ds_config);
  EXPECT_TRUE(m.args());
  // DeepSpeed's keys first, then the client state (engine.py: state.update(client_state)).
  const auto client = m.client_state();
  ASSERT_FALSE(client.empty());
  EXPECT_EQ(m.entries.size() - client.size(), ds::moe_version_line("0.19.5").mp_rank_keys.size());
  for (size_t i = 0; i < m.entries.size(); ++i)
    EXPECT_EQ(ds::is_deepspeed_model_key(m.entries[i].first), i < m.entries.size() - client.size()) << m.entries[i].first;
  // The dense groups' names are module tensors (ZeRO names its bit16 params after the module).
  size_t named = 0;
  for (const auto& [name, shape] : m.param_shapes->front())
    for (const auto& [n, v] : m.module)
      if (n == name) {
        EXPECT_EQ(v->tensor->shape(), shape) << name;
        ++named;
      }
  EXPECT_EQ(named, m.param_shapes->front().size());

  const std::string gpt = (fs::path(kFx) / "gpt_tp2pp2dp2_gpu/global_step100/mp_rank_03_model_states.pt").string();
  const ds::ModelStates g = ds::read_model_states(load_torch_file(gpt), gpt);
  EXPECT_EQ(g.dp_world_size, 2);
  EXPECT_EQ(g.mp_world_size, 4);  // TP 2 x PP 2 (pipe engine: mp_world_size = tp * pp)

  const std::string layer = (fs::path(kFx) / "gpt_pp2_bigscience/global_step100/layer_03-model_00-model_states.pt").string();
  const ds::ModelStates l = ds::read_model_states(load_torch_file(layer), layer);
  EXPECT_TRUE(l.module_only);
  EXPECT_FALSE(l.module.empty());
  EXPECT_TRUE(l.entries.empty());
}

// Changing a typed field changes only that entry, in place.
TEST(ModelStates, WrittenFieldsReplaceTheirEntryInPlace) {
  const std::string path = (fs::path(kFx) / "gpt_tp2dp2_z2_fp16/global_step100/mp_rank_00_model_states.pt").string();
  const TorchFile f = load_torch_file(path);
  ds::ModelStates m = ds::read_model_states(f, path);
  m.dp_world_size = 7;
  const auto out = ds::to_pickle(m);
  ASSERT_EQ(out->entries.size(), f.root->entries.size());
  for (size_t i = 0; i < out->entries.size(); ++i) {
    EXPECT_EQ(out->entries[i].first->as_str(), f.root->entries[i].first->as_str());
    if (out->entries[i].first->as_str() == "dp_world_size") EXPECT_EQ(out->entries[i].second->as_int(), 7);
  }
  EXPECT_EQ(f.root->get("dp_world_size")->as_int(), 2);  // the root read is not changed
}

// ds_config and Megatron's args describe the layout written; the source's values stay as they are.
TEST(ModelStates, DsConfigAndArgsDescribeTheTarget) {
  const std::string path = (fs::path(kFx) / "gpt_tp2dp2_z2_fp16/global_step100/mp_rank_00_model_states.pt").string();
  const TorchFile f = load_torch_file(path);
  const ds::ModelStates m = ds::read_model_states(f, path);
  ASSERT_TRUE(m.ds_config);
  const auto batch = m.ds_config->get("train_batch_size");
  ASSERT_TRUE(batch && batch->kind == pickle::Kind::Int);
  ASSERT_EQ(batch->i % 2, 0);  // fixtures.py: DP 2
  const int64_t source_stage = m.ds_config->get("zero_optimization")->get("stage")->as_int();
  EXPECT_EQ(source_stage, 2);

  ds::LayoutFacts t;
  t.tp = 1, t.pp = 1, t.dp = 3, t.zero_stage = 3, t.sub_group_size = 700, t.dtype = DType::BFloat16, t.source_dp = 2;
  t.padded_vocab = 104;
  const auto cfg = ds::retarget_ds_config(m.ds_config, t);
  EXPECT_EQ(cfg->get("zero_optimization")->get("stage")->as_int(), 3);
  EXPECT_EQ(cfg->get("zero_optimization")->get("sub_group_size")->as_int(), 700);
  EXPECT_EQ(cfg->get("train_batch_size")->as_int(), batch->i / 2 * 3);  // same micro batch per rank
  EXPECT_FALSE(cfg->get("fp16")->get("enabled")->as_bool());
  EXPECT_EQ(m.ds_config->get("zero_optimization")->get("stage")->as_int(), source_stage);  // a copy was changed
  t.zero_stage = 1;
  EXPECT_FALSE(ds::retarget_ds_config(cfg, t)->get("zero_optimization")->contains("sub_group_size"));

  const auto args = pickle::deep_copy(m.args());
  ds::retarget_megatron_args(args, t);
  EXPECT_EQ(args->attr("tensor_model_parallel_size")->as_int(), 1);
  EXPECT_EQ(args->attr("data_parallel_size")->as_int(), 3);
  EXPECT_EQ(args->attr("world_size")->as_int(), 3);
  EXPECT_EQ(args->attr("padded_vocab_size")->as_int(), 104);
  EXPECT_TRUE(args->attr("bf16")->as_bool());
  EXPECT_FALSE(args->attr("fp16")->as_bool());
  EXPECT_EQ(m.args()->attr("tensor_model_parallel_size")->as_int(), 2);  // fixtures.py: TP 2
}

// Before 0.17.1 a group's module tensors are views into one flat buffer (the last one ends before
// the padding); from 0.17.1 on each is its own compact tensor.
TEST(ModelStates, Bit16GroupTensorsAreViewsOrCompactCopies) {
  const std::vector<ds::GroupMember> members = {{"a.weight", {2, 3}, 0}, {"a.bias", {2}, 6}, {"b.weight", {3}, 8}};
  auto flat = [] { return Tensor::zeros(DType::BFloat16, {12}).storage(); };  // 11 elements padded to 2 * DP = 4
  auto own = [&](size_t k) { return Tensor::zeros(DType::BFloat16, members[k].shape); };
  const auto views = ds::bit16_group_tensors(false, members, own, flat);
  ASSERT_EQ(views.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(views[k]->tensor->storage(), views[0]->tensor->storage());
    EXPECT_EQ(views[k]->tensor->shape(), members[k].shape);
    EXPECT_EQ(views[k]->tensor->storage_offset(), members[k].offset);
  }
  EXPECT_EQ(views[0]->tensor->storage()->nbytes(), 12u * 2);
  const auto copies = ds::bit16_group_tensors(true, members, own, [] () -> std::shared_ptr<Storage> {
    ADD_FAILURE() << "no flat buffer from 0.17.1 on";
    return nullptr;
  });
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_NE(copies[0]->tensor->storage(), copies[1]->tensor->storage());
  EXPECT_EQ(copies[2]->tensor->shape(), members[2].shape);
}

// A ZeRO-3 AutoEP file written for ZeRO-1 at EP 4: the layers record the new EP size, and
// save_frozen_param (ZeRO >= 2, engine.py v0.19.5:5097) gives None where ZeRO-3 saved {}.
TEST(ModelStates, AutoEpFileRetargeted) {
  const std::string path = (step_dir("autoep_dp4_ep2_zero3_bf16") / "zero_pp_rank_0_mp_rank_00_model_states.pt").string();
  ds::ModelStates m = ds::read_model_states(pickle::deep_copy(load_torch_file(path).root), path);
  ASSERT_TRUE(m.get("frozen_param_shapes"));
  EXPECT_EQ(m.get("frozen_param_shapes")->kind, pickle::Kind::Dict);  // fixtures.py: ZeRO-3
  ASSERT_TRUE(m.get("ds_autoep_layers") && m.get("ds_autoep_layers")->is_sequence());
  EXPECT_EQ(m.get("ds_autoep_layers")->items.at(0)->get("ep_size")->as_int(), 2);
  ds::LayoutFacts t;
  t.dp = 4, t.ep = 4, t.zero_stage = 1, t.autoep = true;
  ds::retarget_autoep(m, t, 0, 0);
  EXPECT_TRUE(m.get("frozen_param_shapes")->is_none());
  EXPECT_TRUE(m.get("frozen_param_fragments")->is_none());
  EXPECT_EQ(m.get("ds_autoep_layers")->items.at(0)->get("ep_size")->as_int(), 4);
  EXPECT_EQ(m.get("ds_autoep_layers")->items.at(0)->get("ep_group_name")->as_str(), "ep_size_4");
  // Where a file has none, or has them in another stage's form (a ZeRO-1 template written for a ZeRO-2
  // target), the target stage decides: {} from ZeRO-2 on, None below (engine.py v0.19.6:5163).
  ds::ModelStates fresh;
  ds::add_frozen_params(fresh, 2);
  EXPECT_EQ(fresh.get("frozen_param_shapes")->kind, pickle::Kind::Dict);
  ds::add_frozen_params(m, 2);
  EXPECT_EQ(m.get("frozen_param_shapes")->kind, pickle::Kind::Dict);
  EXPECT_EQ(m.get("frozen_param_fragments")->kind, pickle::Kind::Dict);
  ds::add_frozen_params(m, 1);
  EXPECT_TRUE(m.get("frozen_param_shapes")->is_none());
}

// The facts extract reads beyond the typed fields, against what the file names say (native MoE: 2
// MoE layers of 4 experts, layer_L_expert_E files; TP 2 x PP 2).
TEST(ModelStates, ExtractAccessors) {
  const std::string moe = (step_dir("moe_line_0.19.5") / "mp_rank_00_model_states.pt").string();
  const ds::ModelStates m = ds::read_model_states(load_torch_file(moe), moe);
  std::map<int, int> experts;  // moe layer -> experts, from the file names
  for (const auto& f : ucpkit::testing::fixtures::files_with("moe_line_0.19.5", "_expert_")) {
    const auto n = ds::parse_file_name(fs::path(f).filename().string());
    experts[n->moe_layer] = std::max(experts[n->moe_layer], n->expert + 1);
  }
  std::vector<int> want;
  for (const auto& [layer, e] : experts) want.push_back(e);
  EXPECT_EQ(ds::num_experts(m), want);
  EXPECT_FALSE(ds::has_autoep_layers(m));
  EXPECT_TRUE(ds::autoep_layers(m, moe).empty());
  const auto shapes = ds::saved_param_shapes(m);
  ASSERT_TRUE(shapes);
  EXPECT_EQ(shapes->groups, *m.param_shapes);
  EXPECT_FALSE(shapes->one_dict);

  const std::string gpt = (step_dir("gpt_tp2pp2dp2_gpu") / "mp_rank_03_model_states.pt").string();
  const ds::ModelStates g = ds::read_model_states(load_torch_file(gpt), gpt);
  EXPECT_EQ(ucpkit::testing::error_of([&] { ds::check_recorded_parallel_sizes(g, gpt, 2, 2); }), "");
  EXPECT_EQ(ucpkit::testing::error_of([&] { ds::check_recorded_parallel_sizes(g, gpt, 1, 2); }),
            gpt + ": inconsistent world sizes: mp_world_size is 4 but the files say tp=1");
  ds::ModelStates no_mp = g;
  no_mp.mp_world_size.reset();
  EXPECT_EQ(ucpkit::testing::error_of([&] { ds::check_recorded_parallel_sizes(no_mp, gpt, 2, 1); }),
            gpt + ": inconsistent world sizes: args.pipeline_model_parallel_size is 2 but the files say 1");
  EXPECT_TRUE(ds::universal_checkpoint_info(g) == g.get("universal_checkpoint_info"));
}

// param_shapes in the forms other writers leave: a list of plain dicts, one dict, a non-dict entry.
TEST(ModelStates, SavedParamShapesForms) {
  auto root = pickle::Value::dict();
  root->set_item("module", pickle::Value::dict());
  auto group = pickle::Value::dict();  // not an OrderedDict: kept untyped
  group->set_item("a.weight", pickle::Value::torch_size({2, 3}));
  auto list = pickle::Value::list();
  list->items = {group, pickle::Value::none()};
  root->set_item("param_shapes", list);
  auto m = ds::read_model_states(root, "x.pt");
  EXPECT_FALSE(m.param_shapes);
  auto s = ds::saved_param_shapes(m);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->not_dicts, 1u);
  ASSERT_EQ(s->groups.size(), 1u);
  EXPECT_EQ(s->groups[0][0].second, (std::vector<int64_t>{2, 3}));
  root->set_item("param_shapes", group);
  s = ds::saved_param_shapes(ds::read_model_states(root, "x.pt"));
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->one_dict);
  root->erase("param_shapes");
  EXPECT_FALSE(ds::saved_param_shapes(ds::read_model_states(root, "x.pt")));
  // AutoEP's rank order must be a boolean.
  auto cfg = pickle::Value::dict();
  cfg->set_item(ds::kUseDataBeforeExpertParallelism, pickle::Value::integer(1));
  root->set_item("ds_config", cfg);
  EXPECT_NE(ucpkit::testing::error_of([&] { ds::autoep_data_before_expert(ds::read_model_states(root, "x.pt"), "x.pt"); })
                .find("x.pt: ds_config.use_data_before_expert_parallelism is not a boolean"),
            std::string::npos);
}

// A rank's model-states file always has DeepSpeed's module entry; without it the file is refused, not
// read as a bare layer dict.
TEST(ModelStates, RankFileWithoutModuleRefused) {
  auto root = pickle::deep_copy(load_torch_file((step_dir("gpt_tp2dp2_z2_fp16") / "mp_rank_00_model_states.pt").string()).root);
  EXPECT_FALSE(ds::read_rank_model_states(root, "r.pt").module_only);
  root->erase("module");
  EXPECT_TRUE(ds::read_model_states(root, "r.pt").module_only);
  EXPECT_EQ(ucpkit::testing::error_of([&] { ds::read_rank_model_states(root, "r.pt"); }),
            "r.pt: not a model-states dict: it has no 'module' entry");
}

}  // namespace deepspeed_model_states_test
