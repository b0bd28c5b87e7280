// Load (the paper's last step) for DeepSpeed / Megatron-DeepSpeed targets: builds the files of one
// target rank (formats.md section 2) from the UcpInfo plan and the atomic tensors.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/pickle/value.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/version_line.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"
#include "reshard/universal_reader.h"

namespace ucpkit::reshard {

class DeepSpeedWriter {
 public:
  // `common_optimizer_state` is the universal zero/optimizer_state.pt root.
  DeepSpeedWriter(const ModelInfo& model, const UcpInfo& plan, UniversalReader& reader,
                  pickle::ValuePtr common_optimizer_state);

  // mp_rank_XX_model_states.pt of model-parallel rank `mp` into `dir`; returns bytes written.
  uint64_t write_model_file(int mp, const std::string& dir) const;
  // The pipeline layer files of `mp` (none for non-pipeline models).
  uint64_t write_layer_files(int mp, const std::string& dir) const;
  // Native MoE: layer_M_expert_G_mp_rank_XX_model_states.pt and expp_rank_R_mp_rank_XX_optim_states.pt.
  uint64_t write_expert_files(int mp, const std::string& dir) const;
  // ZeRO-3: zero_pp_rank_D_mp_rank_XX_model_states.pt (0-element module tensors, sub-group shapes).
  uint64_t write_zero3_model_file(int dp_rank, int mp, const std::string& dir) const;
  // [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt of (dp_rank, mp).
  uint64_t write_optim_file(int dp_rank, int mp, const std::string& dir) const;

  // The module weights of one slot in the target dtype, as a compact tensor. Streamed: its storage
  // is generated (Storage::generated), its bytes are read and converted while the file is written.
  Tensor low_precision_slice(const Slot& slot) const;
  // One state of partition `part` of a group (fp32, zero padding): its first `length` elements
  // (-1: the whole partition). `streamed`: a generated storage, read window by window while the
  // file is written (what the writer uses); otherwise the bytes are read now into owned memory.
  Tensor partition_tensor(const GroupPlan& group, int part, const std::string& state, int64_t length = -1,
                          bool streamed = false) const;

  // What a generated storage made by this writer is made of: bytes [byte_begin, byte_end) are
  // elements [param_offset, ...) of the flattened TP slice `slot` of atomic state `state` (index
  // into ModelInfo::states), converted to the storage's dtype; bytes outside every source are zeros.
  struct Source {
    uint64_t byte_begin, byte_end;
    const Slot* slot;
    int64_t param_offset;
    int state;
  };
  // While on, every generated storage this writer creates is recorded (the MPI exchange splits
  // the files it writes into batches of parameters with it).
  void record_sources(bool on) { record_ = on; }
  // Where finished file roots go: by default each is saved at once (save_torch_file); a sink gets
  // (path, root) instead and returns the bytes it wrote (the MPI exchange writes them later).
  using Sink = std::function<uint64_t(const std::string& path, const pickle::ValuePtr& root)>;
  void set_sink(Sink sink) { sink_ = std::move(sink); }
  // Native MoE: the DeepSpeed version line written (nullptr otherwise), for expected_files.
  const formats::deepspeed::VersionLine* moe_line() const { return moe_line_; }
  // Files saved so far (not counting those handed to a sink): the count ucp-load reports.
  size_t files_written() const { return files_written_.load(); }
  // The sources of `storage`, sorted by byte_begin (empty when it was not recorded).
  std::vector<Source> sources_of(const Storage* storage) const;

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
  // storage (fp32 read straight into the window; other dtypes read and converted).
  std::shared_ptr<Storage> streamed(DType dtype, int64_t numel, std::vector<Run> runs, const std::string& state) const;
  // The model-states root of model-parallel rank `mp`; `dp_rank` >= 0: the ZeRO-3 file of that DP rank
  // (AutoEP records the rank's own EP place in it).
  pickle::ValuePtr model_root(int mp, int dp_rank = -1) const;
  // Template model file `file` (index into ModelInfo::model_files), parsed on first use; never changed.
  const pickle::ValuePtr& template_root(int file) const;
  formats::deepspeed::LayoutFacts layout_facts() const;
  pickle::ValuePtr target_ds_version() const;
  pickle::ValuePtr target_module(const MpRankPlan& mr, const pickle::ValuePtr& module) const;
  formats::deepspeed::ParamShapes target_param_shapes(const MpRankPlan& mr) const;
  void fill_moe_line(const MpRankPlan& mr, formats::deepspeed::ModelStates& m) const;
  // optimizer_state_dict of a ZeRO-1/2 or BF16_Optimizer shard, and of a ZeRO-3 shard.
  pickle::ValuePtr zero12_state(int dp_rank, int mp) const;
  pickle::ValuePtr zero3_state(int dp_rank, int mp) const;
  // The torch optimizer state of partition `part` of a group into `out`: step, then the moments (streamed).
  void optimizer_state(const GroupPlan& g, int part, formats::deepspeed::OptimizerShard::Group& out) const;
  pickle::ValuePtr target_loss_scaler() const;
  pickle::ValuePtr common_param_groups() const;
  const ModelInfo& model_;
  const UcpInfo& plan_;
  UniversalReader& reader_;
  pickle::ValuePtr common_;
  const formats::deepspeed::VersionLine* moe_line_ = nullptr;  // native MoE: the DeepSpeed version line written
  std::string ds_release_;                         // --ds-version given as a release (0.16.5), else ""
  uint64_t emit(const std::string& path, const pickle::ValuePtr& root) const;
  bool record_ = false;
  Sink sink_;
  mutable std::atomic<size_t> files_written_{0};
  mutable std::mutex recorded_mu_;
  mutable std::map<const Storage*, std::vector<Source>> recorded_;
  mutable std::mutex templates_mu_;
  mutable std::vector<pickle::ValuePtr> templates_;  // template_root's parses
};

}  // namespace ucpkit::reshard
