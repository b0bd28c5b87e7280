// ucp-union --to-names megatron-core | megatron-deepspeed [--model-map FILE]: the universal folder of
// --input (or of the DeepSpeed checkpoint --input, converted first) in the other naming
// (to_universal/megatron_core_names.h, docs/megatron-core-mapping.md); --to-names transformers
// [--param-group JSON]: a Hugging Face folder's DeepSpeed engine form (to_universal/from_hf.h, docs/hf.md).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "tool/result.h"
#include "tool/ucp_convert.h"

namespace ucpkit::tool {

struct UcpNamesOptions {
  std::string to_names;   // --to-names: "megatron-core" or "megatron-deepspeed" (empty: not asked)
  std::string model_map;  // --model-map FILE
  std::string template_dir;  // --template <universal folder> (megatron-deepspeed)
  std::string param_group;   // --param-group JSON (transformers)
};

// --param-group's text as a JSON object of hyperparameters (numbers, booleans, null, strings, lists of numbers;
// no 'params'), for the fresh optimizer of a Hugging Face folder's engine form; UsageError otherwise.
nlohmann::json parse_param_group(const std::string& text);

// Usage errors (exit 2) for the combination with ucp-union's other options.
void check_names_options(const UcpConvertOptions& convert, const UcpNamesOptions& names);

Result run_ucp_union_names(const UcpConvertOptions& convert, const UcpNamesOptions& names);

}  // namespace ucpkit::tool
