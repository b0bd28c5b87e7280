// pec-restore: read the store manifests, plan (restore_plan.h), execute the plan into a temporary step
// folder, report, commit.
#include "pec/restore.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/staging.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/detect.h"
#include "formats/deepspeed/line_rewrite.h"
#include "formats/deepspeed/version_line.h"
#include "parallel/mpi_session.h"
#include "parallel/staging.h"
#include "pec/checkpoint.h"
#include "pec/crash.h"
#include "pec/paths.h"
#include "pec/plt.h"
#include "pec/restore_writer.h"
#include "formats/deepspeed/shard_version.h"
#include "pec/step_sources.h"
#include "pec/store.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {
using nlohmann::json;
using Warn = std::function<void(const std::string&)>;

constexpr const char* kStagingTag = "pec-restore";

// Staging folders `.global_stepN.pec-restore-tmp-<pid>` (and `-old-`) left by restores killed on this
// host, for any step (core/staging sweeps one target's; a restore's target step may differ from the
// killed one's).
void sweep_stale_restores(const std::string& output, const StagingNote& note) {
  const std::string tag = std::string(".") + kStagingTag + "-";
  std::error_code ec;
  std::set<std::string> targets;
  for (fs::directory_iterator it(output, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const auto at = n.find(tag);
    if (at != std::string::npos && at > 1 && n[0] == '.' && formats::deepspeed::step_of_tag(n.substr(1, at - 1)))
      targets.insert(n.substr(1, at - 1));
  }
  for (const auto& t : targets) sweep_stale_staging(fs::path(output) / t, kStagingTag, note);
}

int64_t at(const TokenMatrix& m, int l, int e) {
  if (static_cast<size_t>(l) >= m.size() || static_cast<size_t>(e) >= m[l].size()) return 0;
  return m[l][e];
}

// Read: the tiers (the durable store, then the fast tier when its folder holds a store), locked shared
// until the end, and every readable committed manifest of each (a damaged one is skipped, warned).
struct OpenedStores {
  std::vector<std::unique_ptr<Store>> stores;
  RestoreCatalog catalog;
};

OpenedStores open_stores(const RestoreOptions& o, const Warn& warn) {
  OpenedStores s;
  s.stores.push_back(std::make_unique<Store>(o.store, Tier::durable, StoreOpen::existing));
  if (!o.fast_store.empty()) {
    if (formats::is_kind(o.fast_store, formats::kPecStore))
      s.stores.push_back(std::make_unique<Store>(o.fast_store, Tier::fast, StoreOpen::existing));
    else
      warn(o.fast_store + ": fast tier missing (lost with its node?); restoring from the durable store only");
  }
  for (auto& t : s.stores) t->lock(false);
  for (size_t ti = 0; ti < s.stores.size(); ++ti) {
    s.catalog.stores.push_back({s.stores[ti]->tier(), s.stores[ti]->dir()});
    for (int64_t step : s.stores[ti]->committed_steps()) {
      try {
        s.catalog.copies.push_back({ti, s.stores[ti]->load_manifest(step)});
      } catch (const std::exception& e) {
        warn(std::string(e.what()) + " (ignored)");
      }
    }
  }
  return s;
}

RestoreRequest request_of(const RestoreOptions& o) { return {o.step, o.output, o.tokens, o.ds_version}; }

// Read: --tokens fitted to the MoE shape, the per-interval counts used when the store has none (empty
// when not given; a folder gives the file of the restored step, pec/tokens.h).
TokenMatrix interval_tokens(const RestoreOptions& o, const RestorePlan& plan) {
  if (o.tokens.empty()) return {};
  const std::string file = tokens_file_for_step(o.tokens, plan.step);
  return fit_tokens(load_tokens(file), plan.base_manifest().shape.experts_per_layer, file);
}

// The options with every path absolute (pec/paths.h).
RestoreOptions with_absolute_paths(RestoreOptions o) {
  make_absolute({&o.store, &o.fast_store, &o.output, &o.tokens});
  return o;
}

// --output names the checkpoint folder (`latest` plus global_step<N>/). Given the step folder itself
// (`.../global_step<N>`, N the restored step), its parent is meant; a step folder of another step is
// refused (it would get a global_step<M>/ inside).
void aim_output(RestoreOptions& o, RestorePlan& plan) {
  const fs::path out(o.output);
  const auto named = step_of_tag(out.filename().string());
  if (!named) return;
  if (*named != plan.step)
    throw UsageError("--output " + o.output + " is the step folder of step " + std::to_string(*named) + ", but step " +
                     std::to_string(plan.step) + " is restored (give the checkpoint folder that holds the global_step folders" +
                     (o.step < 0 ? ", or --step " + std::to_string(*named) : "") + ")");
  o.output = out.parent_path().string();
  plan.request.output = o.output;
}

void check_step_dir_free(const RestorePlan& plan, bool force) {
  const std::string dir = restore_step_dir(plan);
  if (fs::exists(dir) && !force) fail(dir, "already exists (use --overwrite to replace it)");
}

// Execute: one restore writing its plan into `<output>/.global_stepN.pec-restore-tmp-<pid>`. Under MPI every rank
// writes the files it owns into the folder rank 0 names; each step ends in a collective that settles
// a failure on any rank (the folder is removed before any rank leaves).
class RestoreRun {
 public:
  RestoreRun(const RestoreOptions& o, std::vector<std::unique_ptr<Store>>& stores, RestorePlan& plan, const Warn& warn)
      : o_(o), stores_(stores), plan_(plan), warn_(warn), mpi_(parallel::MpiSession::get()), root_(mpi_.rank() == 0) {}

  // A failed restore leaves no folder it created: only empty ones are removed, deepest first,
  // after the staging folder is gone; a committed step keeps them (rmdir of a folder with content fails).
  ~RestoreRun() {
    writer_.reset();
    staging_.reset();
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) ::rmdir(it->c_str());
  }
  RestoreRun(const RestoreRun&) = delete;
  RestoreRun& operator=(const RestoreRun&) = delete;

  // Creates the output folder and sweeps the staging folders of killed restores.
  void prepare_output() {
    std::error_code ec;
    for (fs::path p = o_.output; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
      created_.push_back(p);
      if (p == p.parent_path()) break;
    }
    std::reverse(created_.begin(), created_.end());
    fs::create_directories(o_.output);
    if (root_) sweep_stale_restores(o_.output, o_.reporter.verbose);
  }

  // Phase 1: the target's non-expert state from the first intact copy; without --step, when no copy
  // of a step is intact, the next older step (warned). Re-aims the plan at the copy written.
  void write_non_expert_state() {
    std::string last_error;
    for (size_t ci = 0; ci < plan_.targets.size(); ++ci) {
      for (size_t copy : plan_.targets[ci].copies)
        if (try_non_expert(copy, last_error)) return;
      if (ci + 1 < plan_.targets.size())
        warn_("no intact non-expert state for step " + std::to_string(plan_.targets[ci].step) +
              "; falling back to the next older committed step (more tokens are lost)");
    }
    if (o_.step >= 0) fail(o_.store, "no intact non-expert state for step " + std::to_string(o_.step) + ": " + last_error);
    fail(o_.store, "no committed step has intact non-expert state (last error: " + last_error + ")");
  }

  std::vector<size_t> write_experts();

  // Recomputes the CRCs of the records experts touched and fsyncs every rank's files; returns the bytes
  // written by all ranks.
  uint64_t finish_files() {
    parallel::RankFailure failed(mpi_);
    failed.guard([&] { writer_->finish(); });
    failed.settle(remove_tmp_);
    return mpi_.sum(writer_->bytes_written());
  }

  void commit(const PltHistory& history);

 private:
  bool try_non_expert(size_t copy, std::string& last_error);
  struct Damage {
    std::set<size_t> experts;  // indices into plan.experts
    json messages;             // expert index -> error text
  };
  Damage exchange_damage(const std::vector<size_t>& pending, const std::vector<CopyOutcome>& outs);
  [[noreturn]] void no_copy(size_t x, const std::string& why);
  void convert_version_line();

  const RestoreOptions& o_;
  std::vector<std::unique_ptr<Store>>& stores_;
  RestorePlan& plan_;
  const Warn& warn_;
  parallel::MpiSession& mpi_;
  const bool root_;
  std::unique_ptr<parallel::CollectiveStaging> staging_;  // the step folder being written
  fs::path tmp_dir_;                                     // its path
  std::unique_ptr<RestoreWriter> writer_;
  std::vector<fs::path> created_;  // folders prepare_output created, outermost first
  const std::function<void()> remove_tmp_ = [this] {
    if (staging_) staging_->cleanup()();
  };
};

