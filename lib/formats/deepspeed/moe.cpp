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

std::optional<int> ep_size_from_group_name(const std::string& group_name) {
  return ep_size_of_group_name(group_name);  // the one spelling: param_groups.h
}

}  // namespace ucpkit::formats::deepspeed
