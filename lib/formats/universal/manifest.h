// The universal checkpoint's manifest.json (docs/formats.md, "Universal checkpoint"): the one place
// that knows its keys. ucp-union writes it (to_json), ucp-load reads it (from_json; direct mode builds
// one in memory from the extract plan), pec-save reads which zero/<param>/ folders hold which expert.
// Plain data; reading and writing do no I/O except read_universal_manifest().
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ucpkit::formats::universal {

inline constexpr const char* kUniversalManifestName = "manifest.json";
inline constexpr const char* kUniversalFormat = "ucpkit-universal";
inline constexpr int kUniversalVersion = 1;
inline constexpr const char* kUniversalOptimizerState = "zero/optimizer_state.pt";
inline constexpr const char* kUniversalItemsFolder = "items";  // a DCP's bytes entries (UniversalItem)
inline constexpr const char* kUniversalChecksumNote = "crc32 of each state's tensor elements (row-major)";

// One state file of a parameter (fp32, exp_avg, exp_avg_sq).
struct UniversalState {
  std::string file;              // relative to the universal folder: zero/<param folder>/<state>.pt
  std::optional<uint32_t> crc32;  // of the tensor's elements (row-major); absent in direct mode's manifest
  // The dtype the source stored it in when that is a 16-bit float (a DCP's bf16 model and AdamW state):
  // the file holds it widened to float32 (exact), the DCP writer narrows it back. Written
  // only when set: every other folder keeps its bytes.
  std::optional<std::string> source_dtype;
};

// A native DeepSpeed MoE expert parameter (its universal name carries the global expert id).
struct UniversalExpert {
  int layer = -1;      // transformer layer index of its MoE layer
  int global_id = -1;  // global expert id
};

// A DeepSpeed AutoEP fused expert weight [E, ...].
struct UniversalAutoEp {
  int moe_layer_id = -1;
  int num_experts = 0;  // E
};

// One entry of "params". Keys that only ucp-union writes (dtype, join, tp_shapes, pp_stage, patterns)
// are optional on reading (direct mode's manifest has none of them) and written when set.
struct UniversalParam {
  std::string name;                                          // universal (atomic) name
  std::vector<int64_t> shape;                                // the universal tensor's shape (flat: the parameter's)
  std::optional<std::string> dtype;                          // "float32", ...
  std::optional<std::string> join;                           // patterns::describe of its rule
  std::optional<std::vector<std::vector<int64_t>>> tp_shapes;  // per source TP rank
  std::optional<int64_t> pp_stage;
  std::map<std::string, UniversalState> states;              // state name -> file
  bool step = false;                                         // zero/<param folder>/step.pt exists
  std::optional<std::vector<std::string>> patterns;          // pattern sources that matched it
  std::optional<int64_t> cat_dim;                            // Cat / TwoSubParams rules, AutoEP weights (0)
  bool vocab_tensor = false;                                 // a vocabulary tensor (rows cut to original_vocab_size)
  bool flat = false;                                         // state files hold 1-D tensors (ZeRO-3, TP = 1 form)
  std::optional<UniversalExpert> expert;
  std::optional<UniversalAutoEp> autoep;

  nlohmann::json to_json() const;
  // `file` names the manifest in errors, `where` the entry ("params[3]").
  static UniversalParam from_json(const nlohmann::json& j, const std::string& file, const std::string& where);
};

// A model tensor without optimizer state (a buffer or counter: BatchNorm's running statistics, an int64
// num_batches_tracked, a bool mask), kept in its own dtype in one file of a state file's form
// (zero/<folder>/fp32.pt: the model tensor as stored, as a DCP parameter's). Listed under "buffers",
// written only when there are any: a folder without buffers keeps the manifest it had.
struct UniversalBuffer {
  std::string name;            // the model fqn
  std::vector<int64_t> shape;
  std::string dtype;           // "int64", "bool", "float32", ... (never converted)
  UniversalState tensor;       // its file and the crc32 of its elements

  nlohmann::json to_json() const;
  static UniversalBuffer from_json(const nlohmann::json& j, const std::string& file, const std::string& where);
};

// A DCP entry that is neither a model tensor, an optimizer state nor a nested param_groups value: a
// bytes item (LR scheduler, dataloader position, train_state bytes, torchtitan's flattened
// param_groups, any other torch.save'd value) carried verbatim under its original key, so
// ucp-load --format dcp writes it back where the saving code's dcp.load looks for it. Listed under
// "items", written only when there are any.
struct UniversalItem {
  std::string key;             // its DCP flat key ("lr_scheduler.last_epoch")
  nlohmann::json path;         // its nested state-dict path as the source's planner recorded it: strings and ints
  UniversalState file;         // items/<n>.pt: the entry's bytes as stored; crc32 of those bytes

  nlohmann::json to_json() const;
  static UniversalItem from_json(const nlohmann::json& j, const std::string& file, const std::string& where);
};

// The description of the source checkpoint that an extract plan makes (plan.source, in ucp-extract's
// plan.json) and manifest.json carries ("source"): what each input format records of its source, one
// struct with one JSON binder (read by key in 10 files before). A key is written only when its
// field is set (each format records what its source has); what the struct does not model (a format's
// own facts, source.dcp and source.torch_dist) is kept in `facts` as read.
struct UniversalSource {
  std::optional<std::string> format;            // "dcp", "torch_dist", ...; none: DeepSpeed (format_name)
  std::optional<std::string> dir;               // the DeepSpeed checkpoint folder read
  std::optional<std::string> tag;               // global_stepN
  std::optional<int> tp, pp, dp, ep;            // the source's layout (tp_or_1() ...: 1 when not recorded)
  std::optional<int> zero_stage;                // none when not recorded (older BF16_Optimizer manifests: null, kept in facts)
  std::optional<bool> pipeline;                 // a PipelineModule's names (layer files)
  std::optional<bool> layer_model_axis;         // its layer files named -model_TT- (written only when false)
  std::optional<bool> bf16;                     // bf16_zero_ file names
  std::optional<bool> data_before_expert;       // use_data_before_expert_parallel_ rank order
  std::optional<std::string> ds_line;           // native MoE: DeepSpeed version line
  std::optional<std::vector<int>> num_experts;  // native MoE: experts per MoE layer
  // Weights without a training run behind them (a Hugging Face model, or a Megatron "release" save):
  // the optimizer state is a fresh run's, and a torch_dist output is a release checkpoint again.
  std::optional<bool> weights_only;
  std::optional<int64_t> expert_files;          // native MoE / AutoEP: expert files read
  std::optional<int64_t> sub_groups;            // ZeRO-3: sub-groups of TP rank 0
  nlohmann::json autoep;                        // AutoEP layers (null: not an AutoEP source)
  nlohmann::json pipeline_numbering;            // null when not recorded (made by an older ucp-union)
  std::optional<std::map<int, std::vector<std::string>>> layer_keys;  // key order of the layer files
  // Megatron-Core names (ucp-union --to-names megatron-core): "megatron-core", and the record of the
  // way back (null when absent).
  std::optional<std::string> names;
  nlohmann::json names_record;
  nlohmann::json facts = nlohmann::json::object();  // every other key, as read

  int tp_or_1() const { return tp.value_or(1); }
  int pp_or_1() const { return pp.value_or(1); }
  int dp_or_1() const { return dp.value_or(1); }
  int ep_or_1() const { return ep.value_or(1); }
  // The format it names; "deepspeed" when it names none (the extract plan of a DeepSpeed checkpoint,
  // whose folder holds its DeepSpeed model files).
  std::string format_name() const { return format.value_or("deepspeed"); }
  // ds_to_universal's ZeRO-3 TP = 1 form (flat state files).
  bool flat() const { return zero_stage == 3 && tp_or_1() == 1; }

  nlohmann::json to_json() const;
  // Throws Error "<file>: malformed: source.<key> ..." when a field has another type than written.
  static UniversalSource from_json(const nlohmann::json& source, const std::string& file);
};

struct UniversalManifest {
  std::string format = kUniversalFormat;
  int64_t version = kUniversalVersion;
  UniversalSource source;                             // the extract plan's source description
  std::string patterns_origin;                        // where the pattern set came from
  nlohmann::json patterns_set;                        // PatternSet::to_json
  std::vector<std::string> model_files;               // copied mp_rank files, relative to the folder
  std::string optimizer_state = kUniversalOptimizerState;
  std::string checksum = kUniversalChecksumNote;      // what each state's crc32 covers
  std::vector<UniversalParam> params;                 // plan order
  std::vector<UniversalBuffer> buffers;               // model tensors without optimizer state ("buffers")
  std::vector<UniversalItem> items;                   // a DCP's other entries, verbatim ("items")

  // The JSON ucp-union writes (keys sorted, as nlohmann's object keeps them).
  nlohmann::json to_json() const;
  // The file's text: to_json() indented by one space, no trailing newline.
  std::string text() const;
  // Throws Error "<file>: ..." (one line, the key named) when `j` is not a ucpkit universal manifest
  // or a key has another type than written.
  static UniversalManifest from_json(const nlohmann::json& j, const std::string& file);
};

// "N buffers ('a', 'b', ...)": the first `most` names, for a refusal or a warning that names them.
std::string describe_buffers(const std::vector<UniversalBuffer>& buffers, size_t most = 4);

// Reads and parses `path` (a universal folder's manifest.json). Throws Error naming it.
UniversalManifest read_universal_manifest(const std::string& path);

// A crc32 as manifest.json writes it: 8 lowercase hex digits.
std::string crc32_text(uint32_t crc);

}  // namespace ucpkit::formats::universal
