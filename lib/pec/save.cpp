// pec-save: read the checkpoint and the tiers' previous commits, plan (the experts each tier's policy
// selects, the fully sharded work split), execute this rank's share, commit on rank 0.
#include "pec/save.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "parallel/mpi_session.h"
#include "pec/paths.h"
#include "pec/plt.h"
#include "pec/record_crcs.h"
#include "pec/shard_plan.h"
#include "pec/step_sources.h"
#include "pec/store.h"
#include "pec/tokens.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {
using nlohmann::json;

// One tier being saved: its store, K (or byte budget) and retention, its previous commit, the experts
// its policy selected (the plan) and the manifest of this step.
struct TierSave {
  Tier tier = Tier::durable;
  std::unique_ptr<Store> store;
  int k = 0;
  uint64_t budget = 0;
  int keep = 1;
  std::optional<Manifest> prev;
  Selection selection;
  Manifest next;
};

// One file to store into one tier: an expert part, or a non-expert file when `part` is null.
struct Work {
  size_t tier;
  int moe_layer = -1, expert = -1;  // expert work; else non-expert file
  std::string path;
  const ExpertPart* part = nullptr;
};

// The work of every tier and its fully sharded split over the ranks (items: the work's names and bytes).
struct SaveWork {
  std::vector<Work> work;
  std::vector<SaveItem> items;
  ShardPlan shards;
};

// A store inside the checkpoint folder would save its own files as part of the checkpoint (and grow
// with every save): refused, naming the option.
void check_store_outside(const std::string& store, const std::string& given, const char* option, const std::string& root) {
  if (store.empty()) return;
  std::error_code ec;
  const fs::path s = fs::weakly_canonical(store, ec), r = fs::weakly_canonical(root, ec);
  if (std::mismatch(r.begin(), r.end(), s.begin(), s.end()).first == r.end())
    throw UsageError(std::string(option) + " " + escaped_brief(given, 200) + " is inside the checkpoint folder " +
                     escaped_brief(root, 200) + ": the store would save its own files; put it outside");
}

struct CreatedStores {
  std::vector<std::string> dirs;
  bool committed = false;
  ~CreatedStores() {
    if (committed) return;
    std::error_code ec;
    for (const auto& d : dirs)
      if (!fs::exists(fs::path(d) / "manifests", ec) || fs::is_empty(fs::path(d) / "manifests", ec)) fs::remove_all(d, ec);
  }
};

void check_shape(const Manifest& m, const MoeShape& s, const std::string& dir) {
  if (m.shape.experts_per_layer != s.experts_per_layer)
    fail(dir, "the checkpoint's MoE shape (experts per layer) differs from the store's step " + std::to_string(m.step));
}

std::vector<std::vector<int64_t>> never_saved(const MoeShape& s) {
  std::vector<std::vector<int64_t>> v;
  for (int e : s.experts_per_layer) v.emplace_back(static_cast<size_t>(e), -1);
  return v;
}

