// JSON input: bounded depth, short escaped messages.
#include "core/json_input.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace ucpkit {
namespace {

using json = nlohmann::json;

struct TooDeep {};

json parse_bounded(std::string_view text, const std::string& name) {
  try {
    // nlohmann reports a list's or object's start with the depth of its parent (0 for the outermost),
    // so the kMaxJsonDepth-th nested level starts at depth kMaxJsonDepth - 1.
    return json::parse(text.begin(), text.end(), [](int depth, json::parse_event_t event, json&) {
      const bool opens = event == json::parse_event_t::array_start || event == json::parse_event_t::object_start;
      if (opens && depth >= kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    fail(name, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
}

}  // namespace

json parse_json_input(std::string_view text, const std::string& name, const std::string& what) {
  try {
    return parse_bounded(text, name);
  } catch (const json::exception& e) {
    fail(name, what + ": " + escaped_brief(e.what(), 160));
  }
}

bool try_parse_json_input(std::string_view text, const std::string& name, json& out) {
  try {
    out = parse_bounded(text, name);
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

std::string json_brief(const json& v) {
  if (v.is_array()) return "a list of " + std::to_string(v.size());
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " keys";
  if (v.is_string()) return "\"" + escaped_brief(v.get_ref<const std::string&>(), 40) + "\"";
  return escaped_brief(v.dump(), 40);
}

long long json_integer(const json& v, const std::string& name, const std::string& where, long long lo, long long hi) {
  bool ok = false;
  long long n = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned()) {
      const auto u = v.get<unsigned long long>();
      ok = u <= static_cast<unsigned long long>(std::numeric_limits<long long>::max());
      n = static_cast<long long>(u);
    } else {
      ok = true;
      n = v.get<long long>();
    }
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    ok = std::isfinite(d) && std::trunc(d) == d && d >= -9.2e18 && d <= 9.2e18;
    n = ok ? static_cast<long long>(d) : 0;
  }
  if (!ok || n < lo || n > hi)
    fail(name, where + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                   "], found " + json_brief(v));
  return n;
}

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json json_safe(const nlohmann::json& j) { return nlohmann::json::parse(json_text(j)); }

}  // namespace ucpkit
