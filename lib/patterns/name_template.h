// Parameter-name templates of the name map files (patterns/megatron-core/*.json, patterns/hf/*.json):
// literal text with placeholders such as {L} (a layer) and {E} (an expert), each standing for a run of
// decimal digits. Pure.
#pragma once
#include <map>
#include <string>

namespace ucpkit::patterns {

// Whether `name` matches `pattern` in full; fills `values` (placeholder "{L}" -> number). A placeholder
// seen twice must match the same number; a run of more than 9 digits matches nothing.
bool match_name_template(const std::string& pattern, const std::string& name, std::map<std::string, long>& values);

// `s` with every `key` ("{L}") replaced by `v`.
std::string substitute_placeholder(std::string s, const std::string& key, long v);

}  // namespace ucpkit::patterns
