// The layout of the checkpoint a PEC store was saved from (an enum, not a string compared
// at each use). Manifests, plans and reports spell it "deepspeed-moe", "deepspeed-autoep-zero3" and
// "universal".
#pragma once
#include <string>

namespace ucpkit::pec {

enum class SourceLayout {
  DeepSpeedMoe,          // native DeepSpeed MoE: expert files beside the ZeRO shards
  DeepSpeedAutoEpZero3,  // DeepSpeed AutoEP under ZeRO-3: experts inside the ZeRO-3 shards
  Universal,             // a universal folder (zero/<param>/...)
};

const std::string& to_string(SourceLayout layout);
// The layout a name spells; anything else is an Error naming `name` (the manifest it came from).
SourceLayout parse_source_layout(const std::string& text, const std::string& name);

}  // namespace ucpkit::pec
