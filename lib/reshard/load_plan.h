// ucp-load's plan for one MPI rank, decided before anything is read or written: the target layout
// with the optimizer flavour resolved, how atomic tensors reach the target files (files or exchange
// mode), which atomic tensors this rank verifies first, and (files mode) which rank writes which
// target file, by name. Plain data computed without I/O, printed by `--plan` (`load`); load.cpp
// executes it. The exchange's own plan (who writes and reads what there) is exchange_plan.h's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/deepspeed/version_line.h"
#include "reshard/model_info.h"
#include "reshard/output_format.h"
#include "reshard/ucp_info.h"

namespace ucpkit::reshard {

enum class OptimizerKind { Auto, Zero, Bf16 };
// How atomic tensors reach the target files. Files: every rank reads what its own files need (MPI
// ranks split the files). Exchange: every atomic tensor is read once in total by its owner rank and
// the slices are exchanged over MPI batch by batch (exchange.h). Auto: exchange under mpirun -np > 1.
enum class ExchangeMode { Auto, Files, Exchange };

// `target` with bf16_optimizer set: as `kind` forces it, or (Auto) BF16_Optimizer shards where
// DeepSpeed would pick them: bf16 with ZeRO 0, or ZeRO 1 when the source used them.
TargetLayout resolve_target(const TargetLayout& target, OptimizerKind kind, const ModelInfo& model);

// Whether the exchange is used: a format whose writer takes it (OutputWriter::takes_exchange), asked
// for, or Auto with more than one rank.
bool uses_exchange(OutputFormat format, ExchangeMode mode, int ranks);

// Files mode's unit of work: the model files of one model-parallel rank (mp_rank_XX, its layer files
// and expert files), one ZeRO-3 model file, or one optimizer file, of (DP rank, MP rank).
struct FileJob {
  enum Kind { Model, Zero3Model, Optim } kind = Model;
  int mp = 0, dp = 0;
  uint64_t bytes = 0;              // estimated output bytes (for the split across MPI ranks)
  std::vector<std::string> files;  // the base names it writes (files_of), in the writer's order
};
const char* file_job_kind_name(FileJob::Kind k);  // "model" | "zero3_model" | "optim"

// Every job of `plan` (DeepSpeed output), the same list on every rank: per model-parallel rank its
// model job (ZeRO 0-2), then per DP rank its ZeRO-3 model job and its optimizer job; each with the
// files it writes for the native-MoE version line `line` (nullptr: none).
std::vector<FileJob> file_jobs(const ModelInfo& model, const UcpInfo& plan, const formats::deepspeed::VersionLine* line);

// The base names job `j` writes, from the target's file facts (`files`: UcpInfo::files) and the
// native-MoE version line written (`line`: target_moe_line, nullptr otherwise): file_names.h's
// expected_files, the one list of the files a layout has.
std::vector<std::string> files_of(const formats::deepspeed::TargetFiles& files, const FileJob& j,
                                  const formats::deepspeed::VersionLine* line);

// [param] 1 for the atomic tensors `rank` of `ranks` verifies (each tensor by one rank, balanced by
// the bytes of its states).
std::vector<char> verify_mask(const ModelInfo& model, int ranks, int rank);

// What one rank does.
struct LoadPlan {
  OutputFormat format = OutputFormat::DeepSpeed;
  bool direct = false;        // the input is a native checkpoint (atomic tensors from its shards)
  bool verify = false;        // universal checksums computed (universal input: unless --no-verify;
                              // direct: only with --verify-against)
  bool exchange = false;      // exchange mode (it verifies each tensor while its owner reads it)
  bool verify_first = false;  // files mode with verify: verify_mask's tensors before any writing
  std::vector<char> verify_mask;
  std::vector<FileJob> jobs;     // files mode, DeepSpeed output: every job
  std::vector<int> job_ranks;    // which rank writes each job (balanced by bytes)
  std::vector<size_t> my_jobs;   // indices into jobs this rank writes, largest first
  // The files this rank writes in files mode (its jobs' files): the count ucp-load reports.
  size_t my_files() const;
  nlohmann::json to_json(const ModelInfo& model) const;
};

struct LoadOptions;  // load.h
// `line`: the native-MoE version line written (target_moe_line; nullptr otherwise). `torch_dist`: the
// input is a torch_dist save read in one pass (exchange mode, nothing to verify against).
LoadPlan plan_load(const LoadOptions& options, const ModelInfo& model, const UcpInfo& plan,
                   const formats::deepspeed::VersionLine* line, bool direct, int ranks, int rank,
                   bool torch_dist = false);

}  // namespace ucpkit::reshard