// Read: the tiers (created when new, unless only planning), locked by rank 0 unless only planning. Objects are fsynced in
// one pass before the commit, so a file at an object's name that no committed manifest names may be
// torn (a save that crashed before its fsync): only the referenced ones are trusted, the rest rewritten.
std::vector<TierSave> open_tiers(const SaveOptions& o, bool root) {
  const StoreOpen how = o.plan_only ? StoreOpen::as_found : StoreOpen::create;  // --plan writes nothing
  std::vector<TierSave> tiers;
  {
    TierSave d;
    d.tier = Tier::durable;
    d.k = o.k_persist > 0 ? o.k_persist : o.k;
    d.budget = o.budget_bytes;
    d.keep = o.keep;
    d.store = std::make_unique<Store>(o.store, Tier::durable, how, o.zstd_level);
    tiers.push_back(std::move(d));
  }
  if (root && !o.plan_only) tiers.front().store->lock(true);
  if (!o.plan_only) tiers.front().store->objects().trust(tiers.front().store->referenced_objects());
  if (!o.fast_store.empty()) {
    // The fast tier is a cache in front of the durable one: when it cannot be opened, locked or
    // read, the durable save goes on without it, with a warning (every rank agrees on whether it is used).
    TierSave f;
    f.tier = Tier::fast;
    f.k = o.k_snapshot;
    f.keep = o.keep_fast;
    std::string error;
    try {
      f.store = std::make_unique<Store>(o.fast_store, Tier::fast, how, o.zstd_level);
      if (root && !o.plan_only) f.store->lock(true);
      if (!o.plan_only) f.store->objects().trust(f.store->referenced_objects());
      if (auto last = f.store->latest_step()) (void)f.store->load_manifest(*last);
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (parallel::MpiSession::get().sum(error.empty() ? 0 : 1) == 0) {
      tiers.push_back(std::move(f));
    } else if (root) {
      o.reporter.warning("fast tier not used for this step: " + (error.empty() ? std::string("another MPI rank cannot open it") : error));
    }
  }
  return tiers;
}

// Read: each tier's previous commit (same MoE shape, older step). Returns the cumulative token counts
// after this step, continued from the newest commit of any tier.
TokenMatrix load_previous(std::vector<TierSave>& tiers, int64_t step, const MoeShape& shape, const TokenMatrix& interval) {
  std::optional<Manifest> newest;
  for (auto& t : tiers) {
    if (auto last = t.store->latest_step()) {
      t.prev = t.store->load_manifest(*last);
      check_shape(*t.prev, shape, t.store->dir());
      if (*last >= step)
        fail(t.store->dir(), "step " + std::to_string(step) + " is not newer than its latest committed step " + std::to_string(*last));
      if (!newest || t.prev->step > newest->step) newest = *t.prev;
    }
  }
  return add_tokens(newest ? newest->tokens_cumulative : zero_tokens(shape.experts_per_layer), interval);
}

// What the policy of one tier is asked: its K or budget, its rotation point and history.
SelectionRequest selection_request(const TierSave& t, const SaveOptions& o, const MoeShape& shape,
                                   const std::vector<std::vector<uint64_t>>& expert_bytes, const TokenMatrix& interval) {
  SelectionRequest req;
  req.shape = shape;
  req.save_index = t.prev ? t.prev->save_index + 1 : 0;
  req.k = t.k;
  req.budget_bytes = t.budget;
  req.expert_bytes = expert_bytes;
  req.unsaved_tokens = add_tokens(t.prev ? t.prev->unsaved_tokens : zero_tokens(shape.experts_per_layer), interval);
  req.last_saved_step = t.prev ? t.prev->last_saved_step : never_saved(shape);
  // (a tier without K, or a budget, was refused by check_save_options before anything ran)
  if (t.tier == Tier::fast && o.policy == "budget") req.budget_bytes = 0;  // the fast tier is sized by --k-snapshot
  return req;
}

// Plan: the experts the policy selects for one tier, plus, in the durable tier with bootstrap, every
// expert it never saved; returns the policy's count per MoE layer (bootstrap additions excluded).
std::vector<int> select_experts(TierSave& t, const SelectionPolicy& policy, const SelectionRequest& req, bool bootstrap) {
  const MoeShape& shape = req.shape;
  t.selection = policy.select(req);
  std::vector<int> k_per_layer;
  for (const auto& layer : t.selection) k_per_layer.push_back(static_cast<int>(layer.size()));
  if (t.tier == Tier::durable && bootstrap)
    for (int l = 0; l < shape.num_layers(); ++l)
      for (int e = 0; e < shape.experts_per_layer[static_cast<size_t>(l)]; ++e)
        if (req.last_saved_step[static_cast<size_t>(l)][static_cast<size_t>(e)] < 0 &&
            std::find(t.selection[l].begin(), t.selection[l].end(), e) == t.selection[l].end())
          t.selection[l].push_back(e);
  for (auto& s : t.selection) std::sort(s.begin(), s.end());
  return k_per_layer;
}

// The tier's manifest of this step without its files: shape, policy, token counts, last-saved steps.
void start_manifest(TierSave& t, const SaveOptions& o, const SourceCheckpoint& src, const SelectionRequest& req,
                    std::vector<int> k_per_layer, const TokenMatrix& interval, const TokenMatrix& cumulative, bool tokens_known) {
  Manifest& m = t.next;
  m.step = o.step;
  m.tier = t.tier;
  m.layout = src.layout;
  m.tag = src.tag;
  m.shape = src.shape;
  m.policy = o.policy;
  m.k = t.k;
  m.budget_bytes = req.budget_bytes;
  m.k_per_layer = std::move(k_per_layer);
  m.save_index = req.save_index;
  m.tokens_known = tokens_known || (t.prev && t.prev->tokens_known);
  m.tokens_interval = interval;
  m.tokens_cumulative = cumulative;
  m.last_saved_step = req.last_saved_step;
  m.unsaved_tokens = req.unsaved_tokens;
  for (int l = 0; l < src.shape.num_layers(); ++l)
    for (int e : t.selection[l]) {
      m.last_saved_step[l][e] = o.step;
      m.unsaved_tokens[l][e] = 0;
    }
  json shared = json::object();
  for (const auto& [file, ranges] : src.expert_ranges) shared[file] = ranges.size();
  m.source = {{"root_pointer", src.layout == SourceLayout::Universal ? formats::deepspeed::kLatestUniversalName : formats::deepspeed::kLatestName},
              {"shared_files", shared}};
}

// Plan: every selected expert's parts and every non-expert file, per tier, split over the ranks.
SaveWork plan_work(const std::vector<TierSave>& tiers, const SourceCheckpoint& src, int world, bool data_before_expert) {
  const MoeShape& shape = src.shape;
  SaveWork w;
  for (size_t ti = 0; ti < tiers.size(); ++ti) {
    const std::string& tier = to_string(tiers[ti].tier);
    for (int l = 0; l < shape.num_layers(); ++l)
      for (int e : tiers[ti].selection[l]) {
        for (const auto& part : src.experts.at({l, e})) {
          w.work.push_back({ti, l, e, part.path, &part});
          w.items.push_back({tier + ":" + part.path, part.bytes, l, e});
        }
      }
    for (const auto& f : src.non_expert_files) {
      w.work.push_back({ti, -1, -1, f, nullptr});
      w.items.push_back({tier + ":" + f, src.stored_bytes(f)});  // what the store receives
    }
  }
  w.shards = plan_fully_sharded(w.items, shape, world, data_before_expert);
  return w;
}

// The plan as `pec-save --plan` prints it: the sharded split, the selection of each tier, the step.
json save_plan_json(const SaveWork& w, const std::vector<TierSave>& tiers, int64_t step) {
  json j = shard_plan_to_json(w.shards, w.items);
  json sel = json::object();
  for (const auto& t : tiers) sel[to_string(t.tier)] = t.selection;
  j["selection"] = sel;
  j["step"] = step;
  return j;
}

// Execute: this rank's share of the work, stored into the tiers' object stores; entries at their work
// index. A rank that fails settles with the others instead of leaving them waiting in a collective.
std::vector<FileEntry> store_share(const SaveWork& w, std::vector<TierSave>& tiers, const SourceCheckpoint& src,
                                   const SaveOptions& o, const std::function<void(uint64_t)>& progress, uint64_t* total_bytes,
                                   std::string& fast_error) {
  auto& mpi = parallel::MpiSession::get();
  const auto& mine = w.shards.items_of_rank[static_cast<size_t>(mpi.rank())];
  uint64_t my_total = 0;
  for (size_t i : mine) my_total += w.items[i].bytes;
  if (total_bytes) *total_bytes = my_total;
  std::vector<FileEntry> results(w.work.size());
  std::mutex progress_mutex;
  // The range CRC table of each shared file stored here (once per file, whatever the tiers).
  struct Table {
    std::once_flag once;
    std::vector<RangeCrc> crcs;
  };
  std::map<std::string, Table> tables;
  std::mutex fast_mutex;
  for (size_t i : mine)
    if (!w.work[i].part && src.expert_ranges.count(w.work[i].path)) tables[w.work[i].path];
  parallel::RankFailure failed(mpi);
  failed.guard([&] {
    tbb::parallel_for(size_t{0}, mine.size(), [&](size_t n) {
      const Work& job = w.work[mine[n]];
      Store& st = *tiers[job.tier].store;
      auto store_one = [&] {
        std::optional<CutList> cut;
        std::optional<std::vector<RangeCrc>> crcs;
        if (auto t = tables.find(job.path); !job.part && t != tables.end()) {
          std::call_once(t->second.once, [&] { t->second.crcs = expert_range_crcs(src, job.path); });
          crcs = t->second.crcs;
        }
        SourceSegments from = job.part ? expert_part_segments(src, *job.part) : non_expert_segments(src, job.path, cut);
        FileEntry f = st.put_file_from(job.path, from.path, from.segments, o.chunk_bytes);
        f.cut = std::move(cut);
        if (job.part && !job.part->ranges.empty()) f.ranges = job.part->ranges;
        f.range_crcs = std::move(crcs);
        results[mine[n]] = std::move(f);
      };
      if (tiers[job.tier].tier != Tier::fast) {
        store_one();
      } else {
        // A failing fast tier (full, unwritable) drops out of this step; the durable save goes on. (A
        // damaged source is refused by the durable tier's jobs, which read the same files.)
        {
          std::lock_guard<std::mutex> lock(fast_mutex);
          if (!fast_error.empty()) return;
        }
        try {
          store_one();
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(fast_mutex);
          if (fast_error.empty()) fast_error = e.what();
        }
      }
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        progress(w.items[mine[n]].bytes);
      }
    });
    for (auto& t : tiers) {
      if (t.tier != Tier::fast) {
        t.store->objects().sync_dirs();
        continue;
      }
      try {
        t.store->objects().sync_dirs();
      } catch (const std::exception& e) {
        if (fast_error.empty()) fast_error = e.what();
      }
    }
  });
  failed.settle("another MPI rank failed while storing its share");
  return results;
}

