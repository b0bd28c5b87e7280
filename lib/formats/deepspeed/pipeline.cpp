// PipelineModule layer numbering, registration order and mp_world_size (see pipeline.h).
#include "formats/deepspeed/pipeline.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace ucpkit::formats::deepspeed {

namespace {

void fill_blocks(PipelineNumbering& n, const std::set<int>& numbered, const std::set<int>& blocks) {
  if (blocks.empty()) return;
  n.first_block = *blocks.begin();
  n.last_block = *blocks.rbegin();
  auto after = numbered.upper_bound(n.last_block);
  n.final_norm = after == numbered.end() ? -1 : *after;
}

}  // namespace

nlohmann::json to_json(const PipelineNumbering& n) {
  return {{"embedding", n.embedding}, {"tied_head", n.tied_head},     {"first_block", n.first_block},
          {"last_block", n.last_block}, {"final_norm", n.final_norm}, {"origin", n.origin}};
}

PipelineNumbering pipeline_numbering_from_json(const nlohmann::json& j, const std::string& where) {
  PipelineNumbering n;
  auto field = [&](const char* k) {
    if (!j.is_object() || !j.contains(k) || !j[k].is_number_integer())
      throw Error(where + ": pipeline_numbering." + k + " is missing or not an integer");
    return j[k].get<int>();
  };
  n.embedding = field("embedding");
  n.tied_head = field("tied_head");
  n.first_block = field("first_block");
  n.last_block = field("last_block");
  n.final_norm = field("final_norm");
  n.origin = j.value("origin", "checkpoint");
  return n;
}

PipelineNumbering detect_pipeline_numbering(const std::map<int, std::vector<std::string>>& layer_keys,
                                            const std::set<int>& numbered, const std::set<int>& blocks,
                                            const std::set<std::string>& tied_locals) {
  PipelineNumbering n;
  n.origin = "checkpoint";
  fill_blocks(n, numbered, blocks);
  if (tied_locals.empty()) return n;
  for (const auto& [idx, keys] : layer_keys) {
    if (numbered.count(idx)) continue;  // a numbered layer's own file
    const bool tied = std::any_of(keys.begin(), keys.end(), [&](const std::string& k) { return tied_locals.count(k); });
    if (!tied) continue;
    if (n.embedding < 0) n.embedding = idx;
    n.tied_head = idx;
  }
  if (n.embedding < 0)
    throw Error("pipeline checkpoint: the tied module (" + *tied_locals.begin() +
                ") is in no layer_NN file that is not a numbered layer's");
  if (n.tied_head == n.embedding) n.tied_head = -1;  // only the embedding spec uses it
  return n;
}

PipelineNumbering pipeline_numbering_from_patterns(const nlohmann::json& pattern_set, const std::set<int>& numbered,
                                                   const std::set<int>& blocks) {
  PipelineNumbering n;
  if (!pattern_set.is_object() || !pattern_set.contains("pipeline_numbering")) return n;
  const auto& p = pattern_set["pipeline_numbering"];
  if (!p.is_object() || !p.contains("embedding") || !p["embedding"].is_number_integer() ||
      !p.contains("tied_head_after_last_block") || !p["tied_head_after_last_block"].is_number_integer())
    throw Error("pattern file: pipeline_numbering needs integer embedding and tied_head_after_last_block");
  n.origin = "patterns";
  fill_blocks(n, numbered, blocks);
  n.embedding = p["embedding"].get<int>();
  if (n.last_block >= 0) n.tied_head = n.last_block + p["tied_head_after_last_block"].get<int>();
  return n;
}

std::pair<int, std::string> split_pipeline_name(const std::string& name) {
  const auto dot = name.find('.');
  if (dot == std::string::npos) return {-2, ""};
  const std::string head = name.substr(0, dot);
  if (!head.empty() && std::all_of(head.begin(), head.end(), [](unsigned char c) { return std::isdigit(c); }))
    return {std::stoi(head), name.substr(dot + 1)};
  if (head == "tied_modules") {
    const auto dot2 = name.find('.', dot + 1);
    if (dot2 == std::string::npos) return {-2, ""};
    return {-1, name.substr(dot2 + 1)};
  }
  return {-2, ""};
}

bool is_block_local(const std::string& local) { return local.find("attention") != std::string::npos; }

int mp_world_size(int tp, int pp, bool pipeline_module) { return pipeline_module ? tp * pp : tp; }

}  // namespace ucpkit::formats::deepspeed
