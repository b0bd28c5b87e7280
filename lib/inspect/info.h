// ucp-info: what a checkpoint folder holds, read without converting it or writing anything. Any
// folder the tools read: a native DeepSpeed / Megatron-DeepSpeed checkpoint (a global_stepN folder or
// its parent with `latest`), a ucp-extract work folder, a universal checkpoint (manifest.json), a PEC
// store. The facts come from the readers the tools use (formats::deepspeed::discover, to_universal::plan_checkpoint,
// reshard::model_info_from, pec::Store / plan_restore) and so do the checks: each reader's refusal is one
// failed check with its one-line error.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/detect.h"

namespace ucpkit::inspect {

struct Check {
  enum class Status { ok, failed, skipped };
  std::string name;   // "files", "plan", "patterns", "model_info", "checksums", "store", "manifests", ...
  std::string what;   // what it covers, one short line
  Status status = Status::skipped;
  std::string error;  // the reader's one-line error when failed
};
const char* status_name(Check::Status status);  // "ok", "failed", "skipped"

struct ParallelLayout {
  int tp = 1, pp = 1, dp = 1, ep = 1;
  std::optional<int> etp;         // Megatron-Core MoE: expert tensor parallelism (args.expert_tensor_parallel_size)
  std::optional<int> zero_stage;  // not recorded: BF16_Optimizer shards
  std::string optimizer;          // "zero" (DeepSpeedZeroOptimizer, stage 1/2/3) or "bf16_optimizer"
  bool pipeline = false;          // PipelineModule layer files
};

struct FileKindSize {
  size_t files = 0;
  uint64_t bytes = 0;
};

struct InfoOptions {
  // Checksums too: the zip CRC-32 of every record of every torch file read (native, work folder),
  // each state file's crc32 against manifest.json (universal), every object's digest (PEC store).
  bool verify = true;
};

struct CheckpointInfo {
  std::string input;                  // as given, ending in the folder's name ("ck/" -> "ck", "." -> its absolute path)
  formats::FolderKind kind;            // formats::detect: the JSON's "kind" is kind.format
  std::string dir;                    // the folder read: global_stepN, the work / universal folder, the store
  std::string tag;                    // global_stepN; "release" for a torch_dist release save ("" unknown)
  std::optional<int64_t> step;
  std::string ds_version;             // DeepSpeed release recorded in the files ("" unknown)
  std::string ds_line;                // DeepSpeed version line (native MoE save path), "" unknown
  std::optional<ParallelLayout> layout;
  std::optional<size_t> tensors;      // atomic parameters (universal names)
  std::optional<int64_t> parameters;  // elements of all atomic parameters (vocabulary padding cut)
  std::optional<int64_t> expert_parameters;
  std::string experts_kind;           // "native", "autoep" or "" (no MoE)
  std::vector<int> experts_per_layer; // per MoE layer
  std::map<std::string, std::string> dtypes;  // "model" (module weights), "optimizer" (master and states)
  std::vector<std::string> states;    // optimizer states of every parameter: fp32, exp_avg, exp_avg_sq
  uint64_t bytes = 0;                 // on disk, every regular file under dir
  size_t files = 0;
  std::map<std::string, FileKindSize> by_kind;
  nlohmann::json store;               // PEC store: committed steps and what each saved (null otherwise)
  nlohmann::json buffers;             // universal: [{name, dtype, shape}] of its buffers (null: none)
  nlohmann::json dcp;                 // DCP / torch_dist: folder form, class-path era, world size, entries,
                                      // chunks, optimizer state (null otherwise; docs/ucp-info.md)
  nlohmann::json hf;                  // Hugging Face folder: architectures, model_type, family, map (null otherwise)
  std::vector<Check> checks;

  bool ok() const;                    // every check that ran held
  const Check* first_failure() const;
  nlohmann::json to_json() const;     // keys: docs/ucp-info.md
  std::string text() const;           // the human summary ucp-info prints
};

// Describes `path`. Throws Error only when it is no folder the tools read; a reader's refusal is a
// failed check (ok() false), and the facts read before it are kept.
CheckpointInfo describe(const std::string& path, const InfoOptions& options);

// How ucp-info describes a folder of one format (formats::detect's kind.format): fills `info` from the
// format's readers. Each format registers its own (info.cpp for those of today); returns true for a
// namespace-scope initializer.
using Describer = std::function<void(CheckpointInfo& info, const InfoOptions& options)>;
bool register_describer(const std::string& format, Describer describe);

}  // namespace ucpkit::inspect