// Rank 0: the entries every rank stored (gathered as JSON), placed at their work index in `results`.
void merge_gathered(const std::vector<std::string>& gathered, std::vector<FileEntry>& results, std::string& fast_error) {
  for (const auto& g : gathered)
    for (const auto& r : json::parse(g)) {
      if (r.contains("fast_error")) {
        if (fast_error.empty()) fast_error = r.at("fast_error").get<std::string>();
        continue;
      }
      size_t i = r.at("work").get<size_t>();
      try {
        results[i] = file_from_json(r.at("entry"), "gathered entry");
      } catch (const json::exception& e) {
        fail("gathered entry", std::string("malformed manifest: ") + e.what());
      }
    }
}

// The statistics of one tier's manifest: bytes selected and stored against the full checkpoint.
json tier_stats(const TierSave& t, const SourceCheckpoint& src) {
  const Manifest& m = t.next;
  const MoeShape& shape = src.shape;
  const uint64_t ne = src.non_expert_bytes_total, ex = src.expert_bytes_total;
  uint64_t logical = 0, stored = 0, expert_logical = 0;
  for (const auto& f : m.non_expert) {
    for (const auto& c : f.chunks) stored += c.stored;
  }
  for (const auto& e : m.experts)
    for (const auto& f : e.files) {
      expert_logical += f.size;
      for (const auto& c : f.chunks) stored += c.stored;
    }
  logical = ne + expert_logical;
  double k_avg = 0, e_avg = 0;
  for (int l = 0; l < shape.num_layers(); ++l) {
    k_avg += static_cast<double>(t.selection[l].size());
    e_avg += shape.experts_per_layer[static_cast<size_t>(l)];
  }
  int saved_experts = static_cast<int>(k_avg);
  if (shape.num_layers()) k_avg /= shape.num_layers(), e_avg /= shape.num_layers();
  return {{"bytes_logical", logical},
          {"bytes_stored", stored},
          {"bytes_full_checkpoint", src.total_bytes()},
          {"ratio_logical_vs_full", src.total_bytes() ? static_cast<double>(logical) / src.total_bytes() : 0.0},
          {"ratio_stored_vs_full", src.total_bytes() ? static_cast<double>(stored) / src.total_bytes() : 0.0},
          {"ratio_formula", pec_size_ratio(static_cast<double>(ne), static_cast<double>(ex), k_avg, e_avg)},
          {"experts_saved", saved_experts}};
}

