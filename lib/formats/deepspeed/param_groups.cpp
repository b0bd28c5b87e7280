// Megatron's decay / no-decay rule and DeepSpeed's expert group names (param_groups.h).
#include "formats/deepspeed/param_groups.h"

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

}  // namespace ucpkit::formats::deepspeed
