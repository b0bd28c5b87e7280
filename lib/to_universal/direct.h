// The one way into to_universal/ from another tool module (docs/architecture.md, "the dependency
// rule"): ucp-load's direct mode reads a native checkpoint through the extract plan, with no universal
// folder on disk, and its torch_dist one pass (reshard/torch_dist_source) reads a Megatron-Core save
// through the union's own torch_dist pieces (from_torch_dist.h: TorchDistStates, torch_dist_entry;
// megatron_core_names.h: megatron_deepspeed_view, to_deepspeed_value), and the Megatron-Core one pass of
// --format torch_dist / hf reads a torch_dist save or a Hugging Face folder the way their unions do
// (from_torch_dist.h: torch_dist_manifest, stored_extra_state_objects; from_hf.h: hf_megatron_core,
// hf_fresh_state, write_hf_import_audit). Everything here forwards to the
// extract side's own code, so that ucp-load and ucp-union read the same bytes the same way.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/universal/manifest.h"
#include "io/pickle/value.h"
#include "io/tensor.h"
#include "to_universal/from_hf.h"
#include "to_universal/from_torch_dist.h"
#include "to_universal/hf_joined_stream.h"
#include "to_universal/master_image.h"
#include "to_universal/megatron_core_names.h"
#include "to_universal/plan.h"

namespace ucpkit::to_universal {

class SourceCache;

// The extract plan of a native checkpoint (ucp-union's default options; its files opened with `open`),
// or of a ucp-extract work folder (its plan.json).
ExtractPlan plan_native_checkpoint(const std::string& checkpoint, const TorchLoadOptions& open = {});
ExtractPlan plan_of_work_folder(const std::string& work_dir);

// zero/optimizer_state.pt as ucp-union writes it, from the root of the rank-0 optimizer shard `path`.
pickle::ValuePtr universal_optimizer_state(const pickle::ValuePtr& optimizer_shard_root, const std::string& path);

// The manifest entry facts ucp-union writes for `p` (join, TP shapes, pipeline stage, step, patterns,
// cat_dim, vocab_tensor, flat form, expert, AutoEP), the rule `p` matched; name, shape, dtype and the
// state files are the caller's (convert.cpp after joining; direct mode from the plan).
void describe_manifest_entry(formats::universal::UniversalParam& e, const ParamPlan& p, const patterns::ParamRule& rule,
                             bool flat);

// A vocabulary parameter cut to its first `original_vocab_size` rows, as ucp-union cuts it.
Tensor strip_vocab_padding(const std::string& name, const Tensor& t, int64_t original_vocab_size);

// The plan's shard files, each opened (memory-mapped, pickle parsed) on first use; thread-safe.
class FragmentReader {
 public:
  // `open`: how each file is opened on first use (its CRC check, torch_file.h).
  explicit FragmentReader(const std::vector<std::string>& files, const TorchLoadOptions& open = {});
  ~FragmentReader();
  FragmentReader(const FragmentReader&) = delete;
  FragmentReader& operator=(const FragmentReader&) = delete;

  // The 1-D run of `state` a fragment names (a view into the mapped file).
  Tensor fragment(const SourceFragment& f, const std::string& state);
  // One TP slice of one state, its fragments concatenated and shaped `shape`; adds to *bytes_read.
  Tensor slice(const std::vector<SourceFragment>& fragments, const std::string& state,
               const std::vector<int64_t>& shape, uint64_t* bytes_read);
  // The raw step value (int or tensor) of a group, or of a work-folder fragment file.
  pickle::ValuePtr step(int file, int group);
  const std::string& path(int file) const;
  // Copies a contiguous tensor of `file` with pread; false when it is not a view into the file.
  bool read_into(int file, const Tensor& t, uint8_t* dst);
  // Byte offset of `t`'s first element in `file` (0 when `t` is not a view into its mapping).
  uint64_t file_offset(int file, const Tensor& t);

 private:
  std::unique_ptr<SourceCache> cache_;
};

}  // namespace ucpkit::to_universal