// Commits one tier's manifest (its entries placed by commit_tiers), collects the tier; its summary.
json commit_tier(TierSave& t, std::vector<TierSave>& tiers, const SourceCheckpoint& src, const SaveOptions& o) {
  Manifest& m = t.next;
  // Each expert fragment carries the CRC-32 its ranges had, from the table of its file.
  std::map<std::string, std::map<std::tuple<std::string, uint64_t, uint64_t>, uint32_t>> crc_of;
  for (const auto& f : m.non_expert)
    if (f.range_crcs)
      for (const auto& r : *f.range_crcs) crc_of[f.path][{r.record, r.offset, r.length}] = r.crc;
  for (auto& e : m.experts)
    for (auto& f : e.files) {
      if (!f.ranges || !crc_of.count(f.path)) continue;
      std::vector<RangeCrc> own;
      for (const auto& r : *f.ranges) {
        auto c = crc_of[f.path].find({r.record, r.offset, r.length});
        if (c == crc_of[f.path].end()) fail(f.path, "expert range missing from its file's CRC table");
        own.push_back({r.record, r.offset, r.length, c->second});
      }
      f.range_crcs = std::move(own);
    }
  // A damaged object this save would have named was written again (older steps naming it are whole again).
  for (const auto& damage : t.store->objects().repaired()) o.reporter.warning(damage + ": written again from this save");
  attribute_stored_once(m);
  m.stats = tier_stats(t, src);
  t.store->commit(m);
  // The fast tier keeps only what the durable tier (committed and collected just before) lacks:
  // the non-expert state of its kept steps and expert copies newer than the durable ones.
  ExpertCopySteps durable_copies;
  if (t.tier == Tier::fast) durable_copies = tiers.front().store->expert_copy_steps();
  GcStats gc = t.store->collect_garbage(t.keep, t.tier == Tier::fast ? &durable_copies : nullptr);
  if (!gc.skipped.empty()) o.reporter.warning(gc.skipped);
  json sel = json::array();
  for (int l = 0; l < src.shape.num_layers(); ++l) sel.push_back(t.selection[l]);
  return {{"tier", to_string(t.tier)},
                        {"store", t.store->dir()},
                        {"k", t.k},
                        {"k_per_layer", m.k_per_layer},
                        {"budget_bytes", m.budget_bytes},
                        {"selection", sel},
                        {"stats", m.stats},
                        {"gc", {{"manifests_removed", gc.manifests_removed}, {"manifests_pruned", gc.manifests_pruned},
                                {"objects_removed", gc.objects_removed}, {"bytes_removed", gc.bytes_removed},
                                {"skipped", gc.skipped}}}};
}

