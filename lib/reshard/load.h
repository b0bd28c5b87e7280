// The ucp-load driver: universal checkpoint (or a native one, read directly) -> the output format's
// checkpoint, one path for every format: prepare, plan, write into a staging folder, commit. What each
// format adds is its OutputWriter's (output_writer.h). Executed with TBB threads (and MPI ranks under
// mpirun), written atomically.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/detect.h"
#include "reshard/load_plan.h"
#include "reshard/output_format.h"
#include "reshard/target_defaults.h"
#include "reshard/templates.h"
#include "reshard/ucp_info.h"
#include "core/reporter.h"

namespace ucpkit::reshard {

struct LoadOptions {
  std::string input, output;
  TargetLayout target;                   // bf16_optimizer is resolved from `optimizer`
  TargetGiven given;                     // fields of `target` the command line gave; the rest are the source's
  OptimizerKind optimizer = OptimizerKind::Auto;
  OutputFormat format = OutputFormat::DeepSpeed;
  Reporter reporter;                     // warnings, details, progress (tools: tool::console_reporter())
  int threads = 0;                       // 0: all cores
  bool verify = true;                    // check atomic tensors against manifest checksums
  bool overwrite = false;
  bool sync = true;                      // flush the output to stable storage before renaming it (--no-sync: off)
  int64_t vocab_multiple = 0;            // 0: from args / inferred from the source padding
  uint64_t shard_bytes = 5ull << 30;     // safetensors shard size limit
  ExchangeMode exchange = ExchangeMode::Auto;
  uint64_t batch_bytes = 256ull << 20;   // exchange: atomic bytes per batch (bounds memory per rank)
  // Direct mode (input is a native checkpoint): compute the universal checksums on the way and
  // compare them with this universal checkpoint's manifest.json (or folder); "" = none.
  std::string verify_against;
  // DeepSpeed output: when `output` exists and its layout record (layout_record.h) is what this run
  // would write, write nothing (LoadSummary::reused); otherwise convert (replacing it needs overwrite).
  bool reuse_output = false;
  // --template (--format deepspeed from a Megatron-Core torch_dist input, one pass): the
  // Megatron-DeepSpeed universal folder giving names, patterns and model files (torch_dist_source.h);
  // --model-map: the map for a template in Megatron-DeepSpeed names ("": the shipped ones).
  std::string template_dir, model_map;
  // --megatron-version (--format torch_dist): the Megatron-Core line the output is for ("0.16", "0.19.0";
  // "": the source's form), which decides where the common state goes (torch_dist_output.cpp).
  std::string megatron_version;
  // --audit (a writer whose takes_audit() holds: --format hf): the JSON audit of the conversion written
  // here once the output is in place (docs/hf.md "Audit"); "" = none.
  std::string audit;
  // --hf-experts fused (--format hf): an MoE layer's experts as one tensor per projection
  // (gate_up_proj [E, 2I, H], down_proj [E, H, I]: transformers 5's in-memory layout); false: per expert,
  // as save_pretrained writes them.
  bool fused_experts = false;
};

struct LoadSummary {
  std::string output;
  OutputFormat format = OutputFormat::DeepSpeed;
  size_t params = 0, files_written = 0;
  uint64_t bytes_read = 0;      // atomic bytes read from files (files mode: copied into target files,
                                // each DP partition once; exchange mode: each atomic tensor once)
  bool exchange = false;        // exchange mode used
  size_t batches = 0;           // exchange batches
  nlohmann::json phase_seconds = nlohmann::json::object();  // exchange: seconds per phase (rank 0)
  // Exchange: sum over fill steps of the busiest rank's bytes over the same with every step split
  // evenly (1.0: no rank waits for another in the fill).
  double fill_balance = 0;
  uint64_t bytes_verified = 0;  // atomic bytes read for checksum verification (each tensor once)
  bool direct = false;          // read a native checkpoint directly (no universal checkpoint)
  size_t checksums_compared = 0;  // direct mode with verify_against
  uint64_t bytes_written = 0, peak_rss_bytes = 0;
  double seconds = 0;
  int ranks = 1, threads = 1;
  nlohmann::json from_source = nlohmann::json::object();  // target values taken from the source (target_defaults.h)
  nlohmann::json target = nlohmann::json::object();       // the layout written: the layout record
  bool reused = false;          // reuse_output: the output already held this layout; nothing written
  size_t buffers = 0;           // model tensors without optimizer state written (own dtype)
  size_t items = 0;             // a DCP source's bytes entries written back verbatim (--format dcp)
  // What the input held and the output does not (a DCP's non-tensor items, written by --format dcp only,
  // and the tensors ucp-union could not place), said on stderr as well.
  std::vector<std::string> not_carried;
  nlohmann::json to_json() const;
};

// What the run reads its atomic tensors from, exactly one of: a universal folder read as it is, a native
// checkpoint read directly (its extract plan), a torch_dist save read in one pass (--template).
struct UniversalInput {};
struct DirectInput;     // direct mode: the source's extract plan and kind (direct_source.h)
struct TorchDistInput;  // a torch_dist input with --template (torch_dist_source.h)
using InputSource =
    std::variant<UniversalInput, std::shared_ptr<const DirectInput>, std::shared_ptr<const TorchDistInput>>;

// What an output writer that reads its input itself decided in prepare, for its write
// (OutputWriter::reads_model, output_writer.h); each such writer derives its own.
struct WriterPlan {
  virtual ~WriterPlan() = default;
};

// What the run reads once and every later step shares: the model description, the target plan (what
// to write: the layout with its optimizer flavour resolved), the source's parsed templates and the
// native-MoE line written. Nothing written yet.
struct Prepared {
  ModelInfo model;
  UcpInfo plan;
  std::shared_ptr<const Templates> templates;            // DeepSpeed output: parsed once, shared by every writer
  const formats::deepspeed::VersionLine* moe_line = nullptr;  // native MoE: the line written (target_moe_line)
  InputSource source;
  nlohmann::json from_source = nlohmann::json::object();  // target values taken from the source
  nlohmann::json record;                // DeepSpeed output: its layout record (ucpkit_layout.json)
  std::shared_ptr<const WriterPlan> output;  // a writer that reads its input itself: its plan (else null)
  // The source when it is of that kind, else null.
  const DirectInput* direct() const;
  const TorchDistInput* torch_dist() const;
  // How the run opens the source's files (direct mode with the fused CRC-32: no check at open).
  TorchLoadOptions open() const;
};
Prepared prepare(const LoadOptions& options);
// The same for an input whose kind the caller has read (formats::detect). `fused_crc`: a direct
// input's zip CRC-32s are computed on the bytes the copy reads, not when its files are opened
// (DirectInput::fused_crc).
Prepared prepare(const LoadOptions& options, const formats::FolderKind& kind, bool fused_crc = false);

// `ucp-load --plan`: the output writer's plan (output_writer.h; DeepSpeed: the UcpInfo as JSON, with
// `from_source`, the layout `record`, this rank's LoadPlan (`load`), and the exchange's plan when it would be used).
nlohmann::json plan_json(const LoadOptions& options);

// Writes the target checkpoint under options.output (built under a temporary name, then renamed).
LoadSummary run_load(const LoadOptions& options);

}  // namespace ucpkit::reshard
