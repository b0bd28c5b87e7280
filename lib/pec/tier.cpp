// Tier names.
#include "pec/tier.h"

#include "core/error.h"

namespace ucpkit::pec {

const std::string& to_string(Tier tier) {
  static const std::string durable = "durable", fast = "fast";
  return tier == Tier::fast ? fast : durable;
}

Tier parse_tier(const std::string& text, const std::string& name) {
  if (text == to_string(Tier::durable)) return Tier::durable;
  if (text == to_string(Tier::fast)) return Tier::fast;
  fail(name, "unknown store tier '" + escaped_brief(text) + "' (durable or fast)");
}

}  // namespace ucpkit::pec
