// DeepSpeed checkpoint discovery: file-name classes, `latest`, degree inference with numeric (never
// alphabetical) ordering, and completeness checks. infer_layout() is pure (no I/O).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ucpkit::formats::deepspeed {

enum class FileKind {
  ModelStates,       // mp_rank_XX_model_states.pt
  Zero3ModelStates,  // zero_pp_rank_D_mp_rank_XX_model_states.pt
  OptimStates,       // [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt
  LayerStates,       // layer_LL[-model_TT]-model_states.pt
  ExpertStates,      // layer_M_expert_E_mp_rank_XX_model_states.pt
  ExpertOptim,       // expp_rank_R_mp_rank_XX_optim_states.pt
};

struct FileName {
  FileKind kind;
  bool bf16 = false;
  int dp = -1, mp = -1, layer = -1, tp = -1, moe_layer = -1, expert = -1, ep_rank = -1;
};

// Classifies a base name; nullopt for files that are not checkpoint shards.
std::optional<FileName> parse_file_name(std::string_view name);

// The base names DeepSpeed saves (engine.py _get_ckpt_name, _get_zero_ckpt_name,
// _get_expert_ckpt_name, _get_optimizer_ckpt_name; PipelineModule.ckpt_layer_path): the one place
// that spells them, for readers' messages and for writers. parse_file_name() reads each back.
std::string model_states_name(int mp);                              // mp_rank_XX_model_states.pt
std::string zero3_model_states_name(int dp, int mp);                // zero_pp_rank_D_mp_rank_XX_model_states.pt
std::string optim_states_name(int dp, int mp, bool bf16);           // [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt
// layer_LL-model_TT-model_states.pt, or layer_LL-model_states.pt when the topology has no model axis
// (pipe/module.py v0.14.5:565-573 ckpt_layer_path: topology.get_rank_repr omits data and pipe, so a
// PipeDataParallelTopology, the PipelineModule default, gives no rank part).
std::string layer_states_name(int layer, int tp, bool model_axis = true);
std::string expert_states_name(int moe_layer, int expert, int mp);  // layer_M_expert_E_mp_rank_XX_model_states.pt
std::string expert_optim_name(int ep_rank, int mp);                 // expp_rank_R_mp_rank_XX_optim_states.pt

struct VersionLine;  // version_line.h

// What decides the files a target layout writes (no tensors): the one list of those files is
// expected_files(); writers and plans ask it instead of spelling which files exist.
struct TargetFiles {
  int tp = 1, pp = 1, dp = 1, ep = 1;
  bool zero3 = false;       // zero_pp_rank_D_mp_rank_XX_model_states.pt instead of mp_rank_XX
  bool bf16 = false;        // the optimizer shards' bf16_ prefix
  bool native_moe = false;  // expert optimizer files as the version line writes them
  bool layer_model_axis = true;  // layer files named -model_TT- (layer_states_name)
  struct MpRank {
    std::vector<int> layers;                     // pipeline layer files
    std::vector<std::pair<int, int>> experts;    // (moe layer, global expert) files
  };
  std::vector<MpRank> mp_ranks;                  // [mp], mp = pp_rank * tp + tp_rank
};

// Native MoE: the expp_rank_R_mp_rank_XX_optim_states.pt files of model-parallel rank `mp`: one per
// EP rank when `line` writes them under ZeRO (VersionLine::expp_files; v0.19.5 engine.py:5066-5087
// writes none), none without a line.
std::vector<std::string> expected_expert_optim_files(int ep, int mp, const VersionLine* line);
// What the model job of `mp` writes, in writing order: mp_rank_XX, its layer files, its expert files
// and expected_expert_optim_files; nothing for ZeRO-3 targets (expected_rank_files has their files).
std::vector<std::string> expected_model_files(const TargetFiles& t, int mp, const VersionLine* line);
// What the optimizer job of (dp, mp) writes: its ZeRO-3 model file, then its optimizer shard.
std::vector<std::string> expected_rank_files(const TargetFiles& t, int dp, int mp);
// Every base name the target writes: per model-parallel rank its model files, then per DP rank its
// rank files (`latest` and the tag folder are the caller's).
std::vector<std::string> expected_files(const TargetFiles& t, const VersionLine* line);

struct ExpertFile {
  int moe_layer, expert, mp;
  std::string path;
};

struct DeepSpeedLayout {
  std::string dir;  // the global_stepN folder
  std::string tag;  // its base name
  int tp = 1, pp = 1, dp = 1, ep = 1;
  bool zero3 = false;
  bool bf16_prefix = false;
  bool pipeline = false;                             // layer files present
  bool layer_model_axis = true;                      // their names carry -model_TT (layer_states_name)
  std::vector<std::string> model_files;              // [mp], mp = pp_rank * tp + tp_rank
  std::vector<std::vector<std::string>> optim_files; // [mp][dp]
  std::vector<std::vector<std::string>> zero3_model_files;  // ZeRO-3: [mp][dp]
  std::map<int, std::vector<std::string>> layer_files;  // layer -> [tp]
  std::vector<ExpertFile> expert_files;              // sorted (moe_layer, expert, mp)
  std::vector<std::string> expert_optim_files;       // [ep_rank]
  std::vector<std::string> ignored;                  // other files in the folder

  int mp_count() const { return tp * pp; }
  int pp_rank(int mp) const { return mp / tp; }
  int tp_rank(int mp) const { return mp % tp; }
};

// Infers degrees from the base names in `dir` and checks that every shard is there exactly once;
// throws Error naming a missing or unexpected shard.
DeepSpeedLayout infer_layout(const std::vector<std::string>& names, const std::string& dir);

// checkpoint_dir.h resolve_checkpoint_dir + directory listing + infer_layout.
DeepSpeedLayout discover(const std::string& path);

}  // namespace ucpkit::formats::deepspeed
