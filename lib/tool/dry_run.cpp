// --dry-run summaries.
#include "tool/dry_run.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

#include "core/error.h"
#include "tool/envelope.h"
#include "to_universal/extract.h"
#include "to_universal/plan.h"
#include "to_universal/union_executor.h"

namespace ucpkit::tool {

namespace fs = std::filesystem;

namespace {

struct PlanCounts {
  size_t params = 0, fragment_files = 0;
  uint64_t bytes = 0;
};

PlanCounts count(const to_universal::ExtractPlan& plan) {
  PlanCounts c;
  c.params = plan.params.size();
  for (const auto& p : plan.params) {
    for (const auto& tp : p.fragments) {
      std::set<int> parts;
      for (const auto& f : tp) parts.insert(f.part);
      c.fragment_files += parts.size();
    }
    c.bytes += p.bytes_in();
  }
  return c;
}

to_universal::ExtractPlan plan_of(const std::string& input, const to_universal::ConvertOptions& options) {
  to_universal::ExtractOptions eo;
  eo.patterns_file = options.patterns_file;
  eo.threads = options.threads;
  return to_universal::plan_checkpoint(input, eo);
}

std::string json_count(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_array() ? std::to_string(j[key].size()) : "?";
}

}  // namespace

std::string existing_note(const std::string& output, bool overwrite, bool reuse) {
  std::error_code ec;
  if (!fs::exists(output, ec)) return "";
  if (overwrite) return " (replacing the existing one)";
  if (reuse) return " (kept if it already holds this layout, refused otherwise)";
  throw Error(output + ": output already exists (remove it or pass --overwrite)");
}

void print_dry_run(const std::string& tool, const DryRun& dry_run, bool json) {
  if (json)
    print_json(envelope(tool, nullptr, dry_run.fields));
  else
    std::cout << dry_run.text;
}

std::string bytes_text(uint64_t bytes) {
  char s[64];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return s;
}

DryRun extract_dry_run(const std::string& input, const std::string& output, const to_universal::ConvertOptions& options) {
  const std::string note = existing_note(output, options.overwrite);
  const to_universal::ExtractPlan plan = plan_of(input, options);
  const PlanCounts c = count(plan);
  DryRun d;
  d.text = "ucp-extract --dry-run: would write " + output + note + ": plan.json and " +
           std::to_string(c.fragment_files) + " fragment files of " + std::to_string(c.params) + " parameters (" +
           bytes_text(c.bytes) + ") read from " + std::to_string(plan.files.size()) + " shard files; nothing written\n";
  d.fields = {{"dry_run", true},      {"would_write", output},          {"params", c.params},
              {"fragment_files", c.fragment_files}, {"shard_files", plan.files.size()}, {"bytes", c.bytes}};
  return d;
}

DryRun union_dry_run(const std::string& input, const std::string& output, const to_universal::ConvertOptions& options) {
  const std::string note = existing_note(output, options.overwrite);
  const to_universal::UnionCounts c = to_universal::count_union(input, options);  // the input format's own count
  DryRun d;
  d.text = "ucp-union --dry-run: would write " + output + note + ": " + c.files + " and " + std::to_string(c.atomic_files) +
           " atomic files" + c.atomic_note + " of " + std::to_string(c.params) + " parameters (" + bytes_text(c.bytes) +
           ") from " + c.from + " " + input + "; nothing written\n";
  d.fields = {{"dry_run", true},
              {"would_write", output},
              {"params", c.params},
              {"atomic_files", c.atomic_files},
              {"bytes", c.bytes},
              {"input_kind", c.input_kind}};
  return d;
}

DryRun load_dry_run(const nlohmann::json& plan, const std::string& output, const std::string& note) {
  DryRun d;
  d.fields = {{"dry_run", true}, {"would_write", output}};
  if (plan.contains("from_source")) d.fields["from_source"] = plan["from_source"];  // target values taken from the source
  if (plan.contains("shards")) {  // safetensors
    d.text = "ucp-load --dry-run: would write " + output + note + ": " + json_count(plan, "shards") +
             " safetensors shards, dtype " + plan.value("dtype", "?") + "; nothing written\n";
    d.fields["format"] = "safetensors";
    d.fields["shards"] = plan["shards"].size();
    return d;
  }
  const nlohmann::json t = plan.value("target", nlohmann::json::object());
  if (plan.value("format", "") == "torch_dist") {  // reshard/torch_dist_output's plan
    auto num = [&](const char* k) { return t.contains(k) ? t[k].dump() : std::string("?"); };
    d.text = "ucp-load --dry-run: would write " + output + note + ": a Megatron-Core torch_dist save (" +
             plan.value("iteration_folder", "?") + ") of " + (plan.contains("entries") ? plan["entries"].dump() : "?") +
             " entries in " + json_count(plan, "files") + " files, TP " + num("tp") + ", PP " + num("pp") + ", EP " +
             num("ep") + ", DP " + num("dp") + ", model tensors " + t.value("dtype", "?") + ", optimizer " +
             t.value("optimizer_format", "?") + "; nothing written\n";
    d.fields["format"] = "torch_dist";
    d.fields["target"] = t;
    d.fields["entries"] = plan.value("entries", 0);
    return d;
  }
  if (plan.value("format", "") == "dcp") {  // reshard/dcp_output's plan
    auto number = [&](const char* k) { return plan.contains(k) && plan[k].is_number() ? plan[k].dump() : "?"; };
    d.text = "ucp-load --dry-run: would write " + output + note + ": a DCP checkpoint of " + number("entries") +
             " entries (" + number("tensor_entries") + " tensors) in " + json_count(plan, "files") +
             " files, " + t.value("mesh", "?") + " over " + (t.contains("world") ? t["world"].dump() : "?") +
             " rank(s), model tensors " + t.value("dtype", "?") + ", optimizer states " + t.value("optimizer_dtype", "?") +
             "; nothing written\n";
    d.fields["format"] = "dcp";
    d.fields["target"] = t;
    d.fields["entries"] = plan.value("entries", 0);
    return d;
  }
  auto num = [&](const char* k) { return t.contains(k) ? t[k].dump() : std::string("?"); };
  d.text = "ucp-load --dry-run: would write " + output + note + ": deepspeed layout TP " + num("tp") + ", PP " + num("pp") +
           ", DP " + num("dp") + ", ZeRO stage " + num("zero_stage") + ", EP " + num("ep") + ", weights " +
           t.value("dtype", "?") + " (" + json_count(plan, "mp_ranks") +
           " model-parallel ranks); nothing written\n";
  d.fields["format"] = "deepspeed";
  d.fields["target"] = t;
  d.fields["mp_ranks"] = plan.contains("mp_ranks") ? plan["mp_ranks"].size() : 0;
  return d;
}

DryRun save_dry_run(const nlohmann::json& plan, const std::string& store, const std::string& fast_store) {
  DryRun d;
  const nlohmann::json sel = plan.value("selection", nlohmann::json::object());
  std::string tiers;
  nlohmann::json experts = nlohmann::json::object();
  for (const auto& [tier, layers] : sel.items()) {
    size_t n = 0;
    for (const auto& l : layers) n += l.size();
    experts[tier] = n;
    tiers += (tiers.empty() ? "" : ", ") + std::to_string(n) + " experts into the " + tier + " tier";
  }
  uint64_t bytes = 0;
  for (const auto& r : plan.value("ranks", nlohmann::json::array())) bytes += r.value("bytes", uint64_t{0});
  const std::string where = store + (fast_store.empty() ? "" : " and " + fast_store);
  d.text = "pec-save --dry-run: would save step " + plan.value("step", nlohmann::json()).dump() + " into " + where +
           ": the non-expert state and " + (tiers.empty() ? "no experts" : tiers) + " (" + bytes_text(bytes) +
           " before deduplication); nothing written\n";
  d.fields = {{"dry_run", true}, {"would_write", where}, {"step", plan.value("step", nlohmann::json())},
              {"experts", experts}, {"bytes", bytes}};
  return d;
}

DryRun restore_dry_run(const nlohmann::json& plan) {
  DryRun d;
  size_t files = plan.contains("non_expert") ? plan["non_expert"].value("files", nlohmann::json::array()).size() : 0;
  size_t experts = 0;
  for (const auto& x : plan.value("experts", nlohmann::json::array()))
    if (x.contains("files")) files += x["files"].size(), ++experts;
  const std::string dir = plan.value("step_dir", plan.value("output", std::string()));
  const uint64_t bytes = plan.value("bytes_read", uint64_t{0});
  d.text = "pec-restore --dry-run: would write " + dir + " (step " + plan.value("step", nlohmann::json()).dump() +
           "): " + std::to_string(files) + " files from " + plan.value("objects_read", nlohmann::json()).dump() +
           " stored objects (" + bytes_text(bytes) + "), " + std::to_string(experts) +
           " experts; nothing written\n";
  d.fields = {{"dry_run", true}, {"would_write", dir}, {"step", plan.value("step", nlohmann::json())},
              {"files", files}, {"objects_read", plan.value("objects_read", nlohmann::json())}, {"bytes_read", bytes}};
  return d;
}

DryRun replace_dry_run(const nlohmann::json& summary, const std::vector<std::string>& files) {
  DryRun d;
  std::string list;
  for (const auto& f : files) list += (list.empty() ? "" : ", ") + f;
  d.text = "moe-replace --dry-run: would write " + list + "; nothing written\n";
  d.fields = summary;
  d.fields["dry_run"] = true;
  d.fields["would_write"] = files;
  return d;
}

}  // namespace ucpkit::tool
