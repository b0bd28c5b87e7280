// ucp-load's direct mode: a native DeepSpeed checkpoint as a "virtual universal
// checkpoint". The extract plan (lib/to_universal, through to_universal/direct.h: which fragment of which shard file holds which part of
// which TP slice) gives, in memory, the manifest ucp-union would write (without checksums) and the
// elements of every atomic tensor on demand, read straight from the source shards; the load path
// (UcpInfo plan, exchange, writers) is unchanged. Nothing is written but the target.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/tensor.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/detect.h"
#include "io/zip/zip_crc_check.h"
#include "reshard/model_info.h"
#include "reshard/universal_reader.h"
#include "to_universal/direct.h"

namespace ucpkit::reshard {

// Direct mode's input formats, registered by folder kind (formats::detect's name) from the
// file that reads them, like the union's runners and ucp-info's describers: the folder a direct input's
// data is read from, and its extract plan (its files opened with `open`). Registered here: DeepSpeed
// shards, and a ucp-extract work folder.
struct DirectReader {
  std::function<std::string(const std::string& input)> data_dir;
  std::function<to_universal::ExtractPlan(const std::string& input, const TorchLoadOptions& open)> plan;
  explicit operator bool() const { return static_cast<bool>(plan); }
};
// Returns true (for a namespace-scope initializer).
bool register_direct_reader(std::string_view kind, DirectReader reader);
// The reader registered for `kind`; empty (false) when direct mode does not read that kind.
DirectReader direct_reader(const formats::FolderKind& kind);

// Whether direct mode reads a folder of this kind (a reader is registered for it).
bool is_direct_input(const formats::FolderKind& kind);

// A DeepSpeed engine checkpoint of a transformers model, its module names the Hugging Face names: a native
// checkpoint direct mode reads with the model's config.json beside it (the HF Trainer's checkpoint-N, or
// ucp-load --format deepspeed of a Hugging Face folder).
bool is_transformers_named_checkpoint(const std::string& path);

// The folder a direct input's data is read from (global_stepN, or the work folder); throws Error
// naming `input` when its kind (formats::detect) is no direct input or it holds no shards.
std::string native_checkpoint_dir(const std::string& input, const formats::FolderKind& kind);

// The extract plan of a native checkpoint (or work folder; its files opened with `open`); refuses
// what direct mode cannot read.
to_universal::ExtractPlan direct_plan(const std::string& input, const formats::FolderKind& kind,
                                      const TorchLoadOptions& open = {});

// Direct mode's input (ucp-load's Prepared::source): the source's extract plan, its kind (where its
// data folder is), and whether the source files' zip CRC-32s are computed on the bytes the copy reads
// (DirectSource::keep_source_crcs) instead of when each file is opened.
struct DirectInput {
  to_universal::ExtractPlan plan;
  formats::FolderKind kind;
  bool fused_crc = false;
  // How the run opens the source's files: no CRC check at open when it is fused.
  TorchLoadOptions open() const {
    TorchLoadOptions o;
    o.crc_at_open = !fused_crc;
    return o;
  }
};

// What ucp-union would put in manifest.json and zero/optimizer_state.pt, in memory; model files are
// the source's own (ucp-union copies them byte for byte). `open`: how the optimizer state file is opened.
UniversalMeta direct_meta(const to_universal::ExtractPlan& plan, const TorchLoadOptions& open = {});

// Atomic tensors read from the source shards. Elements of a split parameter map to (TP rank,
// fragment, offset) by the same tp_slice rule the load plan uses, so a run of universal elements is
// one pread per fragment it crosses; replicated / averaged parameters (small: norms, biases) are
// joined once by ucp-union's own code and kept.
class DirectSource final : public AtomicSource {
 public:
  // `check_image`: check the module weights against the fp32 masters as they are read (master_image.h;
  // off under --no-verify). `open`: how the source files are opened (DirectInput::open).
  DirectSource(const to_universal::ExtractPlan& plan, const ModelInfo& model, bool check_image = true,
               const TorchLoadOptions& open = {});
  ~DirectSource() override;
  void read(int param, int state, int64_t a, int64_t n, float* dst) override;
  pickle::ValuePtr step(int param) override;
  void whole_crc(int param, int state, uint32_t crc) override;
  // `ucp-load --plan` on a native input: where every atomic tensor's elements lie in the source
  // (runs of file, byte offset, bytes, first universal element; adjacent runs merged) and totals.
  nlohmann::json source_json() const;
  // Where atomic elements [a, a + n) of (param, state) lie in the source files: emit(file index,
  // byte offset, bytes, element offset in [0, n)) per run, in element order. False (nothing
  // emitted) for a joined (replicated / averaged) parameter, which no single byte range holds.
  bool file_runs(int param, int state, int64_t a, int64_t n,
                 const std::function<void(int, uint64_t, uint64_t, int64_t)>& emit) const;
  // The source files' zip CRC-32 computed on the bytes as they are read (one process, unless
  // --no-verify): while on, every piece read from a shard is checksummed into the file's list;
  // check_source_crcs() then checks every record of every file in `paths` (the shards with their
  // pieces, the others read whole), reading only what no piece covered. Throws Error naming the
  // file and record on a mismatch. Returns the bytes read for the check.
  void keep_source_crcs(bool on) { keep_crcs_ = on; }
  uint64_t check_source_crcs(const std::vector<std::string>& paths, int threads);
  // Universal checksums computed on the way (--verify): {name: {state: "crc32 hex"}}.
  nlohmann::json checksums() const;
  // Compares the checksums computed here (under MPI: this rank's share) with a universal
  // checkpoint's manifest.json (or its folder); throws Error naming the first difference or a
  // parameter set that is not the source's. Returns how many were compared.
  size_t compare_with(const std::string& manifest_path) const;

