// ucp-load's output formats as plug-ins: one OutputWriter per format, registered from the
// format's own file (deepspeed_output.cpp, safetensors_writer.cpp, dcp_output.cpp, torch_dist_output.cpp)
// by its OutputFormat. run_load and plan_json (load.cpp) run one path for every format and ask the
// writer for the format's steps: its part of prepare, its --plan JSON, its write, its summary facts.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "parallel/mpi_session.h"
#include "reshard/exchange.h"
#include "reshard/laid_out_file.h"
#include "reshard/load.h"
#include "reshard/load_plan.h"
#include "reshard/universal_reader.h"

namespace ucpkit::reshard {

class DirectSource;

// One rank's execution of its LoadPlan: what the steps share, and what they add up (summed over the
// ranks into the LoadSummary).
struct LoadRun {
  const LoadOptions& options;
  const Prepared& prep;
  const LoadPlan& plan;
  parallel::MpiSession& mpi;
  parallel::RankFailure& failed;  // guard() the work of each step, settle() at its end on every rank
  int threads;
  UniversalReader& reader;
  WriteOptions write;              // how each target file is written
  DirectSource* source = nullptr;  // direct mode
  std::atomic<uint64_t> written{0}, files{0};
  uint64_t read = 0;               // bytes a writer read itself (not through `reader`)
  ExchangeStats xstats{};
  size_t batches = 0, compared = 0;
  uint64_t crc_bytes_read = 0;
};

class OutputWriter {
 public:
  virtual ~OutputWriter() = default;
  // Whether the run reads the input as a model (Prepared::model and ::source: a universal folder, a
  // native checkpoint directly, a torch_dist save with --template). When not, prepare() reads the input
  // itself and keeps what it decided in Prepared::output (torch_dist output: the Megatron-Core view).
  virtual bool reads_model() const { return true; }
  // Whether this run reads its input as a model: reads_model(), or, for a writer that reads its inputs itself,
  // the inputs it reads as a model all the same (--format hf: a DeepSpeed checkpoint already in Hugging Face names).
  virtual bool reads_model_of(const LoadOptions&) const { return reads_model(); }
  // Whether prepare() reads the input in Megatron-Core names (open_megatron_core_input), so an input kind with a
  // registered Megatron-Core reader (a Hugging Face folder) is read in one pass instead of converted first.
  virtual bool reads_megatron_core_input() const { return false; }
  // Whether --template (a torch_dist input through its Megatron-DeepSpeed view) can be written.
  virtual bool takes_template() const { return false; }
  // Which of ucp-load's options the format uses; the tool refuses the others by name, naming the
  // formats that do use them (tool/ucp_load.cpp).
  // --partition-method and --layer-types (pipeline stages).
  virtual bool takes_pipeline_options() const { return false; }
  // --exchange on.
  virtual bool takes_exchange() const { return false; }
  // --device cuda (the partition loaded to a GPU).
  virtual bool takes_device() const { return false; }
  // --model-map without --template (a Megatron-DeepSpeed input's names written as the format's).
  virtual bool takes_model_map() const { return false; }
  // --tp, --pp, --dp, --zero-stage and --ep; when not, why not (" (one set of unsharded weights)").
  virtual bool takes_layout_options() const { return true; }
  virtual std::string why_no_layout() const { return ""; }
  // --world-size.
  virtual bool takes_world_size() const { return true; }
  // --etp (expert tensor parallelism, a Megatron-Core layout dimension) and --megatron-version.
  virtual bool takes_megatron_options() const { return false; }
  // --audit FILE (a record of every tensor written, its digest, sources and transform).
  virtual bool takes_audit() const { return false; }
  // --hf-experts (experts per expert or fused into one tensor per layer).
  virtual bool takes_experts_layout() const { return false; }
  // Whether the format is written from the source's model files (DeepSpeed's mp_rank files), which a
  // DCP or torch_dist input has not; writes_from_tensors() is the others (for output_formats_that).
  virtual bool needs_model_files() const { return false; }
  bool writes_from_tensors() const { return !needs_model_files(); }
  // Whether files mode (no exchange) writes the output as FileJobs, one per model file or optimizer
  // shard, shared among the ranks (load_plan.h).
  virtual bool writes_file_jobs() const { return false; }
  // Whether one process writes the format (mpirun -np > 1 refused).
  virtual bool one_process() const { return false; }
  // Whether the staging folder's notes (a stale folder removed) are warnings rather than details.
  virtual bool staging_notes_warn() const { return false; }
  // The model read (reads_model): refuses what the format cannot be written from.
  virtual void check_model(const LoadOptions&, const ModelInfo&) const {}
  // The format's part of prepare: with reads_model, once the model is read and p.plan.target resolved;
  // otherwise all of it.
  virtual void prepare(const LoadOptions& options, Prepared& p) const = 0;
  // What a run (not a plan) says once prepared, before its staging folder is made.
  virtual void announce(const LoadOptions&, const Prepared&) const {}
  // `ucp-load --plan` / `--dry-run`: what would be written; nothing is.
  virtual nlohmann::json plan_json(const LoadOptions& options, const Prepared& p) const = 0;
  // Writes this rank's part of the output into the staging folder `staged` (its work guarded by
  // r.failed; the caller settles).
  virtual void write(LoadRun& r, const std::string& staged) const = 0;
  // The format's facts added to the summary (the counts summed over the ranks are already in).
  virtual void summarize(const LoadRun&, LoadSummary&) const {}
};

// Registers the writer of `format`; returns true (for a namespace-scope initializer in the format's file).
bool register_output_writer(OutputFormat format, std::shared_ptr<const OutputWriter> writer);
// The writer registered for `format`; Error naming it when none is (a build without that format's file).
const OutputWriter& output_writer(OutputFormat format);
// The names of the formats whose writer answers `has` with true ("deepspeed"; ", " between several).
std::string output_formats_that(bool (OutputWriter::*has)() const);

// The atomic tensors of a direct or torch_dist input (null for a universal folder), set on `reader`,
// for a plan: it reads steps, no fp32 value, so the model files' weights are not indexed.
std::unique_ptr<AtomicSource> open_plan_source(const Prepared& p, UniversalReader& reader);

}  // namespace ucpkit::reshard
