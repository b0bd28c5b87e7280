// OutputFormat <-> its name.
#include "reshard/output_format.h"

#include <array>
#include <utility>

namespace ucpkit::reshard {

namespace {
constexpr std::array<std::pair<OutputFormat, std::string_view>, 5> kNames{{
    {OutputFormat::DeepSpeed, "deepspeed"},
    {OutputFormat::Safetensors, "safetensors"},
    {OutputFormat::Dcp, "dcp"},
    {OutputFormat::TorchDist, "torch_dist"},
    {OutputFormat::Hf, "hf"},
}};
}  // namespace

std::string_view output_format_name(OutputFormat f) {
  for (const auto& [format, name] : kNames)
    if (format == f) return name;
  return "?";
}

std::optional<OutputFormat> output_format_from_name(std::string_view name) {
  for (const auto& [format, n] : kNames)
    if (n == name) return format;
  return std::nullopt;
}

std::vector<std::string> output_format_names() {
  std::vector<std::string> out;
  for (const auto& entry : kNames) out.emplace_back(entry.second);
  return out;
}

}  // namespace ucpkit::reshard
