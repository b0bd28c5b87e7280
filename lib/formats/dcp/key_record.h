// The keys a DCP was saved under, kept through the universal form. ucp-load --format dcp
// writes get_state_dict's layout by default ({"model": ..., "optim": ...}: `model.<fqn>`,
// `optim.state.<fqn>.<state>`, `optim.param_groups.<i>.<key>`; torch checkpoint/state_dict.py
// get_state_dict). A DCP saved otherwise (torchtitan's top-level model keys and `optimizer.*`, a buffer
// saved beside the model such as `train_state.step`) records, for each entry whose key or nested path
// differs from that default, the path it was saved under; the writer then uses it, so torch's dcp.load of
// the request that saved the checkpoint finds every key (its DefaultLoadPlanner looks entries up by the
// flat key, ".".join of the path: checkpoint/_nested_dict.py flatten_state_dict, _traverse.py).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/dcp/metadata.h"
#include "io/pickle/value.h"

namespace ucpkit::formats::dcp {

// A nested state-dict path: a JSON list of strings and ints (param_groups indices are ints).
using KeyPath = nlohmann::json;

// The default paths (get_state_dict's layout).
KeyPath model_key_path(const std::string& name);
KeyPath state_key_path(const std::string& param, const std::string& state);
KeyPath group_key_path(size_t group, const std::string& key);

// The flat key of a path: its parts joined by ".".
std::string flat_key(const KeyPath& path);

// The path `md`'s planner recorded for `fqn` (planner_data, ints kept), else state_keys' nested_path
// split (strings).
KeyPath recorded_path(const Metadata& md, const std::string& fqn);

// The path as pickle values (planner_data's tuple elements).
std::vector<pickle::ValuePtr> pickle_path(const KeyPath& path);

// The saved path of an entry whose default is `default_path`, from a record {default flat key: saved
// path} (ModelInfo::dcp_keys, checked by check_key_record); the default when the record has none.
KeyPath saved_path(const nlohmann::json& record, const KeyPath& default_path);

// Throws Error naming `file` (the manifest) unless `record` is an object of non-empty lists of strings
// and ints.
void check_key_record(const nlohmann::json& record, const std::string& file);

// Adds to `record` the saved path `saved` of an entry whose default is `default_path` when they differ.
void record_key(nlohmann::json& record, const KeyPath& default_path, const KeyPath& saved);

}  // namespace ucpkit::formats::dcp