bool RestoreRun::try_non_expert(size_t copy, std::string& last_error) {
  aim_at(plan_, copy);
  const Manifest& m = plan_.manifest(copy);
  const Store& store = *stores_[plan_.catalog.copies[copy].store];
  check_step_dir_free(plan_, o_.force);
  check_ds_version_applies(o_.ds_version, m);
  {
    // durable = false: the writer fsyncs the files, commit() the folders (no syncfs of the whole file system).
    parallel::RankFailure failed(mpi_);
    staging_ = std::make_unique<parallel::CollectiveStaging>(failed, restore_step_dir(plan_), o_.force, kStagingTag,
                                                             o_.reporter.verbose, false, nullptr, "--overwrite");
    tmp_dir_ = staging_->path();
  }
  auto w = std::make_unique<RestoreWriter>(tmp_dir_.string(), o_.memory_mb << 20, mpi_.rank(), mpi_.size());
  w->assign(plan_.file_sizes);  // every file of the step, largest first to the least loaded rank
  std::string err;
  parallel::RankFailure failed(mpi_);
  failed.guard([&] {
    try {
      w->write_non_expert(store, m.non_expert, m.step);
    } catch (const ObjectError& e) {
      err = e.what();
    }
  });
  failed.settle(remove_tmp_);
  if (!mpi_.any(!err.empty())) {
    writer_ = std::move(w);
    return true;
  }
  std::string first;
  for (const auto& g : mpi_.gather(err))
    if (!g.empty() && first.empty()) first = g;
  last_error = mpi_.broadcast(first);
  warn_(std::string("non-expert state of step ") + std::to_string(m.step) + " in the " + to_string(store.tier()) +
        " tier is damaged: " + last_error);
  remove_tmp_();
  mpi_.barrier();
  return false;
}