 private:
  struct Piece {
    int64_t start = 0, len = 0;  // along the split dim of the (vocabulary-padded) universal tensor
    int t = 0;                   // source TP rank
    int64_t at = 0;              // offset along that dim inside the TP slice
  };
  struct Param {
    const to_universal::ParamPlan* plan = nullptr;
    enum Kind { Identity, Mapped, Joined } kind = Identity;
    int dim = 0;
    int64_t inner = 1, rows = 1;              // elements after `dim`; padded size of `dim`
    std::vector<Piece> pieces;                // sorted by start
    std::vector<int64_t> slice_rows;          // [t] size of `dim` in TP slice t
    std::vector<std::vector<int64_t>> prefix; // [t] element offset of each fragment in slice t (+ total)
    std::vector<std::vector<std::vector<Tensor>>> frags;  // [state][t][k] fragment views
    std::vector<std::vector<int>> files;      // [t][k] source file
  };
  void copy_slice(const Param& p, int state, int t, int64_t pos, int64_t n, float* dst);  // + the image check
  // `keep_crcs`: false for a read that only serves the image check (its bytes are read again for the copy).
  void copy_run(const Param& p, int state, int t, int64_t pos, int64_t n, float* dst, bool keep_crcs = true);
  void check_image(const Param& p, int t);  // TP slice t's fp32 master against the module weights
  // Calls emit(TP rank, position in its slice, count, offset in [a, a + n)) for the runs of a
  // Mapped or Identity parameter's elements [a, a + n).
  template <typename F>
  void for_each_slice_run(const Param& p, int64_t a, int64_t n, F&& emit) const;
  uint64_t file_offset(const Param& p, int state, int t, size_t k) const;  // byte offset of fragment k's element 0
  const float* joined(int param, int state);

  const to_universal::ExtractPlan& plan_;
  const ModelInfo& model_;
  // The model files' weights, checked against every fp32 master run read (a shard of another run).
  std::unique_ptr<to_universal::MasterImage> image_;
  std::vector<std::unique_ptr<std::once_flag[]>> image_once_;  // [param][TP rank]: checked on the first read
  int fp32_state_ = -1;
  std::unique_ptr<to_universal::FragmentReader> cache_;
  std::vector<Param> params_;
  std::vector<std::unique_ptr<std::once_flag>> joined_once_;
  std::vector<std::vector<float>> joined_;
  struct FilePieces {
    std::mutex mu;
    std::vector<KnownCrc> list;
  };
  bool keep_crcs_ = false;
  std::vector<std::unique_ptr<FilePieces>> pieces_;  // [source file]
  mutable std::mutex crc_mu_;
  std::map<std::pair<int, int>, uint32_t> crc_;
};

}  // namespace ucpkit::reshard
