// load/model_info: the steps of model_info_from that read no file, on small in-memory manifests and
// model-file roots (param_shapes as DeepSpeed saves them: one ordered dict name -> torch.Size per
// optimizer group, engine.py _get_zero_param_shapes).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "io/pickle/value.h"
#include "reshard/model_info.h"
#include "support/errors.h"

namespace model_info_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
using json = nlohmann::json;
using pickle::Value;
using pickle::ValuePtr;

namespace {

using ucpkit::testing::error_of;

formats::universal::UniversalParam entry(const std::string& name, std::vector<int64_t> shape,
                             std::vector<std::string> states = {"fp32", "exp_avg", "exp_avg_sq"}) {
  formats::universal::UniversalParam p;
  p.name = name;
  p.shape = std::move(shape);
  for (const auto& s : states) p.states[s] = {"zero/" + name + "/" + s + ".pt", 0x1234u};
  return p;
}

UniversalMeta meta_of(json source, std::vector<formats::universal::UniversalParam> params, json patterns = json::object(),
                      int model_files = 1) {
  UniversalMeta meta;
  meta.manifest_path = "/u/manifest.json";
  meta.manifest.source = formats::universal::UniversalSource::from_json(source, "/u/manifest.json");
  meta.manifest.patterns_set = std::move(patterns);
  meta.manifest.params = std::move(params);
  for (int i = 0; i < model_files; ++i) meta.model_files.push_back("/u/mp_rank_0" + std::to_string(i) + "_model_states.pt");
  return meta;
}

// A model file root whose param_shapes lists `groups` (names; shapes do not matter here).
ValuePtr model_root(const std::vector<std::vector<std::string>>& groups) {
  auto list = Value::list();
  for (const auto& g : groups) {
    auto d = Value::dict(true);
    for (const auto& n : g) d->set_item(n, Value::torch_size({2}));
    list->items.push_back(d);
  }
  auto root = Value::dict(true);
  root->set_item("param_shapes", list);
  return root;
}

std::vector<std::string> names_of(const ModelInfo& m) {
  std::vector<std::string> out;
  for (const auto& p : m.params) out.push_back(p.name);
  return out;
}

std::vector<int> groups_of(const ModelInfo& m) {
  std::vector<int> out;
  for (const auto& p : m.params) out.push_back(p.group);
  return out;
}

}  // namespace

TEST(ModelInfoSteps, SourceModelInfoTakesTheLayoutAndCountsModelFiles) {
  const json src = {{"tp", 2}, {"pp", 1}, {"dp", 3}, {"ep", 1}, {"zero_stage", 3}, {"tag", "global_step7"}};
  UniversalMeta meta = meta_of(src, {}, json::object(), 6);  // ZeRO-3: one model file per (TP, DP) rank
  const auto facts = meta.manifest.source;
  const ModelInfo m = source_model_info(meta, facts);
  EXPECT_EQ(m.source_tp, 2);
  EXPECT_EQ(m.source_dp, 3);
  EXPECT_EQ(m.source_zero_stage, 3);
  EXPECT_EQ(m.tag, "global_step7");
  EXPECT_FALSE(m.autoep);
  EXPECT_EQ(m.model_files.size(), 6u);
  meta.model_files.pop_back();
  EXPECT_EQ(error_of([&] { source_model_info(meta, facts); }),
            "/u/manifest.json: 5 model files listed but the source layout has tp*dp = 6");
  // ZeRO-1/2: one per (TP, PP) rank; no tag recorded: global_step0.
  UniversalMeta plain = meta_of({{"tp", 2}, {"pp", 2}, {"autoep", json::array()}}, {}, json::object(), 3);
  EXPECT_EQ(error_of([&] { source_model_info(plain, plain.manifest.source); }),
            "/u/manifest.json: 3 model files listed but the source layout has tp*pp = 4");
  plain.model_files.push_back("/u/mp_rank_03_model_states.pt");
  const ModelInfo p = source_model_info(plain, plain.manifest.source);
  EXPECT_EQ(p.tag, "global_step0");
  EXPECT_TRUE(p.autoep);
}