void RestoreRun::no_copy(size_t x, const std::string& why) {
  remove_tmp_();
  const ExpertSources& s = plan_.experts[x];
  fail(o_.store, "expert " + std::to_string(s.expert) + " of MoE layer " + std::to_string(s.moe_layer) +
                     " has no intact copy at or before step " + std::to_string(plan_.step) +
                     (why.empty() ? "" : " (last error: " + why + ")"));
}

// The pending experts whose copy proved damaged on any rank; rank 0 learns the other ranks' error texts
// for its warnings.
RestoreRun::Damage RestoreRun::exchange_damage(const std::vector<size_t>& pending, const std::vector<CopyOutcome>& outs) {
  std::vector<int64_t> mine;
  Damage d;
  d.messages = json::object();
  for (size_t k = 0; k < pending.size(); ++k)
    if (!outs[k].error.empty()) {
      mine.push_back(static_cast<int64_t>(pending[k]));
      d.messages[std::to_string(pending[k])] = outs[k].error;
    }
  for (const auto& r : mpi_.allgather(mine))
    for (int64_t x : r) d.experts.insert(static_cast<size_t>(x));
  if (!d.experts.empty()) {
    json merged = d.messages;
    for (const auto& g : mpi_.gather(d.messages.dump())) {
      const json part = json::parse(g);
      for (const auto& [key, text] : part.items()) merged[key] = text;
    }
    d.messages = json::parse(mpi_.broadcast(merged.dump()));
  }
  return d;
}

