// Megatron's decay / no-decay rule and DeepSpeed's expert group names (param_groups.h).
#include "formats/deepspeed/param_groups.h"

#include <regex>
#include <string_view>

namespace ucpkit::formats::deepspeed {
namespace {

constexpr std::string_view kExpertGroupPrefix = "ep_size_";

}  // namespace

bool megatron_weight_decay(const std::string& name, const std::vector<int64_t>& shape) {
  const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  return !(bias || shape.size() == 1);
}

int megatron_group_slot(const std::string& name, const std::vector<int64_t>& shape) {
  return megatron_weight_decay(name, shape) ? 0 : 1;
}

std::string expert_group_name(int ep) { return std::string(kExpertGroupPrefix) + std::to_string(ep); }

std::optional<int> ep_size_of_group_name(const std::string& group_name) {
  for (size_t at = group_name.find(kExpertGroupPrefix); at != std::string::npos;
       at = group_name.find(kExpertGroupPrefix, at + 1)) {
    size_t i = at + kExpertGroupPrefix.size();
    int64_t v = 0;
    size_t digits = 0;
    for (; i < group_name.size() && group_name[i] >= '0' && group_name[i] <= '9' && digits < 9; ++i, ++digits)
      v = v * 10 + (group_name[i] - '0');
    if (digits > 0) return static_cast<int>(v);
  }
  return std::nullopt;
}

nlohmann::json layout_free_group(nlohmann::json group) {
  if (!group.is_object()) return group;
  group.erase("params");
  if (auto it = group.find("name"); it != group.end() && it->is_string() && ep_size_of_group_name(it->get<std::string>())) {
    static const std::regex ep(std::string(kExpertGroupPrefix) + "[0-9]+");
    *it = std::regex_replace(it->get<std::string>(), ep, std::string(kExpertGroupPrefix) + "<EP>");
  }
  return group;
}

std::vector<SavedParamGroup> saved_param_groups(const std::vector<pickle::ValuePtr>& groups) {
  using pickle::Kind;
  std::vector<SavedParamGroup> out;
  for (const auto& g : groups) {
    SavedParamGroup s;
    if (g && g->kind == Kind::Dict) {
      if (auto m = g->get("moe"); m && m->kind == Kind::Bool) s.moe = m->b;
      if (auto n = g->get("name"); n && n->kind == Kind::Str) s.name = n->s;
      if (auto wd = g->get("weight_decay"); wd && (wd->kind == Kind::Float || wd->kind == Kind::Int)) s.weight_decay = wd->as_float();
    }
    out.push_back(std::move(s));
  }
  return out;
}

bool saved_by_megatron(const pickle::ValuePtr& root) {
  using pickle::Kind;
  if (!root || root->kind != Kind::Dict) return false;
  if (auto module = root->get("module"); module && module->kind == Kind::Dict && module->contains("language_model")) return true;
  auto args = root->get("args");
  return args && args->kind == Kind::Object && args->attr("num_layers") != nullptr;
}

void rename_expert_group(const pickle::ValuePtr& group, const std::string& name) {
  if (!group || group->kind != pickle::Kind::Dict || !group->contains("name")) return;
  if (auto moe = group->get("moe"); moe && moe->kind == pickle::Kind::Bool && moe->b) group->set_item("name", pickle::Value::str(name));
}

pickle::ValuePtr expert_param_group(const pickle::ValuePtr& dense, int ep, int64_t index) {
  auto g = pickle::deep_copy(dense);
  g->set_item("params", pickle::Value::list({pickle::Value::integer(index)}));
  g->set_item("moe", pickle::Value::boolean(true));
  g->set_item("name", pickle::Value::str(expert_group_name(ep)));
  return g;
}

}  // namespace ucpkit::formats::deepspeed
