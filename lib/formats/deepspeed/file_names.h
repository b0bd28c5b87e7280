// DeepSpeed checkpoint discovery: file-name classes, `latest`, degree inference with numeric (never
// alphabetical) ordering, and completeness checks. infer_layout() is pure (no I/O).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
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
std::string layer_states_name(int layer, int tp);                   // layer_LL-model_TT-model_states.pt
std::string expert_states_name(int moe_layer, int expert, int mp);  // layer_M_expert_E_mp_rank_XX_model_states.pt
std::string expert_optim_name(int ep_rank, int mp);                 // expp_rank_R_mp_rank_XX_optim_states.pt

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

// The checkpoint tag a folder stands for: its own name however the path is spelled (".", "..", a
// trailing slash, a relative path, a symbolic link to the tag folder: the link's target's name).
std::string tag_of_dir(const std::string& dir);

// N of a tag "global_step<N>" (DeepSpeed's default tag); nullopt for other names (a custom tag) or an N
// of more than 18 digits.
std::optional<int64_t> step_of_tag(const std::string& tag);

// Infers degrees from the base names in `dir` and checks that every shard is there exactly once;
// throws Error naming a missing or unexpected shard.
DeepSpeedLayout infer_layout(const std::vector<std::string>& names, const std::string& dir);

// Resolves a checkpoint path: a global_stepN folder, or its parent with a `latest` file.
std::string resolve_checkpoint_dir(const std::string& path);

// resolve_checkpoint_dir + directory listing + infer_layout.
DeepSpeedLayout discover(const std::string& path);

}  // namespace ucpkit::formats::deepspeed
