// The input of the formats written from Megatron-Core names (--format torch_dist, --format hf): a
// Megatron-Core-named universal folder (ucp-union of a torch_dist save, or --to-names megatron-core) with
// its recorded common state, or a DeepSpeed / Megatron-DeepSpeed checkpoint (direct mode) or its
// universal folder read through the Megatron-Core view (to_universal::MegatronCoreView) in one pass.
// Either way: the Megatron-Core-named manifest, the Megatron-Core common state (args, iteration,
// param_groups) and each parameter state's value, whole, on request.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/detect.h"
#include "formats/universal/manifest.h"
#include "io/dtype.h"
#include "io/pickle/value.h"
#include "io/tensor.h"
#include "reshard/load.h"

namespace ucpkit::reshard {

struct ForwardInput;  // a DeepSpeed input read through the Megatron-Core view (megatron_core_input.cpp)

inline constexpr const char* kMegatronCoreCommonStateFile = "megatron_core/common_state.pt";  // to_universal/from_torch_dist.h
inline constexpr const char* kMegatronCoreObjectsFile = "megatron_core/objects.pt";

struct MegatronCoreInput {
  std::shared_ptr<ForwardInput> forward;  // set: a DeepSpeed input read through the Megatron-Core view
  std::string dir;                        // the input folder
  std::string manifest_path;              // names the manifest in messages
  std::string common_path;                // names the common state in messages
  formats::universal::UniversalManifest manifest;  // Megatron-Core names
  pickle::ValuePtr common;                // the source's Megatron-Core common state (not a copy: copy before editing)
  pickle::ValuePtr objects;               // {fqn: bytes} of ShardedObjects (a torch_dist source), or null
  std::vector<std::string> extra_keys;    // forward: the ._extra_state objects Megatron-Core asks for
  std::string family;                     // forward: "<family> (<map origin>)" of the Megatron-Core map used
  // Set by a reader registered for the input's kind (register_megatron_core_reader): `state` of parameter
  // `param` (manifest order) as fp32, whole, made from the input's own files; its bytes read added to `read`.
  std::function<Tensor(size_t param, const std::string& state, uint64_t& read)> states;
  // Optional, for a writer that streams (torch_dist, hf): the same values as generated tensors (io/generated_view.h),
  // made window by window as they are written, never whole (a Hugging Face folder's; a torch_dist save's, its items'
  // checksums checked first under `verify`); a reader may still give a whole one.
  std::function<Tensor(size_t param, const std::string& state, bool verify, uint64_t& read)> streams;

  // Parameter `param`'s `state` ("fp32", "exp_avg", ...) in Megatron-Core layout, whole, as fp32; its
  // bytes read are added to `read`. Checksums checked when `verify`. Throws Error naming the file.
  Tensor value(size_t param, const std::string& state, bool verify, uint64_t& read) const;
  // value(), as a generated tensor where the reader makes one (`streams`), else whole.
  Tensor streamed_value(size_t param, const std::string& state, bool verify, uint64_t& read) const;
  // Rows the Megatron-Core view added to parameter `param` (a DeepSpeed input's vocabulary padded to
  // Megatron's padded size, zeros); 0 for a Megatron-Core-named folder, whose rows are all the source's.
  int64_t rows_added(size_t param) const;
  // The dtype the manifest records for the model (the first parameter's), if any.
  std::optional<DType> model_dtype() const;
};

// Opens `o.input` for `format` (the --format name, for messages). Throws Error naming the input when it
// is none of the above (a DCP or torch_dist folder is converted into a universal folder first, by the
// tool; a universal folder without the common state is refused naming the file).
MegatronCoreInput open_megatron_core_input(const LoadOptions& o, std::string_view format);

// Inputs read in Megatron-Core names straight from their own files, with no universal folder on disk (registered
// by folder kind, formats::detect's name, from the reader's own file, as direct mode's readers are): the manifest,
// common state and `states` made in memory. Registered: a Hugging Face folder (hf_megatron_core_input.cpp).
struct MegatronCoreReader {
  std::function<MegatronCoreInput(const LoadOptions& o, std::string_view format)> open;
  // The import's --audit of such an input (docs/hf.md "Audit"), for a format that writes no audit of its own:
  // (input, the output it names, the audit file), called once the output is in place; empty when there is none.
  std::function<void(const std::string& input, const std::string& output, const std::string& path)> audit;
};
// Returns true (for a namespace-scope initializer).
bool register_megatron_core_reader(std::string_view kind, MegatronCoreReader reader);
// The reader registered for `kind`; its `open` empty when there is none.
MegatronCoreReader megatron_core_reader(const formats::FolderKind& kind);
// Whether open_megatron_core_input reads a folder of this kind straight from its files (a reader is registered).
bool reads_megatron_core_directly(const formats::FolderKind& kind);

}  // namespace ucpkit::reshard
