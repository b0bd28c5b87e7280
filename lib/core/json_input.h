// Parsing JSON a user hands in: nesting depth bounded (a 100,000-deep list would overflow the stack
// when printed or walked) and error messages that stay one short line (never the input echoed back).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ucpkit {

// Deepest nesting accepted (load matrices are 3 deep, plans and manifests a few more).
constexpr int kMaxJsonDepth = 64;

// Parses `text`; on failure throws Error "<name>: <what>: <reason>" (reason short, bytes escaped).
nlohmann::json parse_json_input(std::string_view text, const std::string& name, const std::string& what = "not valid JSON");
// Same, returning false instead of throwing on bad JSON (the caller tries another format); depth
// beyond the limit still throws.
bool try_parse_json_input(std::string_view text, const std::string& name, nlohmann::json& out);
// A value for an error message: numbers and short strings as written, long ones cut, control and
// non-ASCII bytes escaped; lists and objects only named with their size.
std::string json_brief(const nlohmann::json& v);

// JSON text of `j` whatever bytes its strings hold: a path that is not UTF-8 (a folder named
// in Latin-1) made nlohmann's dump throw "[json.exception.type_error.316] invalid UTF-8 byte", after a
// tool had committed its output; such bytes become U+FFFD here. json_safe: the same, as a value.
std::string json_text(const nlohmann::json& j, int indent = -1);
nlohmann::json json_safe(const nlohmann::json& j);
// A whole number in [lo, hi] found at `where` (a key or path such as "nodes" or layers[2].phy2log[5],
// written as it should appear) of the file `name`: JSON integers, and floats with an integral value
// (2.0); anything else throws Error "<name>: <where> must be an integer in [lo, hi], found
// <json_brief>" (one line, the key named).
long long json_integer(const nlohmann::json& v, const std::string& name, const std::string& where, long long lo,
                       long long hi);

}  // namespace ucpkit
