// formats/deepspeed/module_tree: the module dict of the fixtures' model files (tests/formats/fixtures.py,
// torch.save of Megatron's nested state_dict_for_save_checkpoint and of flat state dicts). Flat names
// are the nesting keys joined by '.'; the 0.14 line's _metadata (torch's state_dict versions, with the
// expert keys Megatron pops after state_dict() ran, language_model.py:628-631) dropped and added back
// gives the module as saved.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "formats/deepspeed/fixture_files.h"
#include "formats/deepspeed/module_tree.h"
#include "io/torch/torch_file.h"

namespace deepspeed_module_tree_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;
using pickle::Kind;

namespace {

pickle::ValuePtr module_of(const std::string& checkpoint) {
  return load_torch_file((fx::step_dir(checkpoint) / "mp_rank_00_model_states.pt").string()).root->get("module");
}

}  // namespace

TEST(ModuleTree, NestedAndFlatNames) {
  const auto nested = module_of("moe_line_0.14");
  ASSERT_TRUE(ds::module_is_nested(nested));
  const auto tensors = ds::module_tensors(nested);
  ASSERT_FALSE(tensors.empty());
  std::set<std::string> names;
  for (const auto& [n, v] : tensors) {
    EXPECT_EQ(v->kind, Kind::Tensor);
    names.insert(n);
  }
  EXPECT_EQ(names.size(), tensors.size());
  // The walk's names, followed by hand through the nesting.
  const auto emb = nested->get("language_model")->get("embedding")->get("word_embeddings")->get("weight");
  bool found = false;
  for (const auto& [n, v] : tensors)
    if (n == "language_model.embedding.word_embeddings.weight") found = v == emb;
  EXPECT_TRUE(found);
  EXPECT_EQ(tensors.front().first, "language_model.embedding.word_embeddings.weight");  // file order

  const auto flat = module_of("autoep_dp4_ep2_zero1_bf16");
  EXPECT_FALSE(ds::module_is_nested(flat));
  const auto flat_tensors = ds::module_tensors(flat);
  ASSERT_EQ(flat_tensors.size(), flat->entries.size());
  for (size_t i = 0; i < flat_tensors.size(); ++i) EXPECT_EQ(flat_tensors[i].first, flat->entries[i].first->as_str());
}

TEST(ModuleTree, MetadataDroppedAndAddedBackIsAsSaved) {
  const auto saved = module_of("moe_line_0.14");
  ASSERT_TRUE(ds::module_has_metadata(saved));
  EXPECT_FALSE(ds::module_has_metadata(module_of("moe_line_0.17.1")));
  const auto copy = pickle::deep_copy(saved);
  ds::drop_module_metadata(copy);
  EXPECT_FALSE(ds::module_has_metadata(copy));
  EXPECT_TRUE(ds::module_has_metadata(saved));  // the copy only
  // What Megatron popped from language_model.encoder: DP rank 0's experts (EP rank 0 holds experts
  // 0 and 1 of 4, local index = global index) in module order, named as the expert files name them.
  std::vector<std::string> popped;
  for (const auto& path : fx::files_with("moe_line_0.14", "_expert_")) {
    if (path.find("_expert_0_") == std::string::npos && path.find("_expert_1_") == std::string::npos) continue;
    const TorchFile expert = load_torch_file(path);
    for (const auto& [k, v] : expert.root->entries) {
      const std::string key = k->as_str(), enc = "language_model.encoder.";
      ASSERT_EQ(key.rfind(enc, 0), 0u) << key;
      popped.push_back(key.substr(enc.size()));
    }
  }
  ASSERT_FALSE(popped.empty());
  ds::add_module_metadata(copy, {{"language_model.encoder", popped}});
  EXPECT_EQ(fx::first_difference(fx::saved(copy, "got.pt"), fx::saved(saved, "want.pt")), "");
}

TEST(ModuleTree, LeavesReplacedAndInserted) {
  const auto copy = pickle::deep_copy(module_of("autoep_dp4_ep2_zero1_bf16"));
  const auto before = ds::module_tensors(copy);
  const std::string first = before.front().first;
  std::map<std::string, pickle::ValuePtr> fresh{{first, pickle::Value::integer(1)}};
  const auto with = ds::with_module_leaves(copy, fresh);
  EXPECT_TRUE(fresh.empty());  // taken out
  EXPECT_EQ(with->get(first)->as_int(), 1);
  EXPECT_EQ(copy->get(first)->kind, Kind::Tensor);  // a copy of the dicts
  size_t seen = 0;
  ds::replace_module_tensors(copy, [&](const std::string&, const pickle::ValuePtr&) {
    ++seen;
    return pickle::ValuePtr();
  });
  EXPECT_EQ(seen, before.size());
  ds::insert_module_leaf(copy, "extra.weight", before.front().second);
  EXPECT_EQ(ds::module_tensors(copy).back().first, "extra.weight");
}

}  // namespace deepspeed_module_tree_test
