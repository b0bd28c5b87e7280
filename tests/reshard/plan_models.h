// Small ModelInfo values for the load plan tests without I/O (ucp_info_test.cpp, load_plan_test.cpp).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "reshard/model_info.h"

namespace ucpkit::reshard::test_models {

inline patterns::ParamRule rule(patterns::JoinKind k, int64_t cat_dim = 0, bool vocab = false) {
  patterns::ParamRule r;
  r.kind = k;
  r.cat_dim = cat_dim;
  r.vocab = vocab;
  return r;
}

// Appends a parameter of `shape` (stored_numel its element count) in param group `group`.
inline void add_param(ModelInfo& m, std::string name, std::vector<int64_t> shape, patterns::ParamRule r, int group,
                      int layer = -1) {
  ParamInfo p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.stored_numel = 1;
  for (auto d : p.shape) p.stored_numel *= d;
  p.rule = r;
  p.group = group;
  p.layer = layer;
  m.params.push_back(p);
}

// Two groups; a vocab embedding (cat 0, 10 rows padded to a multiple of 2 * TP), a row-parallel
// weight (cat 1), a replicated norm in the second group.
inline ModelInfo tiny_model() {
  using patterns::JoinKind;
  ModelInfo m;
  m.groups = 2;
  m.states = {"fp32", "exp_avg", "exp_avg_sq"};
  m.original_vocab = 10;
  m.vocab_multiple = 2;
  m.heads = 4;
  add_param(m, "emb", {10, 4}, rule(JoinKind::Cat, 0, true), 0);
  add_param(m, "dense", {4, 8}, rule(JoinKind::Cat, 1), 0);
  add_param(m, "norm", {4}, rule(JoinKind::Replicate), 1);
  return m;
}

// A PipelineModule: layer 1 the word embedding, layers 3-6 transformer blocks, layer 7 the final
// norm. `tied`: the embedding is a tied module (pipeline-replicated) whose copy is layer 8 on the
// last stage, as Megatron-DeepSpeed's GPTModelPipe ties the output head to it.
inline ModelInfo pipeline_model(bool tied = false) {
  using patterns::JoinKind;
  ModelInfo m;
  m.groups = 1;
  m.states = {"fp32", "exp_avg", "exp_avg_sq"};
  m.heads = 2;
  m.pipeline = true;
  add_param(m, "1.word_embeddings.weight", {8, 4}, rule(JoinKind::Cat, 0), 0, 1);
  for (int L = 3; L <= 6; ++L) {
    add_param(m, std::to_string(L) + ".mlp.weight", {4, 4}, rule(JoinKind::Cat, 0), 0, L);
    m.params.back().transformer = true;
  }
  add_param(m, "7.final_layernorm.weight", {4}, rule(JoinKind::Replicate), 0, 7);
  for (auto& p : m.params) p.local = p.name.substr(p.name.find('.') + 1);
  if (tied) {
    auto& e = m.params.front();
    e.name = "tied_modules.embed.word_embeddings.weight";
    e.tied = true;
    e.rule.pipeline_replicated = true;
    m.tied_head_layer = 8;
  }
  return m;
}

}  // namespace ucpkit::reshard::test_models
