// The one --json summary every tool prints: an envelope of the same first keys, then the tool's own.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace ucpkit::tool {

// Version of the envelope's layout (the keys below and their meaning); raised when a key of it
// changes meaning or goes away, never for a key a tool adds.
inline constexpr int kSchemaVersion = 1;

// {"tool", "version", "schema_version", "output", "seconds", then every key of `fields` in its own
// order}. `output` is what the tool wrote (a folder or file; null when it wrote nothing: --dry-run,
// --plan); `seconds` the wall time since the tool started (seconds_since_start()). A key of `fields`
// named like an envelope key is replaced by the envelope's value.
nlohmann::ordered_json envelope(const std::string& tool, const std::string& output, const nlohmann::json& fields);
nlohmann::ordered_json envelope(const std::string& tool, std::nullptr_t no_output, const nlohmann::json& fields);

// Prints a --json summary (an envelope) on stdout.
void print_json(const nlohmann::ordered_json& summary);

// Wall-clock seconds since this process loaded libucpkit (in practice: since the tool started).
double seconds_since_start();

}  // namespace ucpkit::tool
