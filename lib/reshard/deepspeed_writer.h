// Load (the paper's last step) for DeepSpeed / Megatron-DeepSpeed targets: lays out the files of one
// target rank (formats.md section 2) from the UcpInfo plan and the atomic tensors. Laying out builds
// each file's pickled root with generated (streaming) storages and says what each storage is made
// of; nothing is written until the caller saves the file (save_file, or the exchange's
// DeferredTorchFile). The writer has no modes and reads no process-wide switch: what a write needs
// is passed to it (WriteOptions).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/pickle/value.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/version_line.h"
#include "reshard/laid_out_file.h"
#include "reshard/load_plan.h"
#include "reshard/model_info.h"
#include "reshard/templates.h"
#include "reshard/ucp_info.h"
#include "reshard/universal_reader.h"

namespace ucpkit::reshard {

class DeepSpeedWriter {
 public:
  using Source = StorageSource;
  // `common_optimizer_state` is the universal zero/optimizer_state.pt root; `templates` the run's
  // parsed template model files (shared by every writer of the run) and `moe_line` the native-MoE
  // line written (target_moe_line; nullptr otherwise).
  DeepSpeedWriter(const ModelInfo& model, const UcpInfo& plan, UniversalReader& reader,
                  pickle::ValuePtr common_optimizer_state, std::shared_ptr<const Templates> templates,
                  const formats::deepspeed::VersionLine* moe_line);
  // The same with templates of its own (the device path, tests).
  DeepSpeedWriter(const ModelInfo& model, const UcpInfo& plan, UniversalReader& reader,
                  pickle::ValuePtr common_optimizer_state);

  // Every file of job `j` (load_plan.h) under `dir`, in the order: model file, layer files, expert
  // files (Model); the ZeRO-3 model file (Zero3Model); the optimizer file (Optim).
  std::vector<LaidOutFile> lay_out(const FileJob& j, const std::string& dir) const;
  // mp_rank_XX_model_states.pt of model-parallel rank `mp`.
  LaidOutFile model_file(int mp, const std::string& dir) const;
  // The pipeline layer files of `mp` (none for non-pipeline models).
  std::vector<LaidOutFile> layer_files(int mp, const std::string& dir) const;
  // Native MoE: layer_M_expert_G_mp_rank_XX_model_states.pt and expp_rank_R_mp_rank_XX_optim_states.pt.
  std::vector<LaidOutFile> expert_files(int mp, const std::string& dir) const;
  // ZeRO-3: zero_pp_rank_D_mp_rank_XX_model_states.pt (0-element module tensors, sub-group shapes).
  LaidOutFile zero3_model_file(int dp_rank, int mp, const std::string& dir) const;
  // [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt of (dp_rank, mp).
  LaidOutFile optim_file(int dp_rank, int mp, const std::string& dir) const;

  // The module weights of one slot in the target dtype, as a compact tensor. Streamed: its storage
  // is generated (Storage::generated), its bytes are read and converted while the file is written.
  // `sources` (optional): where the storage's sources are added.
  Tensor low_precision_slice(const Slot& slot, StorageSources* sources = nullptr) const;
  // One state of partition `part` of a group (fp32, zero padding): its first `length` elements
  // (-1: the whole partition). `streamed`: a generated storage, read window by window while the
  // file is written (what the writer uses); otherwise the bytes are read now into owned memory.
  Tensor partition_tensor(const GroupPlan& group, int part, const std::string& state, int64_t length = -1,
                          bool streamed = false, StorageSources* sources = nullptr) const;

  // Native MoE: the DeepSpeed version line written (nullptr otherwise).
  const formats::deepspeed::VersionLine* moe_line() const { return moe_line_; }

  // A run of a flat buffer: elements [start, start + numel) are elements [param_offset, ...) of the
  // flattened TP slice of `slot`.
  struct Run {
    const Slot* slot;
    int64_t start, numel, param_offset;
  };

 private:
  // Elements [e0, e0 + n) of a flat fp32 buffer made of `runs` (sorted by start, disjoint) and
  // zeros elsewhere, into `dst`: only gaps and padding are zeroed.
  void fill_runs(const std::vector<Run>& runs, const std::string& state, int64_t e0, int64_t n, float* dst) const;
  // A flat buffer of `numel` elements of `dtype` made of `runs` of state `state`, as a generated
  // storage (fp32 read straight into the window; other dtypes read and converted); its sources
  // added to `sources` when given.
  std::shared_ptr<Storage> streamed(DType dtype, int64_t numel, std::vector<Run> runs, const std::string& state,
                                    StorageSources* sources) const;
  // The model-states root of model-parallel rank `mp`; `dp_rank` >= 0: the ZeRO-3 file of that DP rank
  // (AutoEP records the rank's own EP place in it).
  pickle::ValuePtr model_root(int mp, int dp_rank, StorageSources& sources) const;
  // Template model file `file` (index into ModelInfo::model_files): the run's parse, never changed.
  const pickle::ValuePtr& template_root(int file) const { return templates_->model_states(file); }
  formats::deepspeed::LayoutFacts layout_facts() const;
  pickle::ValuePtr target_ds_version() const;
  // `tied`: shared_params of the template (alias, parameter).
  pickle::ValuePtr target_module(const MpRankPlan& mr, const pickle::ValuePtr& module, StorageSources& sources,
                                 const std::vector<std::pair<std::string, std::string>>& tied) const;
  formats::deepspeed::ParamShapes target_param_shapes(const MpRankPlan& mr) const;
  void fill_moe_line(const MpRankPlan& mr, formats::deepspeed::ModelStates& m) const;
  // optimizer_state_dict of a ZeRO-1/2 or BF16_Optimizer shard, and of a ZeRO-3 shard.
  pickle::ValuePtr zero12_state(int dp_rank, int mp, StorageSources& sources) const;
  pickle::ValuePtr zero3_state(int dp_rank, int mp, StorageSources& sources) const;
  // The torch optimizer state of partition `part` of a group into `out`: step, then the moments (streamed).
  void optimizer_state(const GroupPlan& g, int part, formats::deepspeed::OptimizerShard::Group& out,
                       StorageSources& sources) const;
  pickle::ValuePtr target_loss_scaler() const;
  pickle::ValuePtr common_param_groups() const;
  const ModelInfo& model_;
  const UcpInfo& plan_;
  UniversalReader& reader_;
  pickle::ValuePtr common_;
  std::shared_ptr<const Templates> templates_;
  const formats::deepspeed::VersionLine* moe_line_ = nullptr;  // native MoE: the DeepSpeed version line written
  std::string ds_release_;                         // --ds-version given as a release (0.16.5), else ""
};

}  // namespace ucpkit::reshard
