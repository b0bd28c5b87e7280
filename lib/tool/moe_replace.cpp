// moe-replace's run: plan, then every output written all or nothing.
#include "tool/moe_replace.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "tool/dry_run.h"
#include "tool/tool.h"

namespace ucpkit::tool {
namespace {

// A written file never replaces the loads (or the other written file).
void refuse_same(const std::string& a, const char* a_opt, const std::string& b, const char* b_opt) {
  if (path_within(a, b) && path_within(b, a))
    throw UsageError(std::string(a_opt) + " " + a + " is " + b_opt + " " + b + ": writing it would replace the " +
                     (std::string(b_opt) == "--loads" ? "input" : "plan"));
}

// Every output's folder is checked and every output staged in its temporary file before the first is
// renamed into place: a failure before that leaves none of them.
void write_all(const std::vector<std::pair<std::string, std::string_view>>& files) {
  for (const auto& [path, bytes] : files) {
    if (path.empty()) continue;
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) dir = ".";
    if (::access(dir.c_str(), W_OK) != 0) throw Error(path + ": folder " + dir.string() + " is not writable");
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a folder, not a file");
  }
  std::vector<std::unique_ptr<AtomicFile>> staged;
  for (const auto& [path, bytes] : files) {
    if (path.empty()) continue;
    staged.push_back(std::make_unique<AtomicFile>(path, /*durable=*/true));
    staged.back()->write(bytes.data(), bytes.size());
    staged.back()->flush();
  }
  for (auto& f : staged) f->commit();
}

}  // namespace

void MoeReplaceOptions::check() {
  refuse_same(output, "--output", req.loads_path, "--loads");
  if (!svg.empty()) {
    refuse_same(svg, "--svg", req.loads_path, "--loads");
    refuse_same(svg, "--svg", output, "--output");
  }
  if (req.placement.recovery.max_failures < 0) throw UsageError("--max-failures must not be negative");
  if (!failed.empty()) req.change.failed = placement::parse_id_list(failed, "--failed-nodes");
  req.change.added = added;
  req.placement.recovery.exact_limit = exact_limit;
  if (expert_bytes_given) req.expert_bytes = static_cast<double>(expert_bytes);
  if (max_moved_given) req.max_moved_bytes = static_cast<double>(max_moved_bytes);
  req.node_loss_migration = current_given && (weight_given || max_moved_given);
  req.want_svg = !svg.empty();
  req.want_sglang = !sglang_out.empty();
  req.want_vllm = !vllm_out.empty();
  if (!layers_map.empty()) req.layers_map = placement::parse_layers_map(layers_map);
}

Result run_moe_replace(const MoeReplaceOptions& o) {
  placement::PlanOutcome out = placement::make_plan(o.req);
  if (!out.said.empty()) info(out.said);
  for (const auto& note : out.notes) warn(note);
  if (out.migration && !out.migration->lost.empty())
    warn(std::to_string(out.migration->lost.size()) + " experts have no surviving replica");
  const std::vector<std::pair<std::string, std::string_view>> files = {
      {o.output, out.plan_text}, {o.svg, out.svg}, {o.sglang_out, out.sglang_text}, {o.vllm_out, out.vllm_bytes}};
  if (o.dry_run) {
    std::vector<std::string> names;
    for (const auto& f : files)
      if (!f.first.empty()) names.push_back(f.first);
    Result r = dry_run_result(replace_dry_run(out.summary, names));
    r.text = out.table + r.text;
    return r;
  }
  write_all(files);
  Result r;
  r.output = o.output;
  r.fields = out.summary;
  r.fields["output"] = o.output;
  if (!o.svg.empty()) r.fields["svg"] = o.svg;
  if (!o.sglang_out.empty()) r.fields["sglang_expert_location"] = o.sglang_out;
  if (!o.vllm_out.empty()) r.fields["vllm_eplb_state"] = o.vllm_out;
  r.fields["peak_rss_bytes"] = peak_rss_bytes();
  if (verbosity() >= 0) r.text = out.table;
  if (verbosity() >= 1) r.notes.push_back("wrote " + o.output + " in " + std::to_string(out.seconds) + " s");
  return r;
}

}  // namespace ucpkit::tool
