// pec-restore orchestration.
#include "pec/restore.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

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
#include "core/staging.h"
#include "pec/checkpoint.h"
#include "pec/crash.h"
#include "pec/plt.h"
#include "pec/restore_writer.h"
#include "pec/shard_version.h"
#include "pec/store.h"
#include "parallel/mpi_session.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {
using nlohmann::json;

struct Copy {
  size_t tier;
  const Manifest* manifest;
};

// Folders `.global_stepN.tmp.<pid>` left by a restore killed on this host (its pid no longer runs).
void remove_stale_temporaries(const std::string& output) {
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(output, ec)) {
    const std::string n = d.path().filename().string();
    const auto at = n.rfind(".tmp.");
    if (n.rfind(".global_step", 0) != 0 || at == std::string::npos || !d.is_directory()) continue;
    const std::string pid = n.substr(at + 5);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
    fs::remove_all(d.path(), ec);
  }
}

// --ds-version rewrites the native MoE version lines only.
void check_ds_version_applies(const RestoreOptions& o, const Manifest& m) {
  if (!o.ds_version.empty() && m.layout == "universal")
    throw UsageError("--ds-version applies to native DeepSpeed MoE checkpoints, not universal ones");
  if (!o.ds_version.empty() && m.layout == "deepspeed-autoep-zero3")
    throw UsageError("--ds-version applies to native DeepSpeed MoE checkpoints, not AutoEP ZeRO-3 ones");
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
  auto& mpi = parallel::MpiSession::get();
  const bool root = mpi.rank() == 0;
  auto warn = [&](const std::string& w) {
    res.warnings.push_back(w);
    if (root) o.reporter.warning(w);
  };
  std::vector<std::unique_ptr<Store>> tiers;
  tiers.push_back(std::make_unique<Store>(o.store, Tier::durable, false));
  if (!o.fast_store.empty()) {
    if (fs::exists(fs::path(o.fast_store) / "PEC_STORE"))
      tiers.push_back(std::make_unique<Store>(o.fast_store, Tier::fast, false));
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
    return tiers[a.first]->tier() == Tier::fast && tiers[b.first]->tier() != Tier::fast;
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

  // Streamed straight into a temporary step folder, renamed into place at the end. Under MPI every
  // rank writes the files it owns into the folder rank 0 names. SIGINT/SIGTERM from here on stop the
  // run at the next chunk and remove the folder (the tool then dies by the signal).
  // A refusal of --ds-version comes before the output folder is created: it leaves nothing behind.
  for (const auto& [ti, m] : all)
    if (m.step == candidates.front() && !m.non_expert_pruned) {
      check_ds_version_applies(o, m);
      break;
    }
  StagedPhase staged;
  fs::create_directories(o.output);
  if (root) remove_stale_temporaries(o.output);
  const std::string pid0 = mpi.broadcast(std::to_string(::getpid()));
  fs::path tmp_dir;
  auto remove_tmp = [&] {
    if (root && !tmp_dir.empty()) {
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);
    }
  };
  std::unique_ptr<RestoreWriter> writer;

  // Non-expert state of the target step (any tier holding it intact).
  int64_t target = -1;
  const Manifest* base = nullptr;
  std::string last_error;
  for (size_t ci = 0; ci < candidates.size(); ++ci) {
    const int64_t want = candidates[ci];
    for (const auto& [ti, m] : all) {
      if (m.step != want || m.non_expert_pruned) continue;
      const fs::path final_dir = fs::path(o.output) / ("global_step" + std::to_string(want));
      if (fs::exists(final_dir) && !o.force) fail(final_dir.string(), "already exists (use --force to replace it)");
      check_ds_version_applies(o, m);
      tmp_dir = fs::path(o.output) / (".global_step" + std::to_string(want) + ".tmp." + pid0);
      if (root) fs::remove_all(tmp_dir);
      mpi.barrier();
      auto w = std::make_unique<RestoreWriter>(tmp_dir.string(), o.memory_mb << 20, mpi.rank(), mpi.size());
      // Owners: every file of the step, largest first to the least loaded rank.
      std::vector<std::pair<std::string, uint64_t>> sizes;
      for (const auto& f : m.non_expert) sizes.emplace_back(f.path, f.cut.is_null() ? f.size : f.cut.at("file_size").get<uint64_t>());
      for (const auto& [tj, mj] : all)
        if (mj.step <= want)
          for (const auto& x : mj.experts)
            for (const auto& f : x.files)
              if (f.ranges.is_null()) sizes.emplace_back(f.path, f.size);
      w->assign(sizes);
      std::string err;
      parallel::RankFailure failed(mpi);
      failed.guard([&] {
        try {
          w->write_non_expert(*tiers[ti], m.non_expert);
        } catch (const ObjectError& e) {
          err = e.what();
        }
      });
      failed.settle(remove_tmp);
      if (mpi.any(!err.empty())) {
        std::string first;
        for (const auto& g : mpi.gather(err))
          if (!g.empty() && first.empty()) first = g;
        last_error = mpi.broadcast(first);
        warn(std::string("non-expert state of step ") + std::to_string(want) + " in the " + to_string(tiers[ti]->tier()) +
             " tier is damaged: " + last_error);
        remove_tmp();
        mpi.barrier();
        continue;
      }
      writer = std::move(w);
      base = &m;
      break;
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

  // Each expert's newest intact copy at or before the target step, written in rounds: every expert's
  // newest copy first; the copies found damaged (on any rank) are wiped and the next older copy of
  // those experts is written in the next round.
  json experts = json::array();
  TokenMatrix lost = zero_tokens(shape.experts_per_layer);
  std::map<std::pair<int, int>, const Manifest*> source_of;
  struct Candidate {
    size_t tier;
    const Manifest* manifest;
    const ExpertEntry* entry;
  };
  std::vector<std::pair<int, int>> ids;
  std::vector<std::vector<Candidate>> cands;
  for (int l = 0; l < shape.num_layers(); ++l)
    for (int e = 0; e < shape.experts_per_layer[static_cast<size_t>(l)]; ++e) {
      ids.emplace_back(l, e);
      cands.emplace_back();
      for (const auto& [ti, m] : all)
        if (m.step <= target)
          if (const ExpertEntry* x = m.find_expert(l, e)) cands.back().push_back({ti, &m, x});
    }
  auto no_copy = [&](size_t x, const std::string& why) {
    remove_tmp();
    fail(o.store, "expert " + std::to_string(ids[x].second) + " of MoE layer " + std::to_string(ids[x].first) +
                      " has no intact copy at or before step " + std::to_string(target) +
                      (why.empty() ? "" : " (last error: " + why + ")"));
  };
  for (size_t x = 0; x < ids.size(); ++x)
    if (cands[x].empty()) no_copy(x, "");
  std::vector<size_t> choice(ids.size(), 0);
  std::vector<size_t> pending(ids.size());
  for (size_t x = 0; x < ids.size(); ++x) pending[x] = x;
  Reporter::Bar bar(o.reporter, "pec-restore experts", static_cast<uint64_t>(ids.size()));
  while (!pending.empty()) {
    std::vector<RestoreWriter::ExpertCopy> copies;
    for (size_t x : pending) {
      const Candidate& c = cands[x][choice[x]];
      copies.push_back({tiers[c.tier].get(), c.entry});
    }
    std::vector<CopyOutcome> outs;
    parallel::RankFailure failed(mpi);
    failed.guard([&] { outs = writer->write_experts(copies); });
    failed.settle(remove_tmp);
    std::vector<int64_t> mine;
    json messages = json::object();
    for (size_t k = 0; k < pending.size(); ++k)
      if (!outs[k].error.empty()) {
        mine.push_back(static_cast<int64_t>(pending[k]));
        messages[std::to_string(pending[k])] = outs[k].error;
      }
    std::set<size_t> damaged;
    for (const auto& r : mpi.allgather(mine))
      for (int64_t x : r) damaged.insert(static_cast<size_t>(x));
    if (!damaged.empty()) {  // rank 0 learns the other ranks' error texts for its warnings
      json merged = messages;
      for (const auto& g : mpi.gather(messages.dump())) {
        const json part = json::parse(g);
        for (const auto& [key, text] : part.items()) merged[key] = text;
      }
      messages = json::parse(mpi.broadcast(merged.dump()));
    }
    std::vector<size_t> next;
    failed.guard([&] {
      for (size_t k = 0; k < pending.size(); ++k) {
        const size_t x = pending[k];
        if (!damaged.count(x)) {
          writer->accept(std::move(outs[k]));
          source_of[ids[x]] = cands[x][choice[x]].manifest;
          bar.advance();
          continue;
        }
        writer->discard(outs[k]);
        const Candidate& c = cands[x][choice[x]];
        const std::string why = messages.value(std::to_string(x), std::string("damaged on another rank"));
        warn("expert " + std::to_string(ids[x].second) + " of MoE layer " + std::to_string(ids[x].first) + ": copy of step " +
             std::to_string(c.manifest->step) + " in the " + to_string(tiers[c.tier]->tier()) + " tier is damaged (" + why +
             "); trying an older copy");
        if (++choice[x] == cands[x].size()) no_copy(x, why);
        next.push_back(x);
      }
    });
    failed.settle(remove_tmp);
    pending = std::move(next);
  }
  bar.finish();
  {
    parallel::RankFailure failed(mpi);
    failed.guard([&] { writer->finish(); });
    failed.settle(remove_tmp);
  }
  res.bytes_written = mpi.sum(writer->bytes_written());

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
                         {"tier", to_string(src->tier)}});
    }
  if (!tokens_known && per_interval.empty())
    warn("no token counts in the store and no --tokens: lost tokens and PLT are reported as 0 (unknown)");
  Plt plt = compute_plt(lost, processed);
  // PLT over the whole run: this restore's lost tokens plus those of the earlier restores recorded in
  // the durable store (each earlier failure's lost updates stay lost); it drives next_k.
  PltHistory history;
  try {
    history = load_plt_history(o.store);
  } catch (const std::exception& e) {
    warn(std::string(e.what()) + "; the accumulated PLT counts this restore only");
  }
  add_restore(history, target, lost);
  const Plt plt_total = compute_plt(total_lost(history, shape.experts_per_layer), processed);

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
    if (m.step == target && m.tier == Tier::durable) kref = &m;
  std::vector<int> k_per_layer = kref->k_per_layer;
  int k_now = kref->k;
  if ((k_now <= 0 || kref->budget_bytes > 0) && !k_per_layer.empty())
    k_now = *std::max_element(k_per_layer.begin(), k_per_layer.end());
  if (k_per_layer.empty()) k_per_layer.assign(shape.experts_per_layer.size(), std::max(k_now, 0));
  const bool exceeded = plt_total.overall > o.plt_threshold;

  res.report = {{"step", target},
                {"experts", experts},
                {"plt", plt_to_json(plt)},
                {"plt_threshold", o.plt_threshold},
                {"plt_exceeded", exceeded},
                {"policy", kref->policy},
                {"k", k_now},
                {"k_per_layer", k_per_layer},
                {"plt_accumulated", plt_to_json(plt_total)},
                {"restores_counted", history.restores.size()},
                {"next_k", next_k(k_now, max_e, plt_total.overall, o.plt_threshold)},
                {"capacity_plan", capacity_plan_to_json(capacity)},
                {"layout", base->layout},
                {"tokens_known", tokens_known || !per_interval.empty()},
                {"warnings", res.warnings}};
  if (kref->budget_bytes > 0) {
    res.report["budget_bytes"] = kref->budget_bytes;
    res.report["next_budget_bytes"] = exceeded ? 2 * kref->budget_bytes : kref->budget_bytes;
  }

  // Commit (rank 0): version-line rewrite if asked, folder fsyncs, rename into place, then `latest`.
  const std::string tag = "global_step" + std::to_string(target);
  const fs::path final_dir = fs::path(o.output) / tag;
  {
    parallel::RankFailure failed(mpi);
    if (root) failed.guard([&] {
      try {
        test_pause_if_asked();
        check_interrupted();
        if (!o.ds_version.empty()) {  // another DeepSpeed version line than the one saved
          const layout::VersionLine& line = layout::moe_version_line(o.ds_version);
          load::relayout_moe_folder(tmp_dir.string(), line);
          // The optimizer shards' ds_version: kept when it is a release of the line, else the line's.
          for (const auto& e : fs::directory_iterator(tmp_dir)) {
            const std::string n = e.path().filename().string();
            if (!e.is_regular_file() || n.find("optim_states.pt") == std::string::npos) continue;
            VersionPatch p = patch_ds_version(e.path().string(), [&](const std::string& have) {
              return layout::moe_line_of_release(have) == line.name ? have : line.ds_version;
            });
            if (!p.skipped.empty()) warn(n + ": " + p.skipped);
          }
        }
        for (const auto& d : fs::recursive_directory_iterator(tmp_dir))
          if (d.is_directory()) fsync_dir(d.path().string());
        fsync_dir(tmp_dir.string());
        if (fs::exists(final_dir)) {
          fs::path old = fs::path(o.output) / ("." + tag + ".old." + pid0);
          fs::rename(final_dir, old);
          fs::remove_all(old);
        }
        crash_point("restore folder complete");
        fs::rename(tmp_dir, final_dir);
        fsync_dir(o.output);
        crash_point("restore folder renamed");
        write_file_atomic((fs::path(o.output) / "latest").string(), tag, true);
        if (base->layout == "universal") write_file_atomic((fs::path(o.output) / "latest_universal").string(), tag, true);
        try {
          save_plt_history(o.store, history);
        } catch (const std::exception& e) {
          warn(std::string(e.what()) + " (the accumulated PLT of this restore is not recorded)");
        }
      } catch (...) {
        remove_tmp();
        throw;
      }
    });
    failed.settle(remove_tmp);
  }
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
  if (r.value("restores_counted", 1) > 1) {
    std::snprintf(line, sizeof line, "accumulated PLT over %d restores of this run: %.4f%% (drives next K)\n",
                  r.at("restores_counted").get<int>(), 100 * r.at("plt_accumulated").at("overall").get<double>());
    o << line;
  }
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
