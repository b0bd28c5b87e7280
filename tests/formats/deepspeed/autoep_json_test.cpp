// formats/deepspeed/autoep_json: the JSON form of the AutoEP fixture's ds_autoep_layers (dsgen/autoep.py,
// engine.py:4986-5017) lists each layer's saved fields under their saved names.
#include <gtest/gtest.h>

#include <string>

#include "formats/deepspeed/autoep_json.h"
#include "formats/deepspeed/fixture_files.h"
#include "formats/deepspeed/model_states.h"
#include "io/torch/torch_file.h"

namespace deepspeed_autoep_json_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;

TEST(AutoEpJson, FieldsOfTheSavedLayers) {
  const std::string path = (fx::step_dir("autoep_dp4_ep2_zero1_bf16") / "mp_rank_00_model_states.pt").string();
  const auto m = ds::read_model_states(load_torch_file(path), path);
  const nlohmann::json j = ds::autoep_layers_json(ds::autoep_layers(m, path));
  const auto saved = m.get("ds_autoep_layers");
  ASSERT_EQ(j.size(), saved->items.size());
  for (size_t i = 0; i < j.size(); ++i) {
    ASSERT_EQ(j[i].size(), 6u);
    for (const char* k : {"moe_layer_id", "num_experts", "num_local_experts", "ep_size"})
      EXPECT_EQ(j[i].at(k).get<int64_t>(), saved->items[i]->get(k)->as_int()) << k;
    for (const char* k : {"module_path", "expert_key_prefix"})
      EXPECT_EQ(j[i].at(k).get<std::string>(), saved->items[i]->get(k)->as_str()) << k;
  }
  EXPECT_EQ(j[1].at("module_path"), "model.layers.1.mlp");
  EXPECT_EQ(ds::autoep_layers_json({}), nlohmann::json::array());
}

}  // namespace deepspeed_autoep_json_test
