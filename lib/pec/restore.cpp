// pec-restore orchestration.
#include "pec/restore.h"

#include <fcntl.h>
#include <unistd.h>

#include <tbb/parallel_for.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "layout/deepspeed/version_line.h"
#include "load/moe_line.h"
#include "core/error.h"
#include "pec/checkpoint.h"
#include "pec/plt.h"
#include "pec/store.h"
#include "tool/tool.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {
using nlohmann::json;

struct Copy {
  size_t tier;
  const Manifest* manifest;
};

void write_file_durable(const std::string& path, std::span<const uint8_t> bytes) {
  fs::create_directories(fs::path(path).parent_path());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, std::string("cannot create: ") + std::strerror(errno));
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail(path, std::string("write failed: ") + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail(path, std::string("fsync failed: ") + std::strerror(errno));
  }
  ::close(fd);
}

int64_t at(const TokenMatrix& m, int l, int e) {
  if (static_cast<size_t>(l) >= m.size() || static_cast<size_t>(e) >= m[l].size()) return 0;
  return m[l][e];
}
}  // namespace

RestoreResult pec_restore(const RestoreOptions& o) {
  if (!o.ds_version.empty()) (void)layout::moe_version_line(o.ds_version);  // a usage error before any work
  auto t0 = std::chrono::steady_clock::now();
  RestoreResult res;
  auto warn = [&](const std::string& w) {
    res.warnings.push_back(w);
    tool::warn(w);
  };
  std::vector<std::unique_ptr<Store>> tiers;
  tiers.push_back(std::make_unique<Store>(o.store, "durable", false));
  if (!o.fast_store.empty()) {
    if (fs::exists(fs::path(o.fast_store) / "PEC_STORE"))
      tiers.push_back(std::make_unique<Store>(o.fast_store, "fast", false));
    else
      warn(o.fast_store + ": fast tier missing (lost with its node?); restoring from the durable store only");
  }
  for (auto& t : tiers) t->lock(false);

  // Every readable manifest of every tier, newest first; fast tier first among equal steps.
  std::vector<std::pair<size_t, Manifest>> all;
  for (size_t ti = 0; ti < tiers.size(); ++ti)
    for (int64_t s : tiers[ti]->committed_steps()) {
      try {
        all.emplace_back(ti, tiers[ti]->load_manifest(s));
      } catch (const std::exception& e) {
        warn(std::string(e.what()) + " (ignored)");
      }
    }
  std::stable_sort(all.begin(), all.end(), [&](const auto& a, const auto& b) {
    if (a.second.step != b.second.step) return a.second.step > b.second.step;
    return tiers[a.first]->tier() == "fast" && tiers[b.first]->tier() != "fast";
  });
  if (all.empty()) fail(o.store, "no committed step in the store");

  // Target: --step, or the newest step with non-expert state; without --step a damaged newest state
  // makes restore fall back, with a warning, to the next older step whose state is intact.
  std::vector<int64_t> candidates;
  if (o.step >= 0) {
    candidates.push_back(o.step);
  } else {
    for (const auto& [ti, m] : all)
      if (!m.non_expert_pruned && (candidates.empty() || candidates.back() != m.step)) candidates.push_back(m.step);
    if (candidates.empty()) fail(o.store, "no committed step with its non-expert state");
  }

  // Non-expert state of the target step (any tier holding it intact).
  int64_t target = -1;
  std::map<std::string, std::vector<uint8_t>> files;
  const Manifest* base = nullptr;
  std::string last_error;
  for (size_t ci = 0; ci < candidates.size(); ++ci) {
    const int64_t want = candidates[ci];
    for (const auto& [ti, m] : all) {
      if (m.step != want || m.non_expert_pruned) continue;
      try {
        std::map<std::string, std::vector<uint8_t>> got;
        std::vector<std::vector<uint8_t>*> slots;
        for (const auto& f : m.non_expert) slots.push_back(&got[f.path]);
        std::exception_ptr error;
        std::mutex error_mutex;
        const Store& store = *tiers[ti];
        tbb::parallel_for(size_t{0}, m.non_expert.size(), [&](size_t i) {
          try {
            const FileEntry& f = m.non_expert[i];
            *slots[i] = rebuild_cut_file(store.read_file(f), f.cut, f.path);
          } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!error) error = std::current_exception();
          }
        });
        if (error) std::rethrow_exception(error);
        files = std::move(got);
        base = &m;
        break;
      } catch (const ObjectError& e) {
        last_error = e.what();
        warn(std::string("non-expert state of step ") + std::to_string(want) + " in the " + tiers[ti]->tier() +
             " tier is damaged: " + e.what());
      }
    }
    if (base) {
      target = want;
      break;
    }
    if (ci + 1 < candidates.size())
      warn("no intact non-expert state for step " + std::to_string(want) +
           "; falling back to the next older committed step (more tokens are lost)");
  }
  if (!base) {
    if (o.step >= 0 && last_error.empty())
      fail(o.store, "step " + std::to_string(o.step) + " is not committed (or its non-expert state was garbage-collected)");
    if (o.step >= 0) fail(o.store, "no intact non-expert state for step " + std::to_string(o.step) + ": " + last_error);
    fail(o.store, "no committed step has intact non-expert state (last error: " + last_error + ")");
  }
  const MoeShape& shape = base->shape;

  // Each expert's newest intact copy at or before the target step.
  std::map<std::string, std::vector<std::string>> touched;
  json experts = json::array();
  TokenMatrix lost = zero_tokens(shape.experts_per_layer);
  std::map<std::pair<int, int>, const Manifest*> source_of;
  tool::Progress bar("pec-restore experts", static_cast<uint64_t>(shape.total_experts()));
  for (int l = 0; l < shape.num_layers(); ++l)
    for (int e = 0; e < shape.experts_per_layer[static_cast<size_t>(l)]; ++e) {
      bar.advance();
      const Manifest* used = nullptr;
      std::string why;
      for (const auto& [ti, m] : all) {
        if (m.step > target) continue;
        const ExpertEntry* x = m.find_expert(l, e);
        if (!x) continue;
        try {
          std::vector<std::pair<const FileEntry*, std::vector<uint8_t>>> parts;
          for (const auto& f : x->files) parts.emplace_back(&f, tiers[ti]->read_file(f));
          for (auto& [f, bytes] : parts) {
            if (f->ranges.is_null()) {
              files[f->path] = std::move(bytes);
            } else {
              auto it = files.find(f->path);
              if (it == files.end()) fail(f->path, "expert fragment saved for a file the non-expert state lacks");
              patch_expert_part(it->second, f->path, ranges_from_json(f->ranges), bytes, touched[f->path]);
            }
          }
          used = &m;
          break;
        } catch (const ObjectError& err) {
          why = err.what();
          warn("expert " + std::to_string(e) + " of MoE layer " + std::to_string(l) + ": copy of step " + std::to_string(m.step) +
               " in the " + tiers[ti]->tier() + " tier is damaged (" + err.what() + "); trying an older copy");
        }
      }
      if (!used)
        fail(o.store, "expert " + std::to_string(e) + " of MoE layer " + std::to_string(l) + " has no intact copy at or before step " +
                          std::to_string(target) + (why.empty() ? "" : " (last error: " + why + ")"));
      source_of[{l, e}] = used;
    }
  bar.finish();
  for (auto& [path, recs] : touched) finish_patched_file(files.at(path), path, recs);

  // Lost tokens: from the stored cumulative counts, or from --tokens as the per-interval estimate.
  std::set<int64_t> timeline;
  for (const auto& [ti, m] : all)
    if (m.step <= target) timeline.insert(m.step);
  TokenMatrix processed = zero_tokens(shape.experts_per_layer);
  TokenMatrix interval_rate = base->tokens_interval;
  bool tokens_known = base->tokens_known;
  TokenMatrix per_interval;
  if (!o.tokens.empty()) {
    per_interval = fit_tokens(load_tokens(o.tokens), shape.experts_per_layer, o.tokens);
    if (!tokens_known) interval_rate = per_interval;
  }
  auto count_between = [&](int64_t after, int64_t upto) {
    int64_t n = 0;
    for (int64_t s : timeline)
      if (s > after && s <= upto) ++n;
    return n;
  };
  for (int l = 0; l < shape.num_layers(); ++l)
    for (int e = 0; e < shape.experts_per_layer[static_cast<size_t>(l)]; ++e) {
      const Manifest* src = source_of.at({l, e});
      int64_t lt = 0;
      if (tokens_known) {
        lt = at(base->tokens_cumulative, l, e) - at(src->tokens_cumulative, l, e);
        processed[l][e] = at(base->tokens_cumulative, l, e);
      } else if (!per_interval.empty()) {
        lt = at(per_interval, l, e) * count_between(src->step, target);
        processed[l][e] = at(per_interval, l, e) * count_between(INT64_MIN, target);
      }
      lost[l][e] = std::max<int64_t>(lt, 0);
      experts.push_back({{"moe_layer", l}, {"expert", e}, {"restored_step", src->step}, {"lost_tokens", lost[l][e]},
                         {"tier", src->tier}});
    }
  if (!tokens_known && per_interval.empty())
    warn("no token counts in the store and no --tokens: lost tokens and PLT are reported as 0 (unknown)");
  Plt plt = compute_plt(lost, processed);

  // Tokens per iteration of each expert, for the capacity plan.
  int64_t prev_step = -1;
  for (int64_t s : timeline)
    if (s < target) prev_step = s;
  double iters = prev_step >= 0 ? static_cast<double>(target - prev_step) : std::max<double>(static_cast<double>(target), 1.0);
  std::vector<std::vector<double>> rate;
  for (int l = 0; l < shape.num_layers(); ++l) {
    rate.emplace_back();
    for (int e = 0; e < shape.experts_per_layer[static_cast<size_t>(l)]; ++e)
      rate.back().push_back(static_cast<double>(at(interval_rate, l, e)) / iters);
  }
  auto capacity = capacity_plan(lost, rate, o.capacity_factor);
  int max_e = 0;
  for (int e : shape.experts_per_layer) max_e = std::max(max_e, e);
  // K of the durable tier at the target step (the tier whose K the next run sets). With the budget
  // policy K is the per-layer outcome of the budget: k = the largest per-layer count, and the next
  // run should double the budget (next_budget_bytes) when PLT passes the threshold.
  const Manifest* kref = base;
  for (const auto& [ti, m] : all)
    if (m.step == target && m.tier == "durable") kref = &m;
  std::vector<int> k_per_layer = kref->k_per_layer;
  int k_now = kref->k;
  if ((k_now <= 0 || kref->budget_bytes > 0) && !k_per_layer.empty())
    k_now = *std::max_element(k_per_layer.begin(), k_per_layer.end());
  if (k_per_layer.empty()) k_per_layer.assign(shape.experts_per_layer.size(), std::max(k_now, 0));
  const bool exceeded = plt.overall > o.plt_threshold;

  res.report = {{"step", target},
                {"experts", experts},
                {"plt", plt_to_json(plt)},
                {"plt_threshold", o.plt_threshold},
                {"plt_exceeded", exceeded},
                {"policy", kref->policy},
                {"k", k_now},
                {"k_per_layer", k_per_layer},
                {"next_k", next_k(k_now, max_e, plt.overall, o.plt_threshold)},
                {"capacity_plan", capacity_plan_to_json(capacity)},
                {"layout", base->layout},
                {"tokens_known", tokens_known || !per_interval.empty()},
                {"warnings", res.warnings}};
  if (kref->budget_bytes > 0) {
    res.report["budget_bytes"] = kref->budget_bytes;
    res.report["next_budget_bytes"] = exceeded ? 2 * kref->budget_bytes : kref->budget_bytes;
  }

  // Write the checkpoint: a temporary folder renamed into place, then the `latest` pointer.
  const std::string tag = "global_step" + std::to_string(target);
  fs::create_directories(o.output);
  const fs::path final_dir = fs::path(o.output) / tag;
  const fs::path tmp_dir = fs::path(o.output) / ("." + tag + ".tmp." + std::to_string(::getpid()));
  if (fs::exists(final_dir) && !o.force) fail(final_dir.string(), "already exists (use --force to replace it)");
  fs::remove_all(tmp_dir);
  try {
    std::vector<std::pair<const std::string*, const std::vector<uint8_t>*>> todo;
    for (const auto& [path, bytes] : files) {
      todo.emplace_back(&path, &bytes);
      res.bytes_written += bytes.size();
      fs::create_directories((tmp_dir / path).parent_path());
    }
    tbb::parallel_for(size_t{0}, todo.size(), [&](size_t i) { write_file_durable((tmp_dir / *todo[i].first).string(), *todo[i].second); });
    if (!o.ds_version.empty()) {  // another DeepSpeed version line than the one saved
      if (base->layout == "universal") throw UsageError("--ds-version applies to native DeepSpeed MoE checkpoints, not universal ones");
      load::relayout_moe_folder(tmp_dir.string(), layout::moe_version_line(o.ds_version));
    }
    for (const auto& d : fs::recursive_directory_iterator(tmp_dir))
      if (d.is_directory()) fsync_dir(d.path().string());
    fsync_dir(tmp_dir.string());
    if (fs::exists(final_dir)) {
      fs::path old = fs::path(o.output) / ("." + tag + ".old." + std::to_string(::getpid()));
      fs::rename(final_dir, old);
      fs::remove_all(old);
    }
    fs::rename(tmp_dir, final_dir);
    fsync_dir(o.output);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  write_file_atomic((fs::path(o.output) / "latest").string(), tag, true);
  if (base->layout == "universal") write_file_atomic((fs::path(o.output) / "latest_universal").string(), tag, true);
  res.output_dir = final_dir.string();
  res.report["warnings"] = res.warnings;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

std::string report_table(const json& r) {
  std::ostringstream o;
  char line[1024];
  std::string k_text;
  if (r.contains("budget_bytes")) {
    std::string per;
    for (const auto& k : r.value("k_per_layer", json::array())) per += (per.empty() ? "" : ",") + std::to_string(k.get<int>());
    k_text = "budget " + std::to_string(r.at("budget_bytes").get<uint64_t>()) + " B (K per layer " + per + ") -> next budget " +
             std::to_string(r.at("next_budget_bytes").get<uint64_t>()) + " B";
  } else {
    k_text = "K " + std::to_string(r.at("k").get<int>()) + " -> next K " + std::to_string(r.at("next_k").get<int>());
  }
  std::snprintf(line, sizeof line, "restored step %lld  PLT %.4f%% (threshold %.4f%%)  %s\n",
                static_cast<long long>(r.at("step").get<int64_t>()), 100 * r.at("plt").at("overall").get<double>(),
                100 * r.at("plt_threshold").get<double>(), k_text.c_str());
  o << line;
  o << "moe_layer  expert  restored_step  lost_tokens  tier\n";
  int64_t step = r.at("step").get<int64_t>();
  size_t current = 0;
  for (const auto& e : r.at("experts")) {
    if (e.at("restored_step").get<int64_t>() == step && e.at("lost_tokens").get<int64_t>() == 0) {
      ++current;
      continue;
    }
    std::snprintf(line, sizeof line, "%9d  %6d  %13lld  %11lld  %s\n", e.at("moe_layer").get<int>(), e.at("expert").get<int>(),
                  static_cast<long long>(e.at("restored_step").get<int64_t>()),
                  static_cast<long long>(e.at("lost_tokens").get<int64_t>()), e.at("tier").get<std::string>().c_str());
    o << line;
  }
  o << "(" << current << " experts restored from step " << step << " itself)\n";
  const auto& per = r.at("plt").at("per_layer");
  o << "PLT per MoE layer:";
  for (size_t l = 0; l < per.size(); ++l) {
    std::snprintf(line, sizeof line, " %zu:%.3f%%", l, 100 * per[l].get<double>());
    o << line;
  }
  o << "\n";
  if (!r.at("capacity_plan").empty()) o << r.at("capacity_plan").size() << " experts need extra capacity (see capacity_plan)\n";
  return o.str();
}

}  // namespace ucpkit::pec
