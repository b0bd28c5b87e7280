// The universal checkpoint's manifest.json: struct <-> JSON, errors naming the file and the key.
#include "formats/universal/manifest.h"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_input.h"

namespace ucpkit::formats::universal {
namespace {

using json = nlohmann::json;

constexpr long long kMaxInt = std::numeric_limits<int>::max();
constexpr long long kMaxInt64 = std::numeric_limits<long long>::max();

[[noreturn]] void malformed(const std::string& file, const std::string& where, const std::string& expected,
                            const json& found) {
  fail(file, "malformed: " + where + " must be " + expected + ", found " + json_brief(found));
}

std::string where_of(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

// `obj[key]`, or an Error naming the missing key (`where`: obj's own place, "" at the top).
const json& need(const json& obj, const char* key, const std::string& file, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(file, "malformed: " + where_of(where, key) + " is missing");
  return *it;
}

const json& object_at(const json& v, const std::string& file, const std::string& where) {
  if (!v.is_object()) malformed(file, where, "an object", v);
  return v;
}

std::string string_of(const json& v, const std::string& file, const std::string& where) {
  if (!v.is_string()) malformed(file, where, "a string", v);
  return v.get<std::string>();
}

bool bool_of(const json& v, const std::string& file, const std::string& where) {
  if (!v.is_boolean()) malformed(file, where, "true or false", v);
  return v.get<bool>();
}

int64_t int_of(const json& v, const std::string& file, const std::string& where, long long lo = 0,
               long long hi = kMaxInt64) {
  return json_integer(v, file, "malformed: " + where, lo, hi);
}

std::vector<int64_t> dims_of(const json& v, const std::string& file, const std::string& where) {
  if (!v.is_array()) malformed(file, where, "a list of sizes", v);
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(int_of(v[i], file, where + "[" + std::to_string(i) + "]"));
  return out;
}

std::vector<std::string> strings_of(const json& v, const std::string& file, const std::string& where) {
  if (!v.is_array()) malformed(file, where, "a list of strings", v);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(string_of(v[i], file, where + "[" + std::to_string(i) + "]"));
  return out;
}

// A crc32 as ucp-union writes it: hex digits (eight, zero-padded).
uint32_t crc32_of(const json& v, const std::string& file, const std::string& where) {
  const std::string s = v.is_string() ? v.get<std::string>() : std::string();
  bool ok = !s.empty() && s.size() <= 8;
  for (char c : s) ok = ok && std::isxdigit(static_cast<unsigned char>(c));
  if (!ok) malformed(file, where, "1 to 8 hex digits", v);
  return static_cast<uint32_t>(std::stoul(s, nullptr, 16));
}


UniversalState state_from_json(const json& j, const std::string& file, const std::string& where) {
  object_at(j, file, where);
  UniversalState s;
  s.file = string_of(need(j, "file", file, where), file, where + ".file");
  if (auto it = j.find("crc32"); it != j.end()) s.crc32 = crc32_of(*it, file, where + ".crc32");
  if (auto it = j.find("source_dtype"); it != j.end()) s.source_dtype = string_of(*it, file, where + ".source_dtype");
  return s;
}

json state_to_json(const UniversalState& s) {
  json j = {{"file", s.file}};
  if (s.crc32) j["crc32"] = crc32_text(*s.crc32);
  if (s.source_dtype) j["source_dtype"] = *s.source_dtype;
  return j;
}

}  // namespace

json UniversalParam::to_json() const {
  json states_json = json::object();
  for (const auto& [state, s] : states) states_json[state] = state_to_json(s);
  json j = {{"name", name}, {"shape", shape}, {"states", states_json}, {"step", step}};
  if (dtype) j["dtype"] = *dtype;
  if (join) j["join"] = *join;
  if (tp_shapes) j["tp_shapes"] = *tp_shapes;
  if (pp_stage) j["pp_stage"] = *pp_stage;
  if (patterns) j["patterns"] = *patterns;
  if (cat_dim) j["cat_dim"] = *cat_dim;
  if (vocab_tensor) j["vocab_tensor"] = true;
  if (flat) j["flat"] = true;
  if (expert) j["expert"] = {{"layer", expert->layer}, {"global_id", expert->global_id}};
  if (autoep) j["autoep"] = {{"moe_layer_id", autoep->moe_layer_id}, {"num_experts", autoep->num_experts}};
  return j;
}

UniversalParam UniversalParam::from_json(const json& j, const std::string& file, const std::string& where) {
  object_at(j, file, where);
  UniversalParam p;
  p.name = string_of(need(j, "name", file, where), file, where + ".name");
  p.shape = dims_of(need(j, "shape", file, where), file, where + ".shape");
  const json& states = object_at(need(j, "states", file, where), file, where + ".states");
  for (const auto& [state, s] : states.items()) p.states[state] = state_from_json(s, file, where + ".states." + state);
  if (auto it = j.find("step"); it != j.end()) p.step = bool_of(*it, file, where + ".step");
  if (auto it = j.find("dtype"); it != j.end()) p.dtype = string_of(*it, file, where + ".dtype");
  if (auto it = j.find("join"); it != j.end()) p.join = string_of(*it, file, where + ".join");
  if (auto it = j.find("tp_shapes"); it != j.end()) {
    if (!it->is_array()) malformed(file, where + ".tp_shapes", "a list of shapes", *it);
    p.tp_shapes.emplace();
    for (size_t t = 0; t < it->size(); ++t)
      p.tp_shapes->push_back(dims_of((*it)[t], file, where + ".tp_shapes[" + std::to_string(t) + "]"));
  }
  if (auto it = j.find("pp_stage"); it != j.end()) p.pp_stage = int_of(*it, file, where + ".pp_stage");
  if (auto it = j.find("patterns"); it != j.end()) p.patterns = strings_of(*it, file, where + ".patterns");
  if (auto it = j.find("cat_dim"); it != j.end()) p.cat_dim = int_of(*it, file, where + ".cat_dim", -kMaxInt, kMaxInt);
  if (auto it = j.find("vocab_tensor"); it != j.end()) p.vocab_tensor = bool_of(*it, file, where + ".vocab_tensor");
  if (auto it = j.find("flat"); it != j.end()) p.flat = bool_of(*it, file, where + ".flat");
  if (auto it = j.find("expert"); it != j.end()) {
    const std::string w = where + ".expert";
    object_at(*it, file, w);
    p.expert = UniversalExpert{static_cast<int>(int_of(need(*it, "layer", file, w), file, w + ".layer", -1, kMaxInt)),
                               static_cast<int>(int_of(need(*it, "global_id", file, w), file, w + ".global_id", -1, kMaxInt))};
  }
  if (auto it = j.find("autoep"); it != j.end()) {
    const std::string w = where + ".autoep";
    object_at(*it, file, w);
    p.autoep = UniversalAutoEp{
        static_cast<int>(int_of(need(*it, "moe_layer_id", file, w), file, w + ".moe_layer_id", -1, kMaxInt)),
        static_cast<int>(int_of(need(*it, "num_experts", file, w), file, w + ".num_experts", 0, kMaxInt))};
  }
  return p;
}

json UniversalBuffer::to_json() const {
  return {{"name", name}, {"shape", shape}, {"dtype", dtype}, {"tensor", state_to_json(tensor)}};
}

UniversalBuffer UniversalBuffer::from_json(const json& j, const std::string& file, const std::string& where) {
  object_at(j, file, where);
  UniversalBuffer b;
  b.name = string_of(need(j, "name", file, where), file, where + ".name");
  b.shape = dims_of(need(j, "shape", file, where), file, where + ".shape");
  b.dtype = string_of(need(j, "dtype", file, where), file, where + ".dtype");
  b.tensor = state_from_json(need(j, "tensor", file, where), file, where + ".tensor");
  return b;
}

json UniversalItem::to_json() const { return {{"key", key}, {"path", path}, {"file", state_to_json(file)}}; }

UniversalItem UniversalItem::from_json(const json& j, const std::string& file, const std::string& where) {
  object_at(j, file, where);
  UniversalItem item;
  item.key = string_of(need(j, "key", file, where), file, where + ".key");
  item.path = need(j, "path", file, where);
  bool ok = item.path.is_array() && !item.path.empty();
  for (const auto& p : item.path) ok = ok && (p.is_string() || p.is_number_integer());
  if (!ok) malformed(file, where + ".path", "a list of strings and ints", item.path);
  item.file = state_from_json(need(j, "file", file, where), file, where + ".file");
  return item;
}

// The source description's keys, each with its field (the one place that spells them).
constexpr const char* kNamesKey = "names";
constexpr const char* kNamesRecordKey = "megatron_core_names";

json UniversalSource::to_json() const {
  json j = facts;
  auto put = [&](const char* key, const auto& v) {
    if (v) j[key] = *v;
  };
  put("format", format);
  put("dir", dir);
  put("tag", tag);
  put("tp", tp);
  put("pp", pp);
  put("dp", dp);
  put("ep", ep);
  put("zero_stage", zero_stage);
  put("pipeline", pipeline);
  put("layer_model_axis", layer_model_axis);
  put("bf16", bf16);
  put("data_before_expert", data_before_expert);
  put("ds_line", ds_line);
  put("num_experts", num_experts);
  put("expert_files", expert_files);
  put("sub_groups", sub_groups);
  put("weights_only", weights_only);
  if (!autoep.is_null()) j["autoep"] = autoep;
  if (!pipeline_numbering.is_null()) j["pipeline_numbering"] = pipeline_numbering;
  if (layer_keys) {
    json k = json::object();
    for (const auto& [idx, keys] : *layer_keys) k[std::to_string(idx)] = keys;
    j["layer_keys"] = std::move(k);
  }
  put(kNamesKey, names);
  if (!names_record.is_null()) j[kNamesRecordKey] = names_record;
  return j;
}

UniversalSource UniversalSource::from_json(const json& source, const std::string& file) {
  object_at(source, file, "source");
  UniversalSource s;
  for (const auto& [key, v] : source.items()) {
    const std::string w = where_of("source", key);
    auto degree = [&](std::optional<int>& out) { out = static_cast<int>(int_of(v, file, w, 1, kMaxInt)); };
    if (key == "format") s.format = string_of(v, file, w);
    else if (key == "dir") s.dir = string_of(v, file, w);
    else if (key == "tag") s.tag = string_of(v, file, w);
    else if (key == "tp") degree(s.tp);
    else if (key == "pp") degree(s.pp);
    else if (key == "dp") degree(s.dp);
    else if (key == "ep") degree(s.ep);
    // BF16_Optimizer sources of older releases record no stage (null, kept as read).
    else if (key == "zero_stage" && v.is_number_integer()) s.zero_stage = static_cast<int>(int_of(v, file, w, 0, 3));
    else if (key == "pipeline") s.pipeline = bool_of(v, file, w);
    else if (key == "layer_model_axis") s.layer_model_axis = bool_of(v, file, w);
    else if (key == "bf16") s.bf16 = bool_of(v, file, w);
    else if (key == "data_before_expert") s.data_before_expert = bool_of(v, file, w);
    else if (key == "ds_line") s.ds_line = string_of(v, file, w);
    else if (key == "expert_files") s.expert_files = int_of(v, file, w, 0, kMaxInt64);
    else if (key == "sub_groups") s.sub_groups = int_of(v, file, w, 0, kMaxInt64);
    else if (key == "weights_only") s.weights_only = bool_of(v, file, w);
    else if (key == "autoep") s.autoep = v;
    else if (key == "pipeline_numbering") s.pipeline_numbering = v;
    else if (key == kNamesKey) s.names = string_of(v, file, w);
    else if (key == kNamesRecordKey) s.names_record = v;
    else if (key == "num_experts") {
      if (!v.is_array()) malformed(file, w, "a list of expert counts", v);
      s.num_experts.emplace();
      for (size_t i = 0; i < v.size(); ++i)
        s.num_experts->push_back(static_cast<int>(int_of(v[i], file, w + "[" + std::to_string(i) + "]", 0, kMaxInt)));
    } else if (key == "layer_keys" && v.is_object()) {
      s.layer_keys.emplace();
      for (const auto& [idx, keys] : v.items()) {
        const bool digits = !idx.empty() && idx.size() < 10 && idx.find_first_not_of("0123456789") == std::string::npos;
        if (!digits) fail(file, "malformed: source.layer_keys has the key \"" + escaped_brief(idx, 40) + "\", not a layer index");
        (*s.layer_keys)[std::stoi(idx)] = strings_of(keys, file, w + "." + idx);
      }
    } else {
      s.facts[key] = v;
    }
  }
  return s;
}

json UniversalManifest::to_json() const {
  json params_json = json::array();
  for (const auto& p : params) params_json.push_back(p.to_json());
  json m;
  m["format"] = format;
  m["version"] = version;
  m["source"] = source.to_json();
  m["patterns"] = {{"origin", patterns_origin}, {"set", patterns_set}};
  m["model_files"] = model_files;
  m["optimizer_state"] = optimizer_state;
  m["checksum"] = checksum;
  m["params"] = std::move(params_json);
  if (!buffers.empty()) {
    json b = json::array();
    for (const auto& e : buffers) b.push_back(e.to_json());
    m["buffers"] = std::move(b);
  }
  if (!items.empty()) {
    json b = json::array();
    for (const auto& e : items) b.push_back(e.to_json());
    m["items"] = std::move(b);
  }
  return m;
}

std::string UniversalManifest::text() const { return to_json().dump(1); }

UniversalManifest UniversalManifest::from_json(const json& j, const std::string& file) {
  if (!j.is_object() || !j.contains("format") || j["format"] != kUniversalFormat)
    fail(file, "not a ucpkit universal manifest");
  UniversalManifest m;
  m.format = kUniversalFormat;
  if (auto it = j.find("version"); it != j.end()) m.version = int_of(*it, file, "version", 1);
  m.source = UniversalSource::from_json(need(j, "source", file, ""), file);
  const json& patterns = object_at(need(j, "patterns", file, ""), file, "patterns");
  if (auto it = patterns.find("origin"); it != patterns.end()) m.patterns_origin = string_of(*it, file, "patterns.origin");
  m.patterns_set = need(patterns, "set", file, "patterns");
  m.model_files = strings_of(need(j, "model_files", file, ""), file, "model_files");
  if (auto it = j.find("optimizer_state"); it != j.end()) m.optimizer_state = string_of(*it, file, "optimizer_state");
  if (auto it = j.find("checksum"); it != j.end()) m.checksum = string_of(*it, file, "checksum");
  const json& params = need(j, "params", file, "");
  if (!params.is_array()) malformed(file, "params", "a list", params);
  for (size_t i = 0; i < params.size(); ++i)
    m.params.push_back(UniversalParam::from_json(params[i], file, "params[" + std::to_string(i) + "]"));
  if (auto it = j.find("buffers"); it != j.end()) {
    if (!it->is_array()) malformed(file, "buffers", "a list", *it);
    for (size_t i = 0; i < it->size(); ++i)
      m.buffers.push_back(UniversalBuffer::from_json((*it)[i], file, "buffers[" + std::to_string(i) + "]"));
  }
  if (auto it = j.find("items"); it != j.end()) {
    if (!it->is_array()) malformed(file, "items", "a list", *it);
    for (size_t i = 0; i < it->size(); ++i)
      m.items.push_back(UniversalItem::from_json((*it)[i], file, "items[" + std::to_string(i) + "]"));
  }
  return m;
}

UniversalManifest read_universal_manifest(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "cannot read (incomplete universal checkpoint?)");
  return UniversalManifest::from_json(parse_json_input(read_text_file(path, "manifest"), path, "corrupt JSON"), path);
}

std::string describe_buffers(const std::vector<UniversalBuffer>& buffers, size_t most) {
  std::string s = std::to_string(buffers.size()) + (buffers.size() == 1 ? " buffer (" : " buffers (");
  for (size_t k = 0; k < buffers.size() && k < most; ++k) s += (k ? ", '" : "'") + escaped_brief(buffers[k].name) + "'";
  return s + (buffers.size() > most ? ", ...)" : ")");
}

std::string crc32_text(uint32_t crc) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", static_cast<unsigned>(crc));
  return b;
}

}  // namespace ucpkit::formats::universal