// Phase 2: each expert's newest intact copy at or before the target, written in rounds: every expert's
// first source first; the copies found damaged (on any rank) are wiped and those experts' next sources
// written in the next round. Returns the copy (index into the catalog) each expert was restored from.
std::vector<size_t> RestoreRun::write_experts() {
  const auto& experts = plan_.experts;
  for (size_t x = 0; x < experts.size(); ++x)
    if (experts[x].copies.empty()) no_copy(x, "");
  std::vector<size_t> choice(experts.size(), 0), pending(experts.size());
  std::iota(pending.begin(), pending.end(), size_t{0});
  Reporter::Bar bar(o_.reporter, "pec-restore experts", static_cast<uint64_t>(experts.size()));
  while (!pending.empty()) {
    std::vector<RestoreWriter::ExpertCopy> copies;
    for (size_t x : pending) {
      const ManifestCopy& c = plan_.catalog.copies[experts[x].copies[choice[x]]];
      copies.push_back({stores_[c.store].get(), c.manifest.find_expert(experts[x].moe_layer, experts[x].expert),
                        c.manifest.step});
    }
    std::vector<CopyOutcome> outs;
    parallel::RankFailure failed(mpi_);
    failed.guard([&] { outs = writer_->write_experts(copies); });
    failed.settle(remove_tmp_);
    const Damage damage = exchange_damage(pending, outs);
    std::vector<size_t> next;
    failed.guard([&] {
      for (size_t k = 0; k < pending.size(); ++k) {
        const size_t x = pending[k];
        if (!damage.experts.count(x)) {
          writer_->accept(std::move(outs[k]));
          bar.advance();
          continue;
        }
        writer_->discard(outs[k]);
        const ManifestCopy& c = plan_.catalog.copies[experts[x].copies[choice[x]]];
        const std::string why = damage.messages.value(std::to_string(x), std::string("damaged on another rank"));
        warn_("expert " + std::to_string(experts[x].expert) + " of MoE layer " + std::to_string(experts[x].moe_layer) +
              ": copy of step " + std::to_string(c.manifest.step) + " in the " + to_string(stores_[c.store]->tier()) +
              " tier is damaged (" + why + "); trying an older copy");
        if (++choice[x] == experts[x].copies.size()) no_copy(x, why);
        next.push_back(x);
      }
    });
    failed.settle(remove_tmp_);
    pending = std::move(next);
  }
  bar.finish();
  std::vector<size_t> source(experts.size());
  for (size_t x = 0; x < experts.size(); ++x) source[x] = experts[x].copies[choice[x]];
  return source;
}

// --ds-version: the model and expert files rewritten as another DeepSpeed version line; the optimizer
// shards' ds_version kept when it is a release of the line, else the line's.
void RestoreRun::convert_version_line() {
  const formats::deepspeed::VersionLine& line = formats::deepspeed::moe_version_line(o_.ds_version);
  formats::deepspeed::rewrite_as_line(tmp_dir_.string(), line);
  for (const auto& e : fs::directory_iterator(tmp_dir_)) {
    const std::string n = e.path().filename().string();
    if (!e.is_regular_file() || n.find("optim_states.pt") == std::string::npos) continue;
    formats::deepspeed::VersionPatch p = formats::deepspeed::patch_ds_version(e.path().string(), [&](const std::string& have) {
      return formats::deepspeed::moe_line_of_release(have) == line.name ? have : line.ds_version;
    });
    if (!p.skipped.empty()) warn_(n + ": " + p.skipped);
  }
}

// Commit (rank 0): version-line rewrite if asked, folder fsyncs, rename into place, then `latest`
// (and `latest_universal`), then the accumulated PLT record.
void RestoreRun::commit(const PltHistory& history) {
  const std::string tag = formats::deepspeed::step_tag(plan_.step);
  parallel::RankFailure failed(mpi_);
  if (root_) failed.guard([&] {
    try {
      test_pause_if_asked();
      check_interrupted();
      if (!o_.ds_version.empty()) convert_version_line();
      for (const auto& d : fs::recursive_directory_iterator(tmp_dir_))
        if (d.is_directory()) fsync_dir(d.path().string());
      fsync_dir(tmp_dir_.string());
      crash_point("restore folder complete");
      staging_->commit();  // renamed into place (exchanged with an old folder under --force), output fsynced
      crash_point("restore folder renamed");
      formats::deepspeed::write_latest(o_.output, tag, plan_.base_manifest().layout == SourceLayout::Universal, true);
      try {
        save_plt_history(o_.store, history);
      } catch (const std::exception& e) {
        warn_(std::string(e.what()) + " (the accumulated PLT of this restore is not recorded)");
      }
    } catch (...) {
      remove_tmp_();
      throw;
    }
  });
  failed.settle(remove_tmp_);
}