// Commit (rank 0): each tier's manifest gets its entries (in work order, which is deterministic) and
// statistics, is committed, and the tier collected. Returns the summary's per-tier part.
json commit_tiers(std::vector<TierSave>& tiers, const SaveWork& w, const std::vector<FileEntry>& results,
                  const SourceCheckpoint& src, const SaveOptions& o, const std::string& fast_error) {
  for (size_t i = 0; i < w.work.size(); ++i) {
    const Work& job = w.work[i];
    Manifest& m = tiers[job.tier].next;
    if (job.moe_layer < 0) {
      m.non_expert.push_back(results[i]);
    } else {
      if (m.experts.empty() || m.experts.back().moe_layer != job.moe_layer || m.experts.back().expert != job.expert)
        m.experts.push_back({job.moe_layer, job.expert, {}});
      m.experts.back().files.push_back(results[i]);
    }
  }
  json tiers_json = json::array();
  for (auto& t : tiers) {
    if (t.tier == Tier::fast && !fast_error.empty()) {
      o.reporter.warning(t.store->dir() + ": fast tier not committed for this step: " + fast_error);
      continue;
    }
    if (t.tier == Tier::fast) {
      try {
        tiers_json.push_back(commit_tier(t, tiers, src, o));
      } catch (const std::exception& e) {  // the durable tier is committed: a warning, not a failed save
        o.reporter.warning(std::string("fast tier not committed for this step: ") + e.what());
      }
      continue;
    }
    tiers_json.push_back(commit_tier(t, tiers, src, o));
  }
  return tiers_json;
}

}  // namespace

void check_save_options(const SaveOptions& o) {
  (void)make_policy(o.policy);
  if (!o.fast_store.empty() && o.k_snapshot <= 0) throw UsageError("--fast-store needs --k-snapshot K1 >= 1");
  if (o.fast_store.empty() && o.k_snapshot > 0) throw UsageError("--k-snapshot needs --fast-store");
  if (o.k < 0 || o.k_persist < 0) throw UsageError("--k and --k-persist must be >= 1");
  const int durable_k = o.k_persist > 0 ? o.k_persist : o.k;
  if (durable_k <= 0 && !(o.policy == "budget" && o.budget_bytes > 0))
    throw UsageError("give --k >= 1 (or --k-persist, or --budget-bytes with the budget policy)");
  if (o.zstd_level < 0 || o.zstd_level > 22) throw UsageError("--zstd-level must be 0..22");
  if (o.chunk_bytes == 0) throw UsageError("--chunk-mib must be >= 1");
  if (o.tokens.empty() && o.policy != "sequential")
    throw UsageError("the " + o.policy + " policy needs --tokens (token counts since the previous save)");
}


