// ucp-union --to-names megatron-core | megatron-deepspeed: a universal folder rewritten into the other
// naming (docs/megatron-core-mapping.md). Pure re-indexing, one parameter at a time: renames and row
// permutations (formats/megatron_core/deepspeed_map), every bit kept.
//  * megatron-core: a Megatron-DeepSpeed-named universal folder (ucp-union of a DeepSpeed checkpoint) ->
//    Megatron-Core names (docs/formats-megatron-core.md "Universal names"); the Megatron-DeepSpeed facts a
//    way back needs (the original manifest entries, patterns, model-file copies under megatron_deepspeed/)
//    are recorded in manifest.json source.megatron_core_names.
//  * megatron-deepspeed: such a folder -> the Megatron-DeepSpeed-named universal folder again, which
//    ucp-load --format deepspeed reads (values from the Megatron-Core-named state files; everything else
//    from the record). A Megatron-Core-named folder without the record (ucp-union of a torch_dist save)
//    takes the record from --template (the Megatron-DeepSpeed model files cannot be synthesized).
//    The Megatron-Core-named folder also gets megatron_core/common_state.pt (Megatron-DeepSpeed's args as
//    Megatron-Core's, formats/megatron_core/deepspeed_common_state) for ucp-load --format torch_dist.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/reporter.h"
#include "formats/megatron_core/deepspeed_map.h"
#include "formats/universal/manifest.h"
#include "io/pickle/value.h"
#include "io/tensor.h"
#include "to_universal/convert.h"

namespace ucpkit::to_universal {

enum class NamesTarget { MegatronCore, MegatronDeepSpeed };

struct NamesOptions {
  NamesTarget target = NamesTarget::MegatronCore;
  std::string map_file;  // --model-map; empty: the shipped family maps, the family detected
  // --template (megatron-deepspeed only): a universal folder giving the Megatron-DeepSpeed facts (names,
  // patterns, model files, DeepSpeed optimizer state): the Megatron-DeepSpeed one, or its --to-names
  // megatron-core folder; for inputs without the record (ucp-union of a torch_dist save)
  std::string template_dir;
  int threads = 0;
  bool overwrite = false;
  bool sync = true;
  // --to-names megatron-core: vocabulary tensors get Megatron's padded rows (zeros; args.padded_vocab_size), as a
  // torch_dist save holds them. Off for a comparison with a side that holds the vocabulary rows alone (ucp-diff).
  bool pad_vocab = true;
  Reporter reporter;
  std::string* family = nullptr;  // when set: receives "<family> (<map origin>)" of the map used
};

// Whether a universal manifest's source (manifest.json "source") is a Megatron-Core-named folder made by
// --to-names megatron-core (ucp-load --format deepspeed cannot read it; ucp-info describes it from the
// manifest alone).
bool is_megatron_core_named(const formats::universal::UniversalSource& source);

// The Megatron-DeepSpeed side of a Megatron-Core-named manifest `m` (read from `mfile`): what
// --to-names megatron-deepspeed writes, planned from the manifests alone (the input's record, or
// --template's record or names); ucp-load --input <torch_dist> --template reads a torch_dist save through
// it in one pass (reshard/torch_dist_source.h).
struct DeepSpeedView {
  formats::universal::UniversalManifest manifest;  // Megatron-DeepSpeed names, state files named, no checksums
  std::vector<size_t> from;                        // per manifest param: its index in `m`
  std::vector<char> regroup_qkv;                   // per manifest param: QKV rows regrouped
  std::optional<formats::megatron_core::QkvShape> qkv;
  std::vector<std::string> model_files;  // resolved paths of manifest.model_files
  std::string optimizer_state;           // resolved path of DeepSpeed's zero/optimizer_state.pt
  std::string template_dir;              // --template ("" without)
  bool template_named_ds = false;        // the template has Megatron-DeepSpeed names (its folders are theirs)
  std::string family;                    // "<family> (<map origin>)"
};
// Throws Error naming the manifest or template and what is missing or malformed. `fresh_template`: `template_dir`
// is a fresh run's (hf_megatron_deepspeed.h), the only template a Hugging Face import takes.
DeepSpeedView megatron_deepspeed_view(const formats::universal::UniversalManifest& m, const std::string& mfile,
                                      const std::string& template_dir, const std::string& map_file,
                                      bool fresh_template = false);
// Parameter `i` of `v` from its Megatron-Core value `t` (fp32): QKV rows regrouped, Megatron's padded
// vocabulary rows cut (into storage of its own when `own_storage`, else a view of the leading rows);
// shape checked (Error naming `where`).
Tensor to_deepspeed_value(Tensor t, const DeepSpeedView& v, size_t i, const std::string& where, bool own_storage = true);
// to_deepspeed_value as row runs of a source value of `shape` (rows: dim 0; a 0-d value one row): its
// QKV regroup and vocabulary cut, for readers that copy element ranges instead of tensors. Throws Error
// as to_deepspeed_value does.
std::vector<formats::megatron_core::RowRun> deepspeed_value_rows(std::vector<int64_t> shape, const DeepSpeedView& v,
                                                                 size_t i, const std::string& where);

// The Megatron-Core side of a Megatron-DeepSpeed-named manifest `m` (read from `mfile`; a universal
// folder's, or direct mode's in-memory one of a DeepSpeed checkpoint): what --to-names megatron-core
// writes, planned from the manifest and the first model file (`model_file`, resolved), with the common
// state ucp-load --format torch_dist writes (`optimizer_state`: the universal zero/optimizer_state.pt root;
// `step`: a parameter's step value or null). ucp-load --format torch_dist reads a DeepSpeed checkpoint or
// its universal folder through it in one pass (reshard/torch_dist_output.cpp). Throws Error naming the
// manifest, the model file or the map.
struct MegatronCoreView {
  formats::universal::UniversalManifest manifest;  // Megatron-Core names, as --to-names megatron-core writes (no checksums)
  std::vector<size_t> from;                        // per manifest param: its index in `m`
  std::vector<char> regroup_qkv;                   // per manifest param: [Q; K; V] -> per-group rows
  std::vector<int64_t> pad_rows;                   // per manifest param: Megatron's padded vocabulary rows added
  std::optional<formats::megatron_core::QkvShape> qkv;
  pickle::ValuePtr common;                         // the Megatron-Core common state (args, iteration, param_groups)
  std::string family;                              // "<family> (<map origin>)"
};
MegatronCoreView megatron_core_view(const formats::universal::UniversalManifest& m, const std::string& mfile,
                                    const std::string& model_file, const pickle::ValuePtr& optimizer_state,
                                    const pickle::ValuePtr& step, const std::string& map_file);
// Parameter `i` of `v` from its Megatron-DeepSpeed value `t`: QKV rows regrouped, padded vocabulary rows
// added (zeros); shape checked (Error naming `where`).
Tensor to_megatron_core_value(Tensor t, const MegatronCoreView& v, size_t i, const std::string& where);

// Rewrites universal folder `input` into `output` (staged, committed atomically). Throws Error naming
// the file or parameter on any mismatch (nothing left at `output`).
RunSummary rename_universal(const std::string& input, const std::string& output, const NamesOptions& options);

}  // namespace ucpkit::to_universal
