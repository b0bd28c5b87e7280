// Manifest JSON binder.
#include "pec/manifest.h"

#include <algorithm>
#include <map>

#include "core/confine.h"
#include "core/error.h"
#include "pec/checksum.h"

namespace ucpkit::pec {
namespace {
using nlohmann::json;

// An object id is the 32 lowercase hex digits of Digest::hex (object_store.h): anything else would
// name a file outside objects/ (ObjectStore::path_of).
bool is_object_id(const std::string& id) {
  return id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

json file_to_json(const FileEntry& f) {
  json chunks = json::array();
  for (const auto& c : f.chunks) chunks.push_back({{"object", c.object}, {"size", c.size}, {"stored", c.stored}});
  json j = {{"path", f.path}, {"size", f.size}, {"digest", f.digest}, {"chunks", chunks}};
  if (f.ranges) j["ranges"] = ranges_to_json(*f.ranges);
  if (f.cut) j["cut"] = cut_to_json(*f.cut);
  if (f.range_crcs) j["range_crcs"] = range_crcs_to_json(*f.range_crcs);
  return j;
}

FileEntry file_from_json(const json& j, const std::string& name) {
  FileEntry f;
  f.path = j.at("path").get<std::string>();
  // Restore writes the file at <step folder>/<path>: it must stay inside that folder.
  if (!is_confined_name(f.path))
    fail(name, "file path '" + escaped_brief(f.path) + "' is not a relative path inside the checkpoint folder");
  f.size = j.at("size").get<uint64_t>();
  f.digest = j.at("digest").get<std::string>();
  for (const auto& c : j.at("chunks")) {
    f.chunks.push_back({c.at("object").get<std::string>(), c.at("size").get<uint64_t>(), c.value("stored", uint64_t{0})});
    if (!is_object_id(f.chunks.back().object))
      fail(name, escaped_brief(f.path) + ": object id '" + escaped_brief(f.chunks.back().object) + "' is not 32 lowercase hex digits");
  }
  const std::string where = name + ": " + escaped_brief(f.path);
  if (j.contains("ranges")) f.ranges = ranges_from_json(j.at("ranges"), where);
  if (j.contains("cut")) f.cut = cut_from_json(j.at("cut"), where);
  if (j.contains("range_crcs")) f.range_crcs = range_crcs_from_json(j.at("range_crcs"), where);
  return f;
}

const ExpertEntry* Manifest::find_expert(int moe_layer, int expert) const {
  for (const auto& e : experts)
    if (e.moe_layer == moe_layer && e.expert == expert) return &e;
  return nullptr;
}

json manifest_to_json(const Manifest& m) {
  json ne = json::array(), ex = json::array();
  for (const auto& f : m.non_expert) ne.push_back(file_to_json(f));
  for (const auto& e : m.experts) {
    json files = json::array();
    for (const auto& f : e.files) files.push_back(file_to_json(f));
    ex.push_back({{"moe_layer", e.moe_layer}, {"expert", e.expert}, {"files", files}});
  }
  return {{"format", kManifestFormat},
          {"step", m.step},
          {"tier", to_string(m.tier)},
          {"layout", to_string(m.layout)},
          {"tag", m.tag},
          {"experts_per_layer", m.shape.experts_per_layer},
          {"ep_size", m.shape.ep_size},
          {"policy", m.policy},
          {"k", m.k},
          {"budget_bytes", m.budget_bytes},
          {"k_per_layer", m.k_per_layer},
          {"save_index", m.save_index},
          {"tokens_known", m.tokens_known},
          {"tokens_interval", m.tokens_interval},
          {"tokens_cumulative", m.tokens_cumulative},
          {"last_saved_step", m.last_saved_step},
          {"unsaved_tokens", m.unsaved_tokens},
          {"non_expert_pruned", m.non_expert_pruned},
          {"non_expert", ne},
          {"experts", ex},
          {"stats", m.stats},
          {"source", m.source}};
}

Manifest manifest_from_json(const json& j, const std::string& name) {
  try {
    if (j.value("format", "") != kManifestFormat) fail(name, "not a PEC manifest (format " + j.value("format", "?") + ")");
    Manifest m;
    m.step = j.at("step").get<int64_t>();
    m.tier = parse_tier(j.at("tier").get<std::string>(), name);
    m.layout = parse_source_layout(j.at("layout").get<std::string>(), name);
    m.tag = j.at("tag").get<std::string>();
    m.shape.experts_per_layer = j.at("experts_per_layer").get<std::vector<int>>();
    m.shape.ep_size = j.at("ep_size").get<int>();
    m.policy = j.at("policy").get<std::string>();
    m.k = j.at("k").get<int>();
    m.budget_bytes = j.value("budget_bytes", uint64_t{0});
    m.k_per_layer = j.value("k_per_layer", std::vector<int>{});
    m.save_index = j.at("save_index").get<int64_t>();
    m.tokens_known = j.at("tokens_known").get<bool>();
    m.tokens_interval = j.at("tokens_interval").get<TokenMatrix>();
    m.tokens_cumulative = j.at("tokens_cumulative").get<TokenMatrix>();
    m.last_saved_step = j.at("last_saved_step").get<std::vector<std::vector<int64_t>>>();
    m.unsaved_tokens = j.at("unsaved_tokens").get<TokenMatrix>();
    m.non_expert_pruned = j.at("non_expert_pruned").get<bool>();
    for (const auto& f : j.at("non_expert")) m.non_expert.push_back(file_from_json(f, name));
    for (const auto& e : j.at("experts")) {
      ExpertEntry x;
      x.moe_layer = e.at("moe_layer").get<int>();
      x.expert = e.at("expert").get<int>();
      for (const auto& f : e.at("files")) x.files.push_back(file_from_json(f, name));
      m.experts.push_back(std::move(x));
    }
    m.stats = j.value("stats", json::object());
    m.source = j.value("source", json::object());
    return m;
  } catch (const json::exception& e) {
    fail(name, std::string("malformed manifest: ") + e.what());
  }
}

std::string manifest_text(const Manifest& m) {
  json j = manifest_to_json(m);
  std::string body = j.dump();
  json out = {{"checksum", digest(body).hex()}, {"manifest", j}};
  return out.dump(1) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& name) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(name, std::string("damaged manifest (not JSON): ") + e.what());
  }
  if (!j.is_object() || !j.contains("checksum") || !j.contains("manifest")) fail(name, "damaged manifest (no checksum)");
  if (digest(j.at("manifest").dump()).hex() != j.at("checksum").get<std::string>())
    fail(name, "damaged manifest (checksum mismatch)");
  return manifest_from_json(j.at("manifest"), name);
}

void attribute_stored_once(Manifest& m) {
  std::vector<std::vector<ChunkRef>*> lists;
  for (auto& f : m.non_expert) lists.push_back(&f.chunks);
  for (auto& e : m.experts)
    for (auto& f : e.files) lists.push_back(&f.chunks);
  std::map<std::string, uint64_t> written;  // objects this save wrote: their bytes on disk
  for (auto* l : lists)
    for (const auto& c : *l)
      if (c.stored > 0) written[c.object] = std::max(written[c.object], c.stored);
  for (auto* l : lists)
    for (auto& c : *l) {
      auto it = written.find(c.object);
      if (it == written.end()) {
        c.stored = 0;
        continue;
      }
      c.stored = it->second;
      it->second = 0;  // counted once
    }
}

}  // namespace ucpkit::pec
