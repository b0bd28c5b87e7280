// ucp-load of a checkpoint into its own format: rewritten whole by the format's own code,
// every item the source holds kept (tensors of any dtype with their keys, non-tensor items), instead
// of through the universal form, which holds parameters with their optimizer states only. A format
// registers its rewrite for the folder kind it reads (formats::FolderKind::name()) and the output
// format it writes; ucp-load asks whole_rewrite_for before it converts anything.
#pragma once
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "formats/detect.h"
#include "reshard/load.h"

namespace ucpkit::reshard {

struct WholeRewrite {
  // --plan and --dry-run: what would be written (read-only).
  std::function<nlohmann::json(const LoadOptions&)> plan;
  // Writes options.input into the empty staging folder `staged` (its flush and rename are the
  // caller's); returns what it wrote: `tensors`, `bytes_entries`, `files_written`, `bytes_read`,
  // `bytes_written`, `target`, and what it changed (`converted`).
  std::function<nlohmann::json(const LoadOptions&, const std::string& staged)> write;
};

// Returns true, for a namespace-scope initializer.
bool register_whole_rewrite(std::string_view input_kind, OutputFormat format, WholeRewrite rewrite);
// The rewrite of `kind` (by its name: a flavour has its own) into `format`; empty (no `write`) when none.
WholeRewrite whole_rewrite_for(const formats::FolderKind& kind, OutputFormat format);

// Runs `rw` under MPI as run_load writes (rank 0 writes into a staging folder that replaces
// options.output at the end, every rank waits); the summary's fields (`tool`, `output`, `format`,
// `route: "whole"`, the writer's counts, `seconds`, `peak_rss_bytes`, `mpi_ranks`) on rank 0.
nlohmann::json run_whole_rewrite(const WholeRewrite& rw, const LoadOptions& options);

}  // namespace ucpkit::reshard
