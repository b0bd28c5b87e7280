// ucp-load --format dcp: the universal state written as a PyTorch Distributed Checkpoint, the folder
// torch 2.x `dcp.save({"model": model_sd, "optim": optim_sd})` writes for
// `model_sd, optim_sd = get_state_dict(model, optimizer)` (docs/ucp-load.md, "DCP output"):
//  * model.<fqn>: each parameter under its universal name, the fp32 master converted to the target
//    dtype (the source's unless --dtype); each buffer (ModelInfo::buffers) after them under its name, in
//    its own dtype whatever --dtype says, with no optimizer entries;
//  * optim.state.<fqn>.step|<state>: the step as stored (a 0-d tensor, else a bytes item), then every
//    optimizer state (exp_avg, exp_avg_sq) in fp32, or in the 16-bit float a DCP source stored it in
//    (manifest states' source_dtype: bf16 training);
//  * optim.param_groups.<i>.<key>: bytes items, torch.save of each value of the source's param_groups,
//    "params" last as the list of the group's fqns (get_state_dict's form);
//  * a DCP source's other bytes entries (ModelInfo::items: LR scheduler, dataloader, train state,
//    flattened param_groups) verbatim under their own keys;
//  * every key above as the DCP source saved it when it recorded another (ModelInfo::dcp_keys:
//    torchtitan's top-level model keys and optimizer.*; formats/dcp/key_record.h), so torch's dcp.load
//    of the request that saved the source finds every entry.
// This is the inverse of ucp-union --input <DCP folder> (to_universal/from_dcp.h): at --dtype fp32 the
// union of the output gives back the same state files. Whole tensors on one rank, or (--world-size N)
// FSDP2's Shard(0) layout over N ranks (formats/dcp/save_plan.h Target::rows).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/dcp/save_plan.h"
#include "io/dtype.h"
#include "io/pickle/value.h"
#include "reshard/model_info.h"
#include "reshard/universal_reader.h"

namespace ucpkit::reshard {

// What one entry of the plan holds.
struct DcpSource {
  enum Kind { Model, State, Step, ParamGroup, Buffer, Item } kind = Model;
  int param = -1;     // Model, State, Step; Buffer: index into ModelInfo::buffers; Item: into ModelInfo::items
  std::string state;  // State: "exp_avg", ...
  size_t group = 0;   // ParamGroup: index into param_groups
  std::string key;    // ParamGroup: the key ("lr", ..., "params")
};

struct DcpOutput {
  formats::dcp::Target target;
  DType dtype = DType::BFloat16;           // of the model tensors
  std::string optimizer_dtype = "fp32";    // optimizer_dtype_name's
  bool own_dtypes = false;                 // each model tensor in its parameter's stored dtype, not `dtype`
  formats::dcp::SavePlan plan;
  std::vector<DcpSource> sources;          // [entry]
  std::shared_ptr<const formats::dcp::PlannerPaths> planner;  // planner_data, as DefaultSavePlanner records it
};

// The dtype state `state` of `p` is written in: the 16-bit float its source stored it in, else float32.
DType state_dtype(const ParamInfo& p, const std::string& state);

// The bytes of a DCP source's item (ModelInfo::items) in the universal folder `dir`, as stored; checked
// against its crc32 when `verify`. Throws Error naming the file.
std::vector<uint8_t> read_item(const std::string& dir, const formats::universal::UniversalItem& item, bool verify);

// The target mesh: --world-size N (N > 1) gives FSDP2's rows over N ranks, else one whole rank.
formats::dcp::Target dcp_target(int64_t world_size);

// The plan of the checkpoint written for `model` (`step(i)`: parameter i's raw step value or null);
// `own_dtypes` (target_defaults.h keeps_stored_dtypes): each parameter's model tensor in the dtype its
// source stored it in (state_dtype of "fp32") instead of `dtype`. Pure but for `step`.
DcpOutput plan_dcp_output(const ModelInfo& model, DType dtype, const formats::dcp::Target& target,
                          const std::function<pickle::ValuePtr(int)>& step, bool own_dtypes = false);

// The optimizer states' dtype as written: "fp32", or the option name of the 16-bit float their source
// stored them in ("bf16"; "as stored" when they differ).
std::string optimizer_dtype_name(const ModelInfo& model);

// The target written (dcp_target's): {"dtype", "optimizer_dtype", "mesh": "whole"|"rows", "world"}
// (the summary's `target`).
nlohmann::json dcp_target_json(const formats::dcp::Target& target, DType dtype, const std::string& optimizer_dtype);

// A save plan as --plan describes it: `entries`, `tensor_entries`, `items`, `files` (each data file
// with its rank and item count, and `.metadata`) and `plan` (every entry's chunks, each file's items).
nlohmann::json save_plan_description(const formats::dcp::SavePlan& plan);

// --plan's description: format, dtype, target, entries and items per file.
nlohmann::json dcp_output_json(const DcpOutput& out);

struct DcpWritten {
  uint64_t bytes = 0;  // data files and .metadata
  size_t files = 0;    // data files and .metadata
  size_t items = 0;
};

// Writes `out` into the existing empty folder `dir` (a staging folder the caller commits); `durable`
// as WriteOptions::durable; `checkpoint_id`: the final path recorded in StorageMeta.
DcpWritten write_dcp_output(const DcpOutput& out, const ModelInfo& model, UniversalReader& reader,
                            const std::string& dir, const std::string& checkpoint_id);

}  // namespace ucpkit::reshard
