// ucp-load's target defaults: every target dimension or precision the command line leaves
// out is the source's, never a fixed value, and the summary says which were taken from it. DP is
// given, or comes from the world size (DP = world size / (TP * PP)). Plain logic on ModelInfo, no I/O.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "reshard/model_info.h"
#include "reshard/output_format.h"
#include "reshard/ucp_info.h"

namespace ucpkit::reshard {

// Which target fields the caller set in TargetLayout; the others are filled from the source. The
// defaults (everything given) keep a caller that fills TargetLayout itself unchanged.
struct TargetGiven {
  bool tp = true, pp = true, dp = true, zero_stage = true, ep = true, dtype = true;
  int64_t world_size = 0;  // --world-size: DP = world_size / (TP * PP) when DP is not given (0: none)
};

// Fills the fields of `t` that `given` leaves out: TP, PP and EP as the source's layout, the ZeRO
// stage as the source's (its shards, else its ds_config / args), the dtype as the source's training
// precision (ds_config / args; bf16 for BF16_Optimizer shards), DP from the world size. Returns the
// values taken from the source, {"ep": 2, "dtype": "fp16"} (option spelling). Throws UsageError naming
// the option to give when the source does not record a value, when --dp and --world-size are both
// missing, or when the world size is not a multiple of TP * PP or disagrees with --dp. A format
// whose writer takes no layout options (OutputWriter::takes_layout_options: safetensors, DCP) takes
// only the dtype.
nlohmann::json apply_source_defaults(TargetLayout& t, const TargetGiven& given, const ModelInfo& model,
                                     OutputFormat format);

// Whether each parameter keeps the dtype its source stored it in, there being no one precision to default
// to: a universal folder made from a DCP whose parameters differ in dtype (bf16 beside fp32; the
// manifest's per-parameter dtypes and states' source_dtype), written as DCP without --dtype.
// apply_source_defaults then says "as stored" instead of asking for --dtype.
bool keeps_stored_dtypes(const TargetGiven& given, const ModelInfo& model, OutputFormat format);

// One line for the summary: "from the source: ep 2, dtype fp16" ("" when nothing was taken).
std::string describe_source_defaults(const nlohmann::json& from_source);

// A dtype as the --dtype option spells it (bf16, fp16, fp32).
std::string dtype_option_name(DType t);

}  // namespace ucpkit::reshard
