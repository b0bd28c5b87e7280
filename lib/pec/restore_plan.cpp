// pec-restore's plan: target, sources, files, report inputs (no I/O).
#include "pec/restore_plan.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "formats/deepspeed/checkpoint_dir.h"

namespace ucpkit::pec {
namespace {
using nlohmann::json;

// Newest step first; among equal steps the copy read from the fast tier first (it is the newer
// snapshot's node-local copy), otherwise in the order the stores listed them.
void sort_copies(RestoreCatalog& c) {
  std::stable_sort(c.copies.begin(), c.copies.end(), [&](const ManifestCopy& a, const ManifestCopy& b) {
    if (a.manifest.step != b.manifest.step) return a.manifest.step > b.manifest.step;
    return c.stores[a.store].tier == Tier::fast && c.stores[b.store].tier != Tier::fast;
  });
}

// --step, or every step with non-expert state, newest first; each with the copies holding that state.
std::vector<TargetCandidate> target_candidates(const RestoreCatalog& c, int64_t step) {
  std::vector<TargetCandidate> targets;
  if (step >= 0) targets.push_back({step, {}});
  for (size_t i = 0; i < c.copies.size(); ++i) {
    const Manifest& m = c.copies[i].manifest;
    if (m.non_expert_pruned || (step >= 0 && m.step != step)) continue;
    if (targets.empty() || targets.back().step != m.step) targets.push_back({m.step, {}});
    targets.back().copies.push_back(i);
  }
  return targets;
}

json file_json(const FileEntry& f, uint64_t size) {
  json objects = json::array();
  for (const auto& c : f.chunks) objects.push_back(c.object);
  json j = {{"path", f.path}, {"size", size}, {"objects", objects}};
  if (f.ranges) j["fragments"] = f.ranges->size();  // patched into a shared file
  if (f.cut) j["expert_ranges"] = f.cut->cut.size();  // left for the experts
  return j;
}

uint64_t written_size(const FileEntry& f) { return f.cut ? f.cut->file_size : f.size; }

json source_json(const RestorePlan& p, size_t copy) {
  const ManifestCopy& c = p.catalog.copies[copy];
  return {{"tier", to_string(c.manifest.tier)}, {"step", c.manifest.step}, {"store", p.catalog.stores[c.store].dir}};
}
}  // namespace

void check_ds_version_applies(const std::string& ds_version, const Manifest& m) {
  if (!ds_version.empty() && m.layout == SourceLayout::Universal)
    throw UsageError("--ds-version applies to native DeepSpeed MoE checkpoints, not universal ones");
  if (!ds_version.empty() && m.layout == SourceLayout::DeepSpeedAutoEpZero3)
    throw UsageError("--ds-version applies to native DeepSpeed MoE checkpoints, not AutoEP ZeRO-3 ones");
}

RestorePlan plan_restore(RestoreCatalog catalog, RestoreRequest request) {
  const std::string store = catalog.stores.empty() ? std::string() : catalog.stores.front().dir;
  if (catalog.copies.empty()) fail(store, "no committed step in the store");
  sort_copies(catalog);
  RestorePlan p;
  p.catalog = std::move(catalog);
  p.request = std::move(request);
  p.targets = target_candidates(p.catalog, p.request.step);
  if (p.targets.empty()) fail(store, "no committed step with its non-expert state");
  if (p.targets.front().copies.empty())
    fail(store, "step " + std::to_string(p.request.step) + " is not committed (or its non-expert state was garbage-collected)");
  aim_at(p, p.targets.front().copies.front());
  check_ds_version_applies(p.request.ds_version, p.base_manifest());
  for (const auto& x : p.experts)
    if (x.copies.empty())
      fail(store, "expert " + std::to_string(x.expert) + " of MoE layer " + std::to_string(x.moe_layer) +
                      " has no intact copy at or before step " + std::to_string(p.step));
  return p;
}

void aim_at(RestorePlan& p, size_t base_copy) {
  p.base = base_copy;
  const Manifest& base = p.base_manifest();
  p.step = base.step;
  const auto& copies = p.catalog.copies;
  p.experts.clear();
  const MoeShape& shape = base.shape;
  for (int l = 0; l < shape.num_layers(); ++l)
    for (int e = 0; e < shape.experts_per_layer[static_cast<size_t>(l)]; ++e) {
      p.experts.push_back({l, e, {}});
      for (size_t i = 0; i < copies.size(); ++i)
        if (copies[i].manifest.step <= p.step && copies[i].manifest.find_expert(l, e)) p.experts.back().copies.push_back(i);
    }
  p.file_sizes.clear();
  for (const auto& f : base.non_expert) p.file_sizes.emplace_back(f.path, written_size(f));
  for (const auto& c : copies)
    if (c.manifest.step <= p.step)
      for (const auto& x : c.manifest.experts)
        for (const auto& f : x.files)
          if (!f.ranges) p.file_sizes.emplace_back(f.path, f.size);
  std::set<int64_t> timeline;
  for (const auto& c : copies)
    if (c.manifest.step <= p.step) timeline.insert(c.manifest.step);
  p.timeline.assign(timeline.begin(), timeline.end());
  p.k_source = base_copy;
  for (size_t i = 0; i < copies.size(); ++i)
    if (copies[i].manifest.step == p.step && copies[i].manifest.tier == Tier::durable) p.k_source = i;
}

std::string restore_step_dir(const RestorePlan& p) {
  return (std::filesystem::path(p.request.output) / formats::deepspeed::step_tag(p.step)).string();
}

json restore_plan_to_json(const RestorePlan& p) {
  const Manifest& base = p.base_manifest();
  json stores = json::array();
  for (size_t s = 0; s < p.catalog.stores.size(); ++s) {
    std::set<int64_t> steps;
    for (const auto& c : p.catalog.copies)
      if (c.store == s) steps.insert(c.manifest.step);
    stores.push_back({{"tier", to_string(p.catalog.stores[s].tier)}, {"dir", p.catalog.stores[s].dir}, {"steps", steps}});
  }
  json targets = json::array();
  for (const auto& t : p.targets) {
    json from = json::array();
    for (size_t c : t.copies) from.push_back(source_json(p, c));
    targets.push_back({{"step", t.step}, {"copies", from}});
  }
  size_t objects = 0;
  uint64_t bytes = 0;
  auto count = [&](const FileEntry& f) {
    objects += f.chunks.size();
    for (const auto& c : f.chunks) bytes += c.size;
  };
  json non_expert = source_json(p, p.base);
  non_expert["files"] = json::array();
  for (const auto& f : base.non_expert) {
    non_expert["files"].push_back(file_json(f, written_size(f)));
    count(f);
  }
  json experts = json::array();
  for (const auto& x : p.experts) {
    json j = {{"moe_layer", x.moe_layer}, {"expert", x.expert}};
    if (x.copies.empty()) {
      experts.push_back(j);
      continue;
    }
    j.update(source_json(p, x.copies.front()));
    j["files"] = json::array();
    for (const auto& f : p.manifest(x.copies.front()).find_expert(x.moe_layer, x.expert)->files) {
      j["files"].push_back(file_json(f, f.size));
      count(f);
    }
    j["fallbacks"] = json::array();
    for (size_t k = 1; k < x.copies.size(); ++k) j["fallbacks"].push_back(source_json(p, x.copies[k]));
    experts.push_back(j);
  }
  const Manifest& kref = p.manifest(p.k_source);
  json pointers = {formats::deepspeed::kLatestName};
  if (base.layout == SourceLayout::Universal) pointers.push_back(formats::deepspeed::kLatestUniversalName);
  const char* tokens = base.tokens_known ? "store" : p.request.tokens.empty() ? "none" : "file";
  json j = {{"step", p.step},
            {"layout", to_string(base.layout)},
            {"output", p.request.output},
            {"step_dir", restore_step_dir(p)},
            {"pointers", pointers},
            {"stores", stores},
            {"targets", targets},
            {"non_expert", non_expert},
            {"experts", experts},
            {"objects_read", objects},
            {"bytes_read", bytes},
            {"tokens", {{"from", tokens}, {"file", p.request.tokens}}},
            {"timeline", p.timeline},
            {"report_k", {{"tier", to_string(kref.tier)}, {"step", kref.step}, {"policy", kref.policy}}}};
  if (!p.request.ds_version.empty()) j["ds_version"] = p.request.ds_version;
  return j;
}

}  // namespace ucpkit::pec
