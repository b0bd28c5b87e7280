// A streaming reader of plan files for re-placement: reads the file through a memory map and keeps
// only what read_plan needs, the small top-level keys as JSON and every layer's phy2log as ints,
// never the document (222 MB of text, most of it log2phy padding, was a 733 MB JSON tree). It
// validates the JSON syntax of everything it skips.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ucpkit::placement {

struct ScannedPlan {
  nlohmann::json head = nlohmann::json::object();  // the top-level keys asked for that the file has
  bool has_layers = false;
  std::vector<std::vector<int>> phy2log;  // per layer
};

// Reads `path` when it is a plan in the plain form this tool writes: a JSON object whose "layers" is a
// list of objects each with one "phy2log" list of non-negative integers that fit an int, strings of
// printable ASCII without escapes, no duplicate key among those read, nesting under kMaxJsonDepth.
// Returns nullopt for anything else (a file that cannot be read, malformed JSON, another form of a
// valid plan): the caller then parses the whole file, which names what is wrong exactly as before.
std::optional<ScannedPlan> scan_plan_file(const std::string& path, const std::vector<std::string>& head_keys);

}  // namespace ucpkit::placement
