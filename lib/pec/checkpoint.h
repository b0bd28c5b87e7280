// What PEC sees of a training checkpoint: the non-expert files and, per (MoE layer, global expert),
// the bytes that make up that expert. Three layouts:
//  * universal: every expert parameter is its own zero/<param>/ folder, named by global expert id;
//  * native DeepSpeed MoE: layer_<L>_expert_<E>_mp_rank_XX_model_states.pt files, plus each expert's
//    fragments (fp32 master, exp_avg, exp_avg_sq) inside [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt,
//    located through param_slice_mappings (LOCAL expert names) and the rank topology. Those optimizer
//    files are stored with every expert fragment zeroed and get the fragments patched back on restore.
//    DeepSpeed AutoEP under ZeRO-1/2 is this layout too (layer_<L>_expert_<G> files plus the rows of the
//    fused w1/w2/w3 fragments, formats/deepspeed/autoep_slices.h);
//  * DeepSpeed AutoEP under ZeRO-3 ("deepspeed-autoep-zero3"): no expert files; each expert is its rows
//    of the fused weights inside every rank's ZeRO-3 sub-group partitions (pec/autoep_zero3.h).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/zip/zip_directory.h"
#include "pec/policy.h"
#include "pec/source_layout.h"

namespace ucpkit {
class MappedFile;
class Tensor;
}

namespace ucpkit::pec {

// A byte range inside one record (`record` is the full zip entry name, e.g. "arch/data/3").
struct ByteRange {
  std::string record;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One piece of an expert: a whole file (ranges empty) or byte ranges inside a shared file.
struct ExpertPart {
  std::string path;  // relative to the checkpoint step folder
  std::vector<ByteRange> ranges;
  uint64_t bytes = 0;
};

// A non-expert shared file stored with every expert range cut out: the file's size and the cut
// (absolute offset, length) pairs, sorted and disjoint: the ranges restore fills. The manifest's
// "cut" entry, {"file_size": n, "cut": [[offset, length], ...]}.
struct CutList {
  uint64_t file_size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> cut;
};

struct OpenOptions {
  int ep_size = 0;                  // 0: infer
  bool data_before_expert = false;  // use_data_before_expert_parallel_ rank order
};

struct SourceCheckpoint {
  SourceLayout layout = SourceLayout::DeepSpeedMoe;
  std::string root;    // folder holding the files (global_stepN/ or the universal folder)
  std::string tag;     // its name
  std::string pointer;  // the `latest` / `latest_universal` file that named the tag ("" when given the tag folder)
  MoeShape shape;
  std::vector<std::string> non_expert_files;  // relative paths, sorted
  std::map<std::string, std::vector<ByteRange>> expert_ranges;  // shared file -> all expert ranges in it
  std::map<std::pair<int, int>, std::vector<ExpertPart>> experts;
  std::map<std::string, uint64_t> file_sizes;
  uint64_t expert_bytes_total = 0, non_expert_bytes_total = 0;

  uint64_t expert_bytes(int moe_layer, int expert) const;
  // Bytes the store receives for a non-expert file: its size minus the expert ranges cut out of it.
  uint64_t stored_bytes(const std::string& rel) const;
  uint64_t total_bytes() const { return expert_bytes_total + non_expert_bytes_total; }
};

// Accepts a folder with `latest` (or `latest_universal`), a global_stepN folder, or a universal
// folder (with zero/), relative or absolute (`root` is then absolute). Throws Error when no expert can
// be found.
// Every torch file stored whole must be a complete zip (directory present, records inside the file):
// a truncated file is refused (Error naming it) before anything is stored.
SourceCheckpoint open_checkpoint(const std::string& path, const OpenOptions& options);

// Bytes to store: a whole mapped file (zero-copy) or an assembled buffer.
struct Blob {
  std::shared_ptr<const MappedFile> file;
  std::vector<uint8_t> owned;
  std::span<const uint8_t> bytes() const;
};

// Where the bytes of one stored item come from: byte ranges (absolute offset, length) of one source
// file, concatenated. pec-save reads them with pread into reused buffers (no page faults on a
// mapping, no copy into a fresh buffer; docs/pec.md, Figures).
struct SourceSegments {
  std::string path;  // absolute or relative to the working folder
  std::vector<std::pair<uint64_t, uint64_t>> segments;
  uint64_t size = 0;  // sum of the lengths
};
// The bytes read_non_expert returns, as segments (`cut` as there).
SourceSegments non_expert_segments(const SourceCheckpoint& c, const std::string& rel, std::optional<CutList>& cut);
// The bytes read_expert_part returns, as segments.
SourceSegments expert_part_segments(const SourceCheckpoint& c, const ExpertPart& part);

// Reads a non-expert file as stored. For shared files every expert range is cut out and `cut` gets
// the ranges restore fills; for the others it is empty.
Blob read_non_expert(const SourceCheckpoint& c, const std::string& rel, std::optional<CutList>& cut);
// Reads one part of an expert: the file, or its ranges concatenated.
Blob read_expert_part(const SourceCheckpoint& c, const ExpertPart& part);

// Byte ranges of elements [elem, elem + numel) of each tensor in `tensors` (partitions that follow one
// layout: fp32, exp_avg, exp_avg_sq, ...), appended to `out`; each tensor's record is
// "<prefix>data/<storage key>" in `records`. Throws Error naming `path` when it runs past its record.
void add_element_ranges(const std::vector<const Tensor*>& tensors, const std::map<std::string, ZipRecord>& records,
                        const std::string& prefix, int64_t elem, int64_t numel, const std::string& path,
                        const std::string& name, std::vector<ByteRange>& out);

// The manifest's forms: ranges [[record, offset, length], ...]; a cut list as CutList says. A
// malformed entry is an Error naming `name`.
nlohmann::json ranges_to_json(const std::vector<ByteRange>& r);
std::vector<ByteRange> ranges_from_json(const nlohmann::json& j, const std::string& name);
nlohmann::json cut_to_json(const CutList& c);
CutList cut_from_json(const nlohmann::json& j, const std::string& name);

}  // namespace ucpkit::pec