// Lost and processed tokens per expert, from the stored cumulative counts, or from --tokens as the
// per-interval estimate; and the report's per-expert entries.
struct ExpertLosses {
  bool known = false;  // token counts in the store or from --tokens; else lost and processed are unknown (zeros here)
  TokenMatrix lost, processed;
  json experts = json::array();
};

ExpertLosses expert_losses(const RestorePlan& plan, const std::vector<size_t>& source, const TokenMatrix& per_interval) {
  const Manifest& base = plan.base_manifest();
  const MoeShape& shape = base.shape;
  ExpertLosses r;
  r.known = base.tokens_known || !per_interval.empty();
  r.lost = zero_tokens(shape.experts_per_layer);
  r.processed = zero_tokens(shape.experts_per_layer);
  auto count_between = [&](int64_t after, int64_t upto) {
    int64_t n = 0;
    for (int64_t s : plan.timeline)
      if (s > after && s <= upto) ++n;
    return n;
  };
  for (size_t x = 0; x < plan.experts.size(); ++x) {
    const int l = plan.experts[x].moe_layer, e = plan.experts[x].expert;
    const Manifest& src = plan.manifest(source[x]);
    int64_t lt = 0;
    if (base.tokens_known) {
      lt = at(base.tokens_cumulative, l, e) - at(src.tokens_cumulative, l, e);
      r.processed[l][e] = at(base.tokens_cumulative, l, e);
    } else if (!per_interval.empty()) {
      lt = at(per_interval, l, e) * count_between(src.step, plan.step);
      r.processed[l][e] = at(per_interval, l, e) * count_between(INT64_MIN, plan.step);
    }
    r.lost[l][e] = std::max<int64_t>(lt, 0);
    // Without token counts an expert restored from the target step itself loses nothing (0); one from
    // an older step lost an unknown number of tokens (null).
    const json lost_tokens = r.known || src.step == plan.step ? json(r.lost[l][e]) : json(nullptr);
    r.experts.push_back({{"moe_layer", l}, {"expert", e}, {"restored_step", src.step}, {"lost_tokens", lost_tokens},
                         {"tier", to_string(src.tier)}});
  }
  return r;
}

