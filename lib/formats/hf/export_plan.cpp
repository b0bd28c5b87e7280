// The Hugging Face export plan (export_plan.h).
#include "formats/hf/export_plan.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>

#include "core/error.h"
#include "formats/hf/config.h"
#include "io/safetensors_file.h"

namespace ucpkit::formats::hf {

namespace {

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// The pieces of parameter `i` under rule `r` (rows of dim 0), checked against the model's sizes.
std::vector<Piece> pieces_of(const Rule& r, const std::vector<std::string>& names, size_t i, const std::vector<int64_t>& shape,
                             const ExportPlan& p, const std::string& where) {
  std::vector<Piece> out;
  if (shape.empty()) throw Error(where + ": parameter " + std::to_string(i) + " is 0-dimensional");
  const int64_t rows = shape[0];
  auto piece = [&](int64_t row0, int64_t n, Split s) {
    Piece q;
    q.shape = shape;
    q.shape[0] = n;
    q.param = i;
    q.split = s;
    q.row0 = row0;
    q.rows = n;
    out.push_back(q);
  };
  switch (r.split) {
    case Split::None:
      piece(0, r.vocab && p.vocab > 0 ? p.vocab : rows, Split::None);
      break;
    case Split::Qkv: {
      const int64_t q = p.heads * p.head_dim, kv = p.kv_heads * p.head_dim;
      if (rows != q + 2 * kv)
        throw Error(where + ": " + names[i] + " has " + std::to_string(rows) + " rows, not (heads " + std::to_string(p.heads) +
                    " + 2 x query groups " + std::to_string(p.kv_heads) + ") x head_dim " + std::to_string(p.head_dim));
      piece(0, q, Split::Qkv), piece(q, kv, Split::Qkv), piece(q + kv, kv, Split::Qkv);
      break;
    }
    case Split::GateUp:
      if (rows % 2 != 0) throw Error(where + ": " + names[i] + " has an odd row count " + std::to_string(rows) + " (SwiGLU [W; V] expected)");
      piece(0, rows / 2, Split::None), piece(rows / 2, rows / 2, Split::None);
      break;
  }
  if (r.vocab && p.vocab > rows)
    throw Error(where + ": " + names[i] + " has " + std::to_string(rows) + " rows, fewer than the vocabulary " + std::to_string(p.vocab));
  return out;
}

// A planned tensor with its place in the file order.
struct Keyed {
  long layer;
  size_t rule;
  long expert;
  Piece piece;
};

// --hf-experts fused: per (layer, expert rule) the experts' parameters, one tensor of them stacked.
using ExpertGroups = std::map<std::pair<long, size_t>, std::map<long, size_t>>;  // (layer, rule) -> expert -> param

void add_fused(const ExpertGroups& groups, const Family& fam, const ExportInput& in, int64_t experts, const std::string& where,
               std::vector<Keyed>& keyed) {
  for (const auto& [at, members] : groups) {
    const Rule& r = fam.rules[at.second];
    Piece q;
    q.name = filled(r.fused, at.first, -1);
    for (const auto& [e, i] : members) {
      if (e != static_cast<long>(q.stack.size()) || in.shapes[i] != in.shapes[members.begin()->second])
        throw Error(where + ": " + q.name + ": experts 0.." + std::to_string(experts - 1) + " of one shape expected, expert " +
                    std::to_string(e) + " (" + in.names[i] + ") breaks the run");
      q.stack.push_back(i);
    }
    if (static_cast<int64_t>(q.stack.size()) != experts)
      throw Error(where + ": " + q.name + ": " + std::to_string(q.stack.size()) + " experts, the args say " + std::to_string(experts));
    q.param = q.stack.front();
    q.shape = in.shapes[q.param];
    q.rows = q.shape.empty() ? 1 : q.shape[0];
    q.shape.insert(q.shape.begin(), experts);
    keyed.push_back({at.first, at.second, -1, std::move(q)});
  }
}

}  // namespace

uint64_t ExportPlan::bytes() const {
  uint64_t b = 0;
  for (const auto& t : tensors) b += static_cast<uint64_t>(numel(t.shape)) * dtype_size(dtype);
  return b;
}

ExportPlan plan_hf_export(const std::vector<Family>& families, const nlohmann::json& facts_in, const ExportInput& in,
                          DType dtype, uint64_t shard_bytes, const std::string& where, bool fused_experts) {
  const nlohmann::json facts = with_derived_facts(facts_in, in.names);
  const Family& fam = select_family(families, facts, where);
  const bool moe = facts.value("experts", int64_t{0}) > 0;
  if (fused_experts && moe && std::none_of(fam.rules.begin(), fam.rules.end(), [](const Rule& r) { return !r.fused.empty(); }))
    throw UsageError("--hf-experts fused: family map " + fam.family + " (" + fam.origin + ") has no fused expert layout");
  fused_experts = fused_experts && moe;
  ExportPlan p;
  p.family = fam.family;
  p.origin = fam.origin;
  p.dtype = dtype;
  p.heads = facts.at("heads").get<int64_t>();
  p.kv_heads = facts.at("kv_heads").get<int64_t>();
  p.head_dim = facts.at("head_dim").get<int64_t>();
  p.vocab = in.vocab;

  // Order: the rules' order within a layer (experts ascending within a rule), layers ascending; rules
  // without {L} before the first layer rule come first (embedding), the others last (final norm, head).
  std::vector<Keyed> keyed;
  ExpertGroups groups;
  size_t first_layer_rule = fam.rules.size();
  for (size_t r = 0; r < fam.rules.size(); ++r)
    if (fam.rules[r].megatron_core.front().find("{L}") != std::string::npos) {
      first_layer_rule = r;
      break;
    }
  for (size_t i = 0; i < in.names.size(); ++i) {
    const auto m = match_rule(fam, in.names[i]);
    if (!m)
      throw Error(where + ": parameter " + in.names[i] + " has no rule in Hugging Face family map " + fam.family + " (" +
                  fam.origin + "): it would be dropped");
    const Rule& r = fam.rules[m->rule];
    if (!rule_for_layer(r, facts, m->layer))
      throw Error(where + ": parameter " + in.names[i] + " belongs to " + (r.layers == Layers::Moe ? "an MoE" : "a dense") +
                  " layer, but the args make layer " + std::to_string(m->layer) + " " +
                  (moe_layer(facts, m->layer) ? "an MoE layer" : "a dense layer") + " (moe_layer_freq)");
    if (r.vocab && p.vocab == 0) p.vocab = in.shapes[i].empty() ? 0 : in.shapes[i][0];
    const bool fused = fused_experts && !r.fused.empty();
    if (fused && m->expert >= 0) {
      groups[{m->layer, m->rule}][m->expert] = i;
      continue;
    }
    auto pieces = pieces_of(r, in.names, i, in.shapes[i], p, where);
    const auto names = fused ? std::vector<std::string>{filled(r.fused, m->layer, -1)} : hf_names(fam, *m);
    const long layer = m->layer >= 0 ? m->layer : (m->rule < first_layer_rule ? -1 : LONG_MAX);
    for (size_t k = 0; k < pieces.size(); ++k) {
      pieces[k].name = names[k];
      keyed.push_back({layer, m->rule, m->expert, pieces[k]});
    }
  }
  add_fused(groups, fam, in, facts.value("experts", int64_t{0}), where, keyed);
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const Keyed& a, const Keyed& b) {
                     return a.layer != b.layer ? a.layer < b.layer : a.rule != b.rule ? a.rule < b.rule : a.expert < b.expert;
                   });
  std::set<std::string> seen;
  for (auto& k : keyed) {
    if (!seen.insert(k.piece.name).second)
      throw Error(where + ": Hugging Face tensor " + k.piece.name + " would be written twice (family map " + fam.origin + ")");
    p.tensors.push_back(std::move(k.piece));
  }
  if (!facts.at("tied").get<bool>() && std::none_of(p.tensors.begin(), p.tensors.end(), [](const Piece& t) { return t.name == "lm_head.weight"; }))
    throw Error(where + ": untied embeddings (args.untie_embeddings_and_output_weights) but no output_layer.weight");

  uint64_t used = 0;
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    const uint64_t n = static_cast<uint64_t>(numel(p.tensors[t].shape)) * dtype_size(dtype);
    if (p.shards.empty() || (used > 0 && used + n > shard_bytes)) p.shards.emplace_back(), used = 0;
    p.shards.back().push_back(t);
    used += n;
  }
  for (size_t k = 0; k < p.shards.size(); ++k) p.files.push_back(safetensors_shard_file(k, p.shards.size()));
  p.config = hf_config(fam, facts, p.vocab, dtype);
  return p;
}

nlohmann::json ExportPlan::to_json() const {
  nlohmann::json j;
  j["family"] = family;
  j["map"] = origin;
  j["dtype"] = std::string(dtype_name(dtype));
  j["vocab_size"] = vocab;
  j["tensors"] = tensors.size();
  j["bytes"] = bytes();
  auto& files_j = j["files"] = nlohmann::json::array();
  for (size_t k = 0; k < shards.size(); ++k) {
    nlohmann::json names = nlohmann::json::array();
    for (size_t t : shards[k]) names.push_back(tensors[t].name);
    files_j.push_back({{"file", files[k]}, {"tensors", names}});
  }
  j["config"] = nlohmann::json::parse(config.dump());
  return j;
}

}  // namespace ucpkit::formats::hf
