// ucp-load --input <DCP folder> --format dcp: the DCP rewritten whole (whole_rewrite.h),
// every entry as saved: model tensors and buffers of any dtype, optimizer states, the non-tensor items
// (LR scheduler, dataloader position, train state, param_groups) and the keys the source was saved
// under (torchtitan's top-level model keys and `optimizer.*`, or get_state_dict's `model.*` /
// `optim.*`), so the code that saved it loads it back. --world-size N re-chunks every tensor into
// FSDP2's Shard(0) layout over N ranks (1: whole on one rank; left out: the chunks as stored);
// --dtype converts the parameters (state_keys.h parameter_keys), never buffers or counters.
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "core/exit_release.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/reader.h"
#include "formats/dcp/rewrite.h"
#include "formats/dcp/save_plan.h"
#include "formats/dcp/state_keys.h"
#include "io/dtype.h"
#include "reshard/dcp_output.h"
#include "reshard/whole_rewrite.h"

namespace ucpkit::reshard {
namespace {

namespace dcp = formats::dcp;

std::optional<dcp::Target> target_of(const LoadOptions& o) {
  if (o.given.world_size <= 0) return std::nullopt;
  return o.given.world_size > 1 ? dcp::Target::rows(o.given.world_size) : dcp::Target::whole();
}

// --dtype: the parameters whose dtype differs, to the dtype asked for.
std::map<std::string, DType> conversions(const LoadOptions& o, const dcp::Metadata& md, bool* all_floating) {
  std::map<std::string, DType> out;
  if (!o.given.dtype) return out;
  for (const std::string& k : dcp::parameter_keys(md, all_floating))
    if (md.find(k)->dtype != o.target.dtype) out[k] = o.target.dtype;
  return out;
}

nlohmann::json target_json(const LoadOptions& o, const dcp::SavePlan& plan) {
  const auto t = target_of(o);
  return {{"mesh", t ? std::string(dcp::target_kind_name(t->kind)) : std::string("as stored")},
          {"world", plan.mesh.empty() ? 1 : plan.mesh[0]},
          {"dtype", o.given.dtype ? std::string(dtype_option_name(o.target.dtype)) : std::string("as stored")}};
}

nlohmann::json describe(const LoadOptions& o, const dcp::SavePlan& plan, const std::map<std::string, DType>& convert) {
  size_t tensors = 0, chunks = 0;
  for (const auto& e : plan.entries)
    if (!e.is_bytes) ++tensors, chunks += e.chunks.size();
  nlohmann::json j = {{"input_kind", "dcp"},
                      {"target", target_json(o, plan)},
                      {"entries", plan.entries.size()},
                      {"tensors", tensors},
                      {"bytes_entries", plan.entries.size() - tensors},
                      {"items", chunks + plan.entries.size() - tensors}};
  auto& c = j["converted"] = nlohmann::json::array();
  for (const auto& [k, d] : convert) c.push_back(k);
  return j;
}

const WholeRewrite kDcpRewrite{
    [](const LoadOptions& o) {
       const dcp::Metadata md = dcp::read_folder_metadata(dcp::find_folder(o.input));
       const auto convert = conversions(o, md, nullptr);
       const dcp::SavePlan plan = dcp::rewrite_plan(md, target_of(o), convert);
       nlohmann::json j = save_plan_description(plan);
       j.update(describe(o, plan, convert));
       j["format"] = "dcp";
       j["route"] = "whole";
       return j;
     },
     [](const LoadOptions& o, const std::string& staged) {
       const dcp::Folder folder = dcp::find_folder(o.input);
       auto reader_owned = std::make_unique<const dcp::Reader>(folder.dir, dcp::read_folder_metadata(folder));
       const dcp::Reader& reader = *reader_owned;
       bool all_floating = false;
       const auto convert = conversions(o, reader.metadata(), &all_floating);
       if (o.given.dtype && all_floating && !convert.empty())
         o.reporter.warning(o.input + " holds no optimizer state, so nothing tells its parameters from its float "
                            "buffers: --dtype converts every floating-point model tensor (" +
                            std::to_string(convert.size()) + ")");
       dcp::WriteOptions wo;
       wo.checkpoint_id = std::filesystem::absolute(o.output).lexically_normal().string();
       auto plan_owned = std::make_unique<const dcp::SavePlan>(dcp::rewrite_plan(reader.metadata(), target_of(o), convert));
       const dcp::SavePlan& plan = *plan_owned;
       auto w = std::make_unique<const dcp::WriteResult>(
           dcp::rewrite_dcp_into(reader, plan, staged, target_of(o).has_value(), convert, wo));
       nlohmann::json j = describe(o, plan, convert);
       size_t files = 0;
       uint64_t written = 0;
       for (const auto& f : std::filesystem::directory_iterator(staged)) ++files, written += std::filesystem::file_size(f);
       j["files_written"] = files;
       j["bytes_written"] = written;
       j["data_bytes_written"] = w->bytes;
       // 10^5 entries each: freed by the process's exit when the tool asks for it (core/exit_release.h).
       release(std::move(w));
       release(std::move(plan_owned));
       release(std::move(reader_owned));
       return j;
     }};

// Every flavour the DCP reader reads (dcp::Reader: one global .metadata, rank-local __<r>.metadata
// files, HuggingFaceStorageWriter's safetensors) is rewritten whole the same way (torch
// 2.15's rank-local and safetensors saves of an int64 buffer went through the universal form, which
// refused it).
[[maybe_unused]] const bool kDcpRewriteRegistered = register_whole_rewrite("dcp", OutputFormat::Dcp, kDcpRewrite) &&
                                          register_whole_rewrite("dcp-rank-local", OutputFormat::Dcp, kDcpRewrite) &&
                                          register_whole_rewrite("dcp-safetensors", OutputFormat::Dcp, kDcpRewrite);

}  // namespace
}  // namespace ucpkit::reshard
