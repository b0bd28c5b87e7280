// ucp-load's target defaults: what the command line leaves out is the source's.
#include "reshard/target_defaults.h"

#include "core/error.h"
#include "reshard/output_writer.h"

namespace ucpkit::reshard {

std::string dtype_option_name(DType t) {
  switch (t) {
    case DType::BFloat16: return "bf16";
    case DType::Float16: return "fp16";
    case DType::Float32: return "fp32";
    default: return std::string(dtype_name(t));
  }
}

namespace {

// The source's ZeRO stage: its shards' (recorded by the extract plan), else its saved configuration.
int source_zero_stage(const ModelInfo& m) {
  if (m.source_zero_stage > 0) return m.source_zero_stage;
  if (m.source_config_zero_stage) return *m.source_config_zero_stage;
  throw UsageError("the source does not record its ZeRO stage (no zero_stage in its optimizer shards, no "
                   "ds_config or args in its model file): give --zero-stage");
}

DType source_dtype(const ModelInfo& m) {
  if (m.source_dtype) return *m.source_dtype;
  if (m.source_bf16_optimizer) return DType::BFloat16;  // BF16_Optimizer shards hold bf16 training state
  throw UsageError("the source does not record its precision (no ds_config or args in its model file): give --dtype");
}

// DP from --world-size (and the check that both agree when both are given).
void apply_world_size(TargetLayout& t, const TargetGiven& given) {
  if (given.world_size <= 0) {
    if (!given.dp) throw UsageError("--dp or --world-size is required (see --help)");
    return;
  }
  const int64_t mp = int64_t{t.tp} * t.pp;
  if (given.world_size % mp != 0)
    throw UsageError("--world-size " + std::to_string(given.world_size) + " is not a multiple of TP * PP = " +
                     std::to_string(t.tp) + " * " + std::to_string(t.pp) + " (give --dp, or a world size that is)");
  const int64_t dp = given.world_size / mp;
  if (given.dp && dp != t.dp)
    throw UsageError("--world-size " + std::to_string(given.world_size) + " means DP " + std::to_string(dp) +
                     " at TP " + std::to_string(t.tp) + " PP " + std::to_string(t.pp) + ", but --dp is " +
                     std::to_string(t.dp));
  t.dp = static_cast<int>(dp);
}

}  // namespace

bool keeps_stored_dtypes(const TargetGiven& given, const ModelInfo& m, OutputFormat format) {
  return !given.dtype && !m.source_dtype && m.manifest_only && format == OutputFormat::Dcp;
}

nlohmann::json apply_source_defaults(TargetLayout& t, const TargetGiven& given, const ModelInfo& m,
                                     OutputFormat format) {
  nlohmann::json from = nlohmann::json::object();
  if (keeps_stored_dtypes(given, m, format)) {
    from["dtype"] = "as stored";
  } else if (!given.dtype) {
    t.dtype = source_dtype(m);
    from["dtype"] = dtype_option_name(t.dtype);
  }
  if (!output_writer(format).takes_layout_options()) return from;
  if (!given.tp) from["tp"] = t.tp = m.source_tp;
  if (!given.pp) from["pp"] = t.pp = m.source_pp;
  if (!given.zero_stage) from["zero_stage"] = t.zero_stage = source_zero_stage(m);
  apply_world_size(t, given);
  if (m.pipeline && t.partition_method.empty() && !megatron_blocks(m))  // DeepSpeed's default, said as taken
    from["partition_method"] = t.partition_method = kDefaultPartitionMethod;
  if (!given.ep && (m.native_moe || m.autoep)) {
    from["ep"] = t.ep = m.source_ep;
    if (t.dp % t.ep != 0)
      throw UsageError("the source's EP " + std::to_string(t.ep) + " (--ep's default) does not divide DP " +
                       std::to_string(t.dp) + ": give --ep");
  }
  return from;
}

std::string describe_source_defaults(const nlohmann::json& from_source) {
  if (from_source.empty()) return "";
  std::string s = "from the source (not given on the command line):";
  bool first = true;
  for (const char* k : {"tp", "pp", "ep", "zero_stage", "dtype", "partition_method"}) {
    if (!from_source.contains(k)) continue;
    const auto& v = from_source[k];
    s += std::string(first ? " " : ", ") + k + " " + (v.is_string() ? v.get<std::string>() : v.dump());
    if (std::string(k) == "partition_method") s += " (DeepSpeed's PipelineModule default; --partition-method)";
    first = false;
  }
  return s;
}

}  // namespace ucpkit::reshard
