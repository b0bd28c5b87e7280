// The tiers of a PEC store chain: the durable store (--store) and the optional fast tier
// (--fast-store, e.g. node-local /dev/shm). Manifests, reports and plans spell them "durable" and "fast".
#pragma once
#include <string>

namespace ucpkit::pec {

enum class Tier { durable, fast };

const std::string& to_string(Tier tier);
// "durable" or "fast"; anything else is an Error naming `name` (the manifest it came from).
Tier parse_tier(const std::string& text, const std::string& name);

}  // namespace ucpkit::pec
