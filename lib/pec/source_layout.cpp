// Source layout names.
#include "pec/source_layout.h"

#include "core/error.h"

namespace ucpkit::pec {

const std::string& to_string(SourceLayout layout) {
  static const std::string moe = "deepspeed-moe", autoep = "deepspeed-autoep-zero3", universal = "universal";
  switch (layout) {
    case SourceLayout::DeepSpeedMoe: return moe;
    case SourceLayout::DeepSpeedAutoEpZero3: return autoep;
    case SourceLayout::Universal: return universal;
  }
  return moe;
}

SourceLayout parse_source_layout(const std::string& text, const std::string& name) {
  for (SourceLayout l : {SourceLayout::DeepSpeedMoe, SourceLayout::DeepSpeedAutoEpZero3, SourceLayout::Universal})
    if (text == to_string(l)) return l;
  fail(name, "unknown source layout '" + escaped_brief(text) + "' (deepspeed-moe, deepspeed-autoep-zero3 or universal)");
}

}  // namespace ucpkit::pec