// The report: lost tokens, PLT (this restore's and accumulated over the run's restores in `history`),
// the K of the durable tier at the target and the next K, the capacity plan.
json restore_report(const RestorePlan& plan, const ExpertLosses& losses, const TokenMatrix& per_interval,
                    const PltHistory& history, const RestoreOptions& o) {
  const Manifest& base = plan.base_manifest();
  const MoeShape& shape = base.shape;
  // Without token counts PLT is unknown, not 0: `null`, K kept (a false 0 would never double it).
  std::optional<Plt> plt, plt_total;
  if (losses.known) plt = compute_plt(losses.lost, losses.processed);
  const std::optional<TokenMatrix> lost_total = total_lost(history, shape.experts_per_layer);
  if (losses.known && lost_total) plt_total = compute_plt(*lost_total, losses.processed);
  // Tokens per iteration of each expert, for the capacity plan.
  const TokenMatrix& interval_rate = !base.tokens_known && !o.tokens.empty() ? per_interval : base.tokens_interval;
  int64_t prev_step = -1;
  for (int64_t s : plan.timeline)
    if (s < plan.step) prev_step = s;
  double iters = prev_step >= 0 ? static_cast<double>(plan.step - prev_step) : std::max<double>(static_cast<double>(plan.step), 1.0);
  std::vector<std::vector<double>> rate;
  for (int l = 0; l < shape.num_layers(); ++l) {
    rate.emplace_back();
    for (int e = 0; e < shape.experts_per_layer[static_cast<size_t>(l)]; ++e)
      rate.back().push_back(static_cast<double>(at(interval_rate, l, e)) / iters);
  }
  auto capacity = capacity_plan(losses.lost, rate, o.capacity_factor);
  int max_e = 0;
  for (int e : shape.experts_per_layer) max_e = std::max(max_e, e);
  // K of the durable tier at the target step (the tier whose K the next run sets). With the budget
  // policy K is the per-layer outcome of the budget: k = the largest per-layer count, and the next
  // run should double the budget (next_budget_bytes) when PLT passes the threshold.
  const Manifest& kref = plan.manifest(plan.k_source);
  std::vector<int> k_per_layer = kref.k_per_layer;
  int k_now = kref.k;
  if ((k_now <= 0 || kref.budget_bytes > 0) && !k_per_layer.empty()) k_now = *std::max_element(k_per_layer.begin(), k_per_layer.end());
  if (k_per_layer.empty()) k_per_layer.assign(shape.experts_per_layer.size(), std::max(k_now, 0));
  const bool exceeded = plt_total && plt_total->overall > o.plt_threshold;
  std::string why;
  if (!losses.known)
    why = "PLT unknown: no token counts in the store and no --tokens; K kept";
  else if (!plt_total)
    why = "accumulated PLT unknown: an earlier restore of this run had no token counts; K kept";
  else
    why = std::string("accumulated PLT ") + (exceeded ? "above" : "at or below") + " the threshold: K " +
          (exceeded ? "doubled (at most the experts per layer)" : "kept");
  json report = {{"step", plan.step},
                 {"experts", losses.experts},
                 {"plt", plt_to_json(plt)},
                 {"plt_threshold", o.plt_threshold},
                 {"plt_exceeded", plt_total ? json(exceeded) : json(nullptr)},
                 {"policy", kref.policy},
                 {"k", k_now},
                 {"k_per_layer", k_per_layer},
                 {"plt_accumulated", plt_to_json(plt_total)},
                 {"restores_counted", history.restores.size()},
                 {"next_k", plt_total ? next_k(k_now, max_e, plt_total->overall, o.plt_threshold) : k_now},
                 {"next_k_reason", why},
                 {"capacity_plan", capacity_plan_to_json(capacity)},
                 {"layout", to_string(base.layout)},
                 {"tokens_known", losses.known}};
  // What the command line left out and the store decided (never a silent choice).
  json from_source = json::object();
  if (o.step < 0) from_source["step"] = plan.step;  // the newest committed step with intact non-expert state
  if (o.ds_version.empty() && base.layout == SourceLayout::DeepSpeedMoe) from_source["ds_version"] = "as saved";
  report["from_source"] = from_source;
  if (kref.budget_bytes > 0) {
    report["budget_bytes"] = kref.budget_bytes;
    report["next_budget_bytes"] = exceeded ? 2 * kref.budget_bytes : kref.budget_bytes;
  }
  return report;
}
}  // namespace

RestorePlan pec_restore_plan(const RestoreOptions& options) {
  RestoreOptions o = with_absolute_paths(options);
  if (!o.ds_version.empty()) (void)formats::deepspeed::moe_version_line(o.ds_version);  // a usage error before any work
  const bool root = parallel::MpiSession::get().rank() == 0;
  OpenedStores opened = open_stores(o, [&](const std::string& w) {
    if (root) o.reporter.warning(w);
  });
  RestorePlan plan = plan_restore(std::move(opened.catalog), request_of(o));
  aim_output(o, plan);
  (void)interval_tokens(o, plan);  // a bad --tokens file fails as the restore would
  check_step_dir_free(plan, o.force);
  RestoreWriter::check_memory(o.memory_mb << 20);
  return plan;
}

