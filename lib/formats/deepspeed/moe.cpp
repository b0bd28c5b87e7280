// Native DeepSpeed MoE rank topology and expert numbering.
#include "formats/deepspeed/moe.h"

#include <regex>

#include "core/error.h"
#include "formats/deepspeed/param_groups.h"

namespace ucpkit::formats::deepspeed {

EpCoords ep_coords(int dp_rank, int dp, int ep, bool data_before_expert) {
  if (ep <= 0 || dp % ep)
    throw Error("expert-parallel size " + std::to_string(ep) + " does not divide data-parallel size " +
                std::to_string(dp));
  const int edp = dp / ep;
  if (data_before_expert) return {dp_rank / edp, dp_rank % edp};
  return {dp_rank % ep, dp_rank / ep};
}

namespace {
const std::regex& expert_re() {
  static const std::regex re(R"((deepspeed_experts\.)(\d+)(\.))");
  return re;
}
}  // namespace

std::optional<int> local_expert_index(const std::string& name) {
  std::smatch m;
  if (!std::regex_search(name, m, expert_re())) return std::nullopt;
  return std::stoi(m[2].str());
}

std::string with_expert_index(const std::string& name, int index) {
  std::smatch m;
  if (!std::regex_search(name, m, expert_re())) return name;
  return m.prefix().str() + m[1].str() + std::to_string(index) + m[3].str() + m.suffix().str();
}

std::optional<int> transformer_layer_index(const std::string& name) {
  static const std::regex re(R"(layers\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(name, m, re)) return std::nullopt;
  return std::stoi(m[1].str());
}

std::map<int, int> expert_layer_numbers(const std::map<int, ExpertFileLayer>& layers) {
  std::map<int, int> out;
  bool all_named = true;
  for (const auto& [id, l] : layers) {
    if (l.named.size() > 1)
      throw Error(l.file + ": MoE layer " + std::to_string(id) + "'s expert files hold parameters of layers." +
                  std::to_string(*l.named.begin()) + " and layers." + std::to_string(*l.named.rbegin()));
    all_named = all_named && !l.unnamed && l.named.size() == 1;
  }
  const ExpertFileLayer* before = nullptr;
  int before_id = -1;
  for (const auto& [id, l] : layers) {
    out[id] = all_named ? *l.named.begin() : id;
    if (all_named && before && *before->named.begin() >= *l.named.begin())
      throw Error(l.file + ": its experts are in layers." + std::to_string(*l.named.begin()) + " but " + before->file +
                  " (an earlier MoE layer, " + std::to_string(before_id) + " < " + std::to_string(id) +
                  ") holds those of layers." + std::to_string(*before->named.begin()) +
                  ": the layer_L_ file numbering (DeepSpeed's moe_layer_id, the MoE modules' order) "
                  "disagrees with the parameter names");
    before = &l;
    before_id = id;
  }
  return out;
}

std::optional<int> ep_size_from_group_name(const std::string& group_name) {
  return ep_size_of_group_name(group_name);  // the one spelling: param_groups.h
}

}  // namespace ucpkit::formats::deepspeed
