// The layout record ucp-load leaves in a DeepSpeed output folder: `ucpkit_layout.json`
// beside `latest` says which layout, precision, version line and source the folder holds, so a job
// script can reuse the folder only when it holds what it asks for (`ucp-load --reuse-output`).
// DeepSpeed's and Megatron's loaders read `latest` and the tag folder only; the record is outside both.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "reshard/model_info.h"
#include "reshard/ucp_info.h"

namespace ucpkit::reshard {

inline constexpr const char* kLayoutRecordName = "ucpkit_layout.json";
inline constexpr const char* kLayoutRecordFormat = "ucpkit-layout";

// The record of writing `plan` (target resolved) from `model`: format, version, tool, tp, pp, dp, ep,
// zero_stage, dtype, optimizer ("zero" or "bf16"), padded_vocab, sub_group_size (ZeRO-3), ds_line
// (native MoE) and the source's tag. Only what the written files depend on: the same data through a
// universal folder or read directly, from any path, gives the same record (and the same bytes).
nlohmann::json layout_record(const UcpInfo& plan, const ModelInfo& model);

// The record in the folder `output`; nullopt when it has none or it is not a layout record.
std::optional<nlohmann::json> read_layout_record(const std::string& output);

// "" when `have` records what `want` asks for; else the differences, "tp 2 (requested 1), ep 1
// (requested 4)".
std::string layout_difference(const nlohmann::json& have, const nlohmann::json& want);

}  // namespace ucpkit::reshard
