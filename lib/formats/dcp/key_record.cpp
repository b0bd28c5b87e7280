// The keys a DCP was saved under (key_record.h).
#include "formats/dcp/key_record.h"

#include "core/error.h"
#include "formats/dcp/state_keys.h"

namespace ucpkit::formats::dcp {

using pickle::Kind;
using pickle::Value;

KeyPath model_key_path(const std::string& name) { return KeyPath::array({"model", name}); }

KeyPath state_key_path(const std::string& param, const std::string& state) {
  return KeyPath::array({"optim", "state", param, state});
}

KeyPath group_key_path(size_t group, const std::string& key) {
  return KeyPath::array({"optim", "param_groups", group, key});
}

std::string flat_key(const KeyPath& path) {
  std::string s;
  for (const auto& p : path) {
    if (!s.empty()) s += '.';
    s += p.is_string() ? p.get<std::string>() : p.dump();
  }
  return s;
}

namespace {

KeyPath strings(const std::vector<std::string>& parts) {
  KeyPath out = KeyPath::array();
  for (const auto& p : parts) out.push_back(p);
  return out;
}

}  // namespace

KeyPath recorded_path(const Metadata& md, const std::string& fqn) {
  KeyPath out = KeyPath::array();
  if (const auto k = md.planner ? md.planner->find(fqn) : std::nullopt) {
    for (size_t j = 0; j < md.planner->part_count(*k); ++j) {
      const PlannerPaths::Part p = md.planner->part(*k, j);
      if (p.is_index) out.push_back(p.index);
      else out.push_back(std::string(p.key));
    }
    if (!out.empty()) return out;
  }
  return strings(nested_path(md, fqn));
}

std::vector<pickle::ValuePtr> pickle_path(const KeyPath& path) {
  std::vector<pickle::ValuePtr> out;
  for (const auto& p : path) out.push_back(p.is_string() ? Value::str(p.get<std::string>()) : Value::integer(p.get<int64_t>()));
  return out;
}

KeyPath saved_path(const nlohmann::json& record, const KeyPath& default_path) {
  const auto it = record.find(flat_key(default_path));
  return it == record.end() ? default_path : *it;
}

void check_key_record(const nlohmann::json& record, const std::string& file) {
  if (!record.is_object()) fail(file, "malformed: source.dcp.keys must be an object, found " + escaped_brief(record.dump()));
  for (const auto& [key, path] : record.items()) {
    bool ok = path.is_array() && !path.empty();
    for (const auto& p : path) ok = ok && (p.is_string() || p.is_number_integer());
    if (!ok)
      fail(file, "malformed: source.dcp.keys[\"" + escaped_brief(key) + "\"] must be a list of strings and ints, found " +
                     escaped_brief(path.dump()));
  }
}

void record_key(nlohmann::json& record, const KeyPath& default_path, const KeyPath& saved) {
  if (saved != default_path) record[flat_key(default_path)] = saved;
}

}  // namespace ucpkit::formats::dcp