RestoreResult pec_restore(const RestoreOptions& options) {
  RestoreOptions o = with_absolute_paths(options);
  if (!o.ds_version.empty()) (void)formats::deepspeed::moe_version_line(o.ds_version);  // a usage error before any work
  RestoreWriter::check_memory(o.memory_mb << 20);
  const auto t0 = std::chrono::steady_clock::now();
  RestoreResult res;
  const bool root = parallel::MpiSession::get().rank() == 0;
  const Warn warn = [&](const std::string& w) {
    res.warnings.push_back(w);
    if (root) o.reporter.warning(w);
  };
  // Read and plan: nothing is written before the plan stands (a refusal leaves no output folder).
  Reporter::Phase phase(o.reporter, "read and plan");
  OpenedStores opened = open_stores(o, warn);
  RestorePlan plan = plan_restore(std::move(opened.catalog), request_of(o));
  aim_output(o, plan);
  const TokenMatrix per_interval = interval_tokens(o, plan);

  // Execute: streamed straight into a temporary step folder, renamed into place at the end.
  // SIGINT/SIGTERM from here on stop the run at the next chunk and remove the folder (the tool then
  // dies by the signal).
  StagedPhase staged;
  RestoreRun run(o, opened.stores, plan, warn);
  run.prepare_output();
  phase.next("write non-expert state");
  run.write_non_expert_state();
  phase.next("write experts");
  const std::vector<size_t> source = run.write_experts();
  res.bytes_written = run.finish_files();

  // Report. PLT over the whole run: this restore's lost tokens plus those of the earlier restores
  // recorded in the durable store (each earlier failure's lost updates stay lost); it drives next_k.
  phase.next("report and commit");
  const ExpertLosses losses = expert_losses(plan, source, per_interval);
  if (!losses.known)
    warn("no token counts in the store and no --tokens: PLT and the lost tokens of experts restored from older steps "
         "are unknown (null in the report), K is kept");
  PltHistory history;
  try {
    history = load_plt_history(o.store);
  } catch (const std::exception& e) {
    warn(std::string(e.what()) + "; the accumulated PLT counts this restore only");
  }
  add_restore(history, plan.step, losses.known ? std::optional<TokenMatrix>(losses.lost) : std::nullopt);
  res.report = restore_report(plan, losses, per_interval, history, o);

  run.commit(history);
  res.output_dir = restore_step_dir(plan);
  res.report["warnings"] = res.warnings;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}
namespace {
// A PLT for the table: "1.2345%", or "unknown" for null.
std::string percent(const json& plt) {
  if (plt.is_null()) return "unknown";
  char text[64];
  std::snprintf(text, sizeof text, "%.4f%%", 100 * plt.get<double>());
  return text;
}
}  // namespace

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
  std::snprintf(line, sizeof line, "restored step %lld  PLT %s (threshold %.4f%%)  %s\n",
                static_cast<long long>(r.at("step").get<int64_t>()), percent(r.at("plt").at("overall")).c_str(),
                100 * r.at("plt_threshold").get<double>(), k_text.c_str());
  o << line;
  if (r.at("plt").at("overall").is_null() || r.at("plt_accumulated").at("overall").is_null())
    o << r.value("next_k_reason", std::string()) << "\n";
  if (r.value("restores_counted", 1) > 1) {
    std::snprintf(line, sizeof line, "accumulated PLT over %d restores of this run: %s (drives next K)\n",
                  r.at("restores_counted").get<int>(), percent(r.at("plt_accumulated").at("overall")).c_str());
    o << line;
  }
  const json from = r.value("from_source", json::object());
  if (from.contains("step") || from.contains("ds_version")) {
    o << "from the store:";
    if (from.contains("step")) o << " step " << from["step"].get<int64_t>() << " (newest committed; no --step)";
    if (from.contains("ds_version")) o << (from.contains("step") ? "," : "") << " DeepSpeed version line as saved (no --ds-version)";
    o << "\n";
  }
  o << "moe_layer  expert  restored_step  lost_tokens  tier\n";
  int64_t step = r.at("step").get<int64_t>();
  size_t current = 0;
  for (const auto& e : r.at("experts")) {
    const json& lost = e.at("lost_tokens");
    if (e.at("restored_step").get<int64_t>() == step && lost == 0) {
      ++current;
      continue;
    }
    std::snprintf(line, sizeof line, "%9d  %6d  %13lld  %11s  %s\n", e.at("moe_layer").get<int>(), e.at("expert").get<int>(),
                  static_cast<long long>(e.at("restored_step").get<int64_t>()),
                  lost.is_null() ? "unknown" : std::to_string(lost.get<int64_t>()).c_str(), e.at("tier").get<std::string>().c_str());
    o << line;
  }
  o << "(" << current << " experts restored from step " << step << " itself)\n";
  const auto& per = r.at("plt").at("per_layer");
  o << "PLT per MoE layer:";
  if (per.is_null()) o << " unknown";
  for (size_t l = 0; per.is_array() && l < per.size(); ++l) {
    std::snprintf(line, sizeof line, " %zu:%.3f%%", l, 100 * per[l].get<double>());
    o << line;
  }
  o << "\n";
  if (!r.at("capacity_plan").empty()) o << r.at("capacity_plan").size() << " experts need extra capacity (see capacity_plan)\n";
  return o.str();
}

}  // namespace ucpkit::pec