json pec_save(const SaveOptions& options, const std::function<void(uint64_t)>& progress, uint64_t* total_bytes) {
  auto t0 = std::chrono::steady_clock::now();
  auto& mpi = parallel::MpiSession::get();
  const bool root = mpi.rank() == 0;
  SaveOptions o = options;
  make_absolute({&o.checkpoint, &o.store, &o.fast_store, &o.tokens});
  // Every usage error before anything is created: a refused run leaves no store behind.
  check_save_options(o);
  auto policy = make_policy(o.policy);

  // Read: the checkpoint and its step (--step checked against the checkpoint's, or inferred), the
  // token counts, the tiers and their previous commits.
  Reporter::Phase phase(o.reporter, "read");
  SourceCheckpoint src = open_checkpoint(o.checkpoint, o.open);
  check_store_outside(o.store, options.store, "--store", src.root);
  check_store_outside(o.fast_store, options.fast_store, "--fast-store", src.root);
  const ResolvedStep step = resolve_step(o.step, step_sources(src), src.root);
  o.step = step.step;
  const MoeShape& shape = src.shape;
  TokenMatrix interval = zero_tokens(shape.experts_per_layer);
  bool tokens_known = false;
  if (!o.tokens.empty()) {  // (a policy that needs them without them was refused by check_save_options)
    const std::string file = tokens_file_for_step(o.tokens, o.step);
    interval = fit_tokens(load_tokens(file), shape.experts_per_layer, file);
    tokens_known = true;
  }
  // A store folder this run creates is removed again when the save fails before its commit (rank 0,
  // after the tiers' locks are released): a failed save leaves no store folder without a manifest.
  CreatedStores created;
  if (root && !o.plan_only)
    for (const auto* dir : {&o.store, &o.fast_store})
      if (!dir->empty() && !fs::exists(*dir)) created.dirs.push_back(*dir);
  std::vector<TierSave> tiers = open_tiers(o, root);
  const TokenMatrix cumulative = load_previous(tiers, o.step, shape, interval);

  // Plan: the experts each tier's policy selects, and the work split over the ranks.
  phase.next("plan");
  std::vector<std::vector<uint64_t>> expert_bytes;
  for (int l = 0; l < shape.num_layers(); ++l) {
    expert_bytes.emplace_back();
    for (int e = 0; e < shape.experts_per_layer[static_cast<size_t>(l)]; ++e) expert_bytes.back().push_back(src.expert_bytes(l, e));
  }
  for (auto& t : tiers) {
    const SelectionRequest req = selection_request(t, o, shape, expert_bytes, interval);
    std::vector<int> k_per_layer = select_experts(t, *policy, req, o.bootstrap);
    start_manifest(t, o, src, req, std::move(k_per_layer), interval, cumulative, tokens_known);
  }
  const SaveWork work = plan_work(tiers, src, mpi.size(), o.open.data_before_expert);
  if (o.plan_only) {
    if (!root) return json::object();
    json plan = save_plan_json(work, tiers, o.step);
    plan["step_inferred"] = step.inferred;
    plan["step_from"] = step.from;
    return plan;
  }

  // Execute this rank's share; rank 0 gathers the entries and commits.
  phase.next("store");
  std::string fast_error;
  std::vector<FileEntry> results = store_share(work, tiers, src, o, progress, total_bytes, fast_error);
  json local = json::array();
  for (size_t i : work.shards.items_of_rank[static_cast<size_t>(mpi.rank())])
    if (fast_error.empty() || tiers[work.work[i].tier].tier != Tier::fast)
      local.push_back({{"work", i}, {"entry", file_to_json(results[i])}});
  if (!fast_error.empty()) local.push_back({{"fast_error", fast_error}});
  phase.next("commit");
  auto gathered = mpi.gather(local.dump());
  json summary = json::object();
  parallel::RankFailure failed(mpi);
  failed.guard([&] {
    if (!root) return;
    merge_gathered(gathered, results, fast_error);
    json tiers_json = commit_tiers(tiers, work, results, src, o, fast_error);
    created.committed = true;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    summary = {{"step", o.step},
               {"step_inferred", step.inferred},
               {"step_from", step.from},
               {"checkpoint", src.root},
               {"layout", to_string(src.layout)},
               {"policy", o.policy},
               {"experts_per_layer", shape.experts_per_layer},
               {"ep_size", shape.ep_size},
               {"world_size", mpi.size()},
               {"non_expert_bytes", src.non_expert_bytes_total},
               {"expert_bytes", src.expert_bytes_total},
               {"tokens_known", tokens_known},
               {"tiers", tiers_json},
               {"seconds", seconds},
               {"max_rank_bytes", work.shards.max_rank_bytes()}};
  });
  failed.settle("MPI rank 0 failed while committing the step");
  return summary;
}

}  // namespace ucpkit::pec
