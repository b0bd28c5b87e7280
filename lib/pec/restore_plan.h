// pec-restore's plan, decided from the store manifests alone (no object is read): the target step and
// the copy its non-expert state comes from (then, without --step, the older steps to fall back to when
// that state proves damaged), each expert's newest copy at or before the target (then its older
// copies, tried in turn when a copy proves damaged), the objects those copies name, the files written
// and where, and the inputs of the report (token counts, the manifest whose K the report gives).
// `pec-restore --plan` prints it; pec_restore (restore.h) executes it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "pec/manifest.h"
#include "pec/tier.h"

namespace ucpkit::pec {

// One tier opened by the restore: the durable store first, then the fast tier when present.
struct RestoreStore {
  Tier tier = Tier::durable;
  std::string dir;
};

// One readable committed manifest and the store (index into RestoreCatalog::stores) holding it.
struct ManifestCopy {
  size_t store = 0;
  Manifest manifest;
};

// What a restore chooses from: every readable committed manifest of every tier.
struct RestoreCatalog {
  std::vector<RestoreStore> stores;
  std::vector<ManifestCopy> copies;
};

// What the plan depends on of pec-restore's options.
struct RestoreRequest {
  int64_t step = -1;       // --step; -1: the newest step with non-expert state
  std::string output;      // --output
  std::string tokens;      // --tokens file ("" = none)
  std::string ds_version;  // --ds-version ("" = the saved line)
};

// A step the non-expert state may come from and the copies holding it, in the order tried.
struct TargetCandidate {
  int64_t step = 0;
  std::vector<size_t> copies;  // indices into catalog.copies
};

// Where one expert comes from: the copies holding it at or before the target, newest first (fast tier
// first among equal steps). The first is restored; the next ones are tried in turn when one proves damaged.
struct ExpertSources {
  int moe_layer = 0;
  int expert = 0;
  std::vector<size_t> copies;  // indices into catalog.copies
};

struct RestorePlan {
  RestoreCatalog catalog;  // copies newest step first, fast tier first among equal steps
  RestoreRequest request;
  std::vector<TargetCandidate> targets;  // the target step first, then the steps to fall back to
  int64_t step = -1;                     // the target step
  size_t base = 0;                       // the copy whose non-expert state is restored
  std::vector<ExpertSources> experts;    // every expert of the MoE shape, layer by layer
  // Bytes of every file the restore may write (the non-expert files, the whole expert files of every
  // copy at or before the target): the split of the files over MPI ranks (RestoreWriter::assign).
  std::vector<std::pair<std::string, uint64_t>> file_sizes;
  std::vector<int64_t> timeline;  // committed steps at or before the target, ascending (lost-token intervals)
  size_t k_source = 0;  // the copy whose policy and K the report gives: the durable manifest of the target step, else base

  const Manifest& manifest(size_t copy) const { return catalog.copies[copy].manifest; }
  const Manifest& base_manifest() const { return manifest(base); }
};

// Orders the copies (newest step first, the fast tier first among equal steps), chooses the target and
// every expert's sources. No I/O. Throws Error naming the durable store when no step can be restored:
// none committed, --step not committed (or its non-expert state collected), an expert without any copy
// at or before the target.
RestorePlan plan_restore(RestoreCatalog catalog, RestoreRequest request);

// Re-aims the plan at the non-expert state of another copy (the restore falls back to it when the
// chosen one proved damaged): target step, expert sources, file sizes, timeline and K source follow.
// An expert may then have no source (the restore fails naming it).
void aim_at(RestorePlan& plan, size_t base_copy);

// --ds-version rewrites native MoE version lines only: a UsageError for a universal or AutoEP ZeRO-3 step.
void check_ds_version_applies(const std::string& ds_version, const Manifest& m);

// The folder a restore of the plan writes: <output>/global_step<N>.
std::string restore_step_dir(const RestorePlan& plan);

// The plan as `pec-restore --plan` prints it (docs/pec.md, "Restore plan").
nlohmann::json restore_plan_to_json(const RestorePlan& plan);

}  // namespace ucpkit::pec