TEST(ModelInfoSteps, ParamsFromManifestKeepsStatesShapesAndExperts) {
  // ds_to_universal's ZeRO-3 TP = 1 form of a vocabulary tensor keeps its padding rows: the universal
  // shape is cut to original_vocab_size, the stored element count is not.
  const json patterns = {{"vocabulary_parameter_patterns", {"word_embeddings"}}, {"original_vocab_size", 10},
                         {"padded_vocab_size", 16}};
  auto emb = entry("word_embeddings.weight", {16, 4}, {"exp_avg_sq", "fp32", "exp_avg"});
  emb.flat = true;
  auto expert = entry("layers.1.experts.3.w", {2, 4});
  expert.expert = formats::universal::UniversalExpert{1, 3};
  UniversalMeta meta = meta_of({{"tp", 1}}, {emb, entry("norm.weight", {4}), expert}, patterns);
  ModelInfo m = source_model_info(meta, meta.manifest.source);
  const auto by_name = params_from_manifest(m, meta);
  EXPECT_EQ(m.states, (std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"}));
  const ParamInfo& e = by_name.at("word_embeddings.weight");
  EXPECT_EQ(e.shape, (std::vector<int64_t>{10, 4}));
  EXPECT_EQ(e.stored_numel, 64);
  EXPECT_TRUE(e.flat && e.rule.vocab);
  EXPECT_EQ(e.manifest_index, 0);
  EXPECT_EQ(by_name.at("norm.weight").manifest_index, 1);
  EXPECT_TRUE(m.native_moe);
  EXPECT_EQ(by_name.at("layers.1.experts.3.w").expert, 3);
  EXPECT_EQ(by_name.at("layers.1.experts.3.w").moe_layer, 1);
  EXPECT_TRUE(by_name.at("norm.weight").crc32.empty());  // in memory (direct mode): no checksums

  meta.dir = "/u";  // on disk: checksums kept, and required
  ModelInfo d = source_model_info(meta, meta.manifest.source);
  EXPECT_EQ(params_from_manifest(d, meta).at("norm.weight").crc32.at("exp_avg"), 0x1234u);
  meta.manifest.params[1].states["exp_avg"].crc32.reset();
  EXPECT_EQ(error_of([&] { params_from_manifest(d, meta); }),
            "/u/manifest.json: parameter norm.weight state exp_avg has no crc32");
  meta.manifest.params[1].states["exp_avg"].file = "../elsewhere/exp_avg.pt";
  EXPECT_NE(error_of([&] { params_from_manifest(d, meta); }).find("'../elsewhere/exp_avg.pt' is not a relative path"),
            std::string::npos);
}

TEST(ModelInfoSteps, ParamsFromManifestRefusesInconsistentEntries) {
  UniversalMeta meta = meta_of({{"tp", 1}}, {entry("a", {2}), entry("b", {2}, {"fp32", "exp_avg"})});
  ModelInfo m = source_model_info(meta, meta.manifest.source);
  EXPECT_EQ(error_of([&] { params_from_manifest(m, meta); }), "/u/manifest.json: parameter b has 2 states, others 3");
  meta = meta_of({{"tp", 1}}, {entry("a", {2}, {"exp_avg"})});
  m = source_model_info(meta, meta.manifest.source);
  EXPECT_EQ(error_of([&] { params_from_manifest(m, meta); }), "/u/manifest.json: parameter a has no fp32 state");
  auto fused = entry("layers.0.experts.w1", {4, 2, 2});
  fused.autoep = formats::universal::UniversalAutoEp{0, 4};
  meta = meta_of({{"tp", 1}}, {fused});
  m = source_model_info(meta, meta.manifest.source);
  EXPECT_EQ(error_of([&] { params_from_manifest(m, meta); }),
            "/u/manifest.json: AutoEP expert weight layers.0.experts.w1 without source.autoep");
}

TEST(ModelInfoSteps, ModelFileFactsGiveSizesAndTheVocabularyMultiple) {
  const json patterns = {{"vocabulary_parameter_patterns", {"emb"}}, {"original_vocab_size", 250}, {"padded_vocab_size", 256}};
  UniversalMeta meta = meta_of({{"tp", 2}}, {}, patterns, 2);
  auto args_of = [](std::vector<std::pair<std::string, int64_t>> fields) {
    auto args = Value::make_object("argparse", "Namespace", Value::tuple(), Value::dict());
    for (const auto& [k, v] : fields) args->set_attr(k, Value::integer(v));
    auto root = Value::dict(true);
    root->set_item("args", args);
    return root;
  };
  ModelInfo m = source_model_info(meta, meta.manifest.source);
  read_model_file_facts(m, args_of({{"num_attention_heads", 4}, {"hidden_size", 64}, {"make_vocab_size_divisible_by", 64}}), false);
  EXPECT_EQ(m.heads, 4);
  EXPECT_EQ(m.hidden, 64);
  EXPECT_EQ(m.original_vocab, 250);
  EXPECT_EQ(m.vocab_multiple, 64);
  EXPECT_FALSE(m.vocab_multiple_ambiguous);
  // No recorded multiple: inferred from padded_vocab_size (256 = 250 padded to 128 * tp 2; 64 * 2
  // gives 256 as well, so the inference is ambiguous).
  ModelInfo n = source_model_info(meta, meta.manifest.source);
  read_model_file_facts(n, args_of({}), false);
  EXPECT_EQ(n.vocab_multiple, 128);
  EXPECT_TRUE(n.vocab_multiple_ambiguous);
  // AutoEP without a recorded rank order: the saved ds_config's use_data_before_expert_parallelism.
  UniversalMeta ae = meta_of({{"tp", 1}, {"autoep", json::array()}}, {});
  auto root = args_of({});
  auto cfg = Value::dict();
  cfg->set_item("use_data_before_expert_parallelism", Value::boolean(true));
  root->set_item("ds_config", cfg);
  ModelInfo a = source_model_info(ae, ae.manifest.source);
  read_model_file_facts(a, root, false);
  EXPECT_TRUE(a.data_before_expert);
  ModelInfo b = source_model_info(ae, ae.manifest.source);
  read_model_file_facts(b, root, true);  // the manifest's record wins
  EXPECT_FALSE(b.data_before_expert);
}

TEST(ModelInfoSteps, PlaceDenseParamsFollowsParamShapesStageByStage) {
  const json src = {{"tp", 1}, {"pp", 2}, {"pipeline", true}};
  UniversalMeta meta = meta_of(src, {entry("tied_modules.embed.w", {2}), entry("1.a", {2}), entry("1.b", {2}), entry("2.c", {2})},
                               json::object(), 2);
  auto place = [&](const std::vector<std::vector<std::vector<std::string>>>& stages) {
    ModelInfo m = source_model_info(meta, meta.manifest.source);
    const auto by_name = params_from_manifest(m, meta);
    place_dense_params(m, by_name, [&](int s) { return model_root(stages[s]); }, nullptr, "");
    return m;
  };
  // The last stage lists its copy of the tied embedding first.
  ModelInfo m = place({{{"tied_modules.embed.w", "1.a"}, {"1.b"}}, {{"tied_modules.embed.w", "2.c"}}});
  EXPECT_EQ(names_of(m), (std::vector<std::string>{"tied_modules.embed.w", "1.a", "1.b", "2.c"}));
  EXPECT_EQ(groups_of(m), (std::vector<int>{0, 0, 1, 0}));
  EXPECT_EQ(m.groups, 2);
  EXPECT_TRUE(m.tied_copy_first);
  // ... or last.
  EXPECT_FALSE(place({{{"tied_modules.embed.w", "1.a"}, {"1.b"}}, {{"2.c", "tied_modules.embed.w"}}}).tied_copy_first);
  // Copies between the stage's own parameters, a name the manifest lacks, one param_shapes lacks.
  meta.manifest.params.push_back(entry("2.d", {2}));
  EXPECT_NE(error_of([&] { place({{{"tied_modules.embed.w", "1.a", "1.b"}}, {{"2.c", "tied_modules.embed.w", "2.d"}}}); })
                .find("interleaves pipeline-replicated copies"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { place({{{"tied_modules.embed.w", "1.a", "1.b", "x"}}, {{"2.c", "2.d"}}}); }),
            "/u/mp_rank_00_model_states.pt: parameter x has no entry in manifest.json (incomplete universal checkpoint)");
  EXPECT_EQ(error_of([&] { place({{{"tied_modules.embed.w", "1.a", "1.b"}}, {{"2.c"}}}); }),
            "manifest.json: parameter 2.d appears in no model file's param_shapes");
}

TEST(ModelInfoSteps, PlaceDenseParamsMapsZeroThreeSubGroupsToGroups) {
  UniversalMeta meta = meta_of({{"tp", 1}, {"dp", 1}, {"zero_stage", 3}}, {entry("a", {2}), entry("b", {2}), entry("c", {2})});
  ModelInfo m = source_model_info(meta, meta.manifest.source);
  const auto by_name = params_from_manifest(m, meta);
  // param_groups[g]["params"]: the sub-groups of optimizer group g (sub-groups 0 and 2 in group 1).
  auto osd = Value::dict();
  auto groups = Value::list();
  for (std::vector<int64_t> ids : {std::vector<int64_t>{1}, std::vector<int64_t>{0, 2}}) {
    auto g = Value::dict();
    auto l = Value::list();
    for (auto i : ids) l->items.push_back(Value::integer(i));
    g->set_item("params", l);
    groups->items.push_back(g);
  }
  osd->set_item("param_groups", groups);
  place_dense_params(m, by_name, [&](int) { return model_root({{"a"}, {"b"}, {"c"}}); }, osd, "/u/zero/optimizer_state.pt");
  EXPECT_EQ(names_of(m), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(groups_of(m), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(m.groups, 2);
}

TEST(ModelInfoSteps, AutoEpExpertGroupsHoldOnlyExpertWeights) {
  ModelInfo m;
  m.model_files = {"/u/mp_rank_00_model_states.pt"};
  m.params.resize(3);
  m.params[0].group = 0;
  m.params[1].group = 1;
  m.params[1].autoep_experts = 4;
  m.params[2].group = 2;
  mark_autoep_expert_groups(m);
  EXPECT_EQ(m.expert_group_of, (std::vector<int>{1}));
  m.params[2].group = 1;
  EXPECT_EQ(error_of([&] { mark_autoep_expert_groups(m); }),
            "/u/mp_rank_00_model_states.pt: param_shapes group 1 mixes AutoEP expert weights and dense parameters");
}

TEST(ModelInfoSteps, PipelinePositionsFromTheRecordedNumbering) {
  const json numbering = {{"embedding", 1}, {"tied_head", 7}, {"first_block", 3}, {"last_block", 4}, {"final_norm", 5}};
  const json src = {{"tp", 1}, {"pipeline", true}, {"pipeline_numbering", numbering},
                    {"layer_keys", {{"1", {"word_embeddings.weight"}}}}};
  ModelInfo m;
  for (const char* n : {"tied_modules.embed.word_embeddings.weight", "3.self_attention.dense.weight", "3.mlp.w", "5.norm.weight"}) {
    m.params.emplace_back();
    m.params.back().name = n;
  }
  const auto facts = formats::universal::UniversalSource::from_json(src, "m.json");
  set_pipeline_positions(m, facts, "m.json");
  EXPECT_TRUE(m.params[0].tied);
  EXPECT_EQ(m.params[0].layer, 1);  // the embedding's layer file
  EXPECT_EQ(m.params[0].local, "word_embeddings.weight");
  EXPECT_EQ(m.params[1].layer, 3);
  EXPECT_TRUE(m.params[1].transformer);
  EXPECT_TRUE(m.params[2].transformer);  // a block's layer (it has attention)
  EXPECT_FALSE(m.params[3].transformer);
  EXPECT_EQ(m.tied_head_layer, 7);
  EXPECT_EQ(m.layer_keys.at(1), (std::vector<std::string>{"word_embeddings.weight"}));
  // Without a recorded numbering nor one in the patterns, the tied embedding's file is unknown.
  json older = src;
  older.erase("pipeline_numbering");
  EXPECT_NE(error_of([&] { set_pipeline_positions(m, formats::universal::UniversalSource::from_json(older, "m.json"), "m.json"); })
                .find("m.json: pipeline checkpoint without source.pipeline_numbering"),
            std::string::npos);
  m.params[3].name = "final.weight";
  EXPECT_NE(error_of([&] { set_pipeline_positions(m, facts, "m.json"); }).find("is neither <layer>.<name> nor tied_modules"),
            std::string::npos);
}

}  // namespace model_info_test
