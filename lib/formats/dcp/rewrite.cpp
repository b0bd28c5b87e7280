// DCP -> DCP through the reader and the writer.
#include "formats/dcp/rewrite.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "formats/dcp/read_ahead.h"
#include "formats/dcp/reader.h"

namespace ucpkit::formats::dcp {

int64_t rank_of_data_file(const std::string& relative_path) {
  const std::string name = std::filesystem::path(relative_path).filename().string();
  if (name.size() < 4 || name.compare(0, 2, "__") != 0) return 0;
  int64_t r = 0;
  size_t k = 2;
  for (; k < name.size() && k < 20 && name[k] >= '0' && name[k] <= '9'; ++k) r = r * 10 + (name[k] - '0');
  return k > 2 && k < name.size() && name[k] == '_' ? r : 0;
}

SavePlan plan_as_stored(const Metadata& md) {
  SavePlan plan;
  plan.mesh = {1};
  plan.entries = md.entries;
  std::map<int64_t, PlannedFile> files;
  for (size_t k = 0; k < plan.entries.size(); ++k) {
    const Entry& e = plan.entries[k];
    auto put = [&](size_t chunk, const std::vector<int64_t>* offsets) {
      const int64_t r = rank_of_data_file(md.item_of(e.fqn, offsets).storage.relative_path);
      PlannedFile& f = files[r];
      f.rank = r;
      f.relative_path = data_file_name(r);
      f.items.push_back({k, chunk});
    };
    if (e.is_bytes)
      put(PlannedItem::kBytes, nullptr);
    else
      for (size_t c = 0; c < e.chunks.size(); ++c) put(c, &e.chunks[c].offsets);
  }
  for (auto& [r, f] : files) {
    plan.mesh[0] = std::max(plan.mesh[0], r + 1);
    plan.files.push_back(std::move(f));
  }
  return plan;
}

namespace {

// The data of rewrite_plan(reader's metadata, target, convert): tensors read whole and cut for a
// target, else chunk by chunk as stored; the entries in `convert` converted.
ChunkSource source_of(const Reader& reader, bool whole, const std::map<std::string, DType>& convert, const SavePlan& plan) {
  auto converted = [&convert](const Entry& e, Tensor t) {
    const auto it = convert.find(e.fqn);
    return it == convert.end() || t.dtype() == it->second ? t : t.to(it->second);
  };
  auto bytes = [&reader](const Entry& e) { return reader.read_bytes(e.fqn); };
  // Whole tensors read ahead on another core while the chunks of the one before are written (read_ahead.h).
  // A tensor saved whole and kept in its dtype is a view of its item: its bytes are copied once, by the writer, from
  // the map into the data file's block (each copy in between was a pass over a 2.6-GB reshard's bytes).
  if (whole)
    return chunks_of_whole(read_ahead(
                               [&reader, &convert, converted](const Entry& e) {
                                 if (!convert.contains(e.fqn))
                                   if (auto t = reader.view_tensor(e.fqn)) return std::move(*t);
                                 return converted(e, reader.read_tensor(e.fqn));
                               },
                               read_order(plan)),
                           bytes);
  return {[&reader, converted](const Entry& e, size_t k) { return converted(e, reader.read_chunk(e.fqn, k)); }, bytes};
}

// The source's planner_data, unless the options give one.
void keep_planner_data(WriteOptions& options, const Metadata& md) {
  if (options.planner || options.other_planner_data) return;
  options.planner = md.planner;
  options.other_planner_data = md.other_planner_data;
}

}  // namespace

SavePlan rewrite_plan(const Metadata& md, const std::optional<Target>& target, const std::map<std::string, DType>& convert) {
  // A Metadata's index holding each entry once: no fqn is listed twice (index_entries and add_entry keep it so).
  SavePlan plan = target ? make_save_plan(md.entries, *target, md.entry_names.size() == md.entries.size())
                         : plan_as_stored(md);
  for (Entry& e : plan.entries)
    if (const auto it = convert.find(e.fqn); it != convert.end() && !e.is_bytes) e.dtype = it->second;
  return plan;
}

WriteResult rewrite_dcp(const std::string& in, const std::string& out, const std::optional<Target>& target,
                        WriteOptions options, const std::string& metadata_file) {
  const Reader reader(in, metadata_file);
  keep_planner_data(options, reader.metadata());
  const SavePlan plan = rewrite_plan(reader.metadata(), target, {});
  return write_dcp(plan, source_of(reader, target.has_value(), {}, plan), out, options);
}

WriteResult rewrite_dcp_into(const Reader& reader, const SavePlan& plan, const std::string& dir, bool rechunked,
                             const std::map<std::string, DType>& convert, WriteOptions options) {
  keep_planner_data(options, reader.metadata());
  // write_dcp stages its own folder: inside `dir`, then its files move up (one file system, renames).
  options.durable = false;
  options.overwrite = false;
  if (options.checkpoint_id.empty()) options.checkpoint_id = std::filesystem::absolute(dir).lexically_normal().string();
  const std::filesystem::path inner = std::filesystem::path(dir) / ".dcp";
  WriteResult result =
      write_dcp(plan, source_of(reader, rechunked, convert, plan), inner.string(), options);
  for (const auto& f : std::filesystem::directory_iterator(inner))
    std::filesystem::rename(f.path(), std::filesystem::path(dir) / f.path().filename());
  std::filesystem::remove(inner);
  return result;
}

}  // namespace ucpkit::formats::dcp
