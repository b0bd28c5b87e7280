// DCP -> DCP through the reader and the writer.
#include "formats/dcp/rewrite.h"

#include <algorithm>
#include <filesystem>
#include <map>

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

WriteResult rewrite_dcp(const std::string& in, const std::string& out, const std::optional<Target>& target,
                        WriteOptions options, const std::string& metadata_file) {
  const Reader reader(in, metadata_file);
  if (!options.planner_data) options.planner_data = planner_data_of(reader.metadata().path);
  auto bytes = [&reader](const Entry& e) { return reader.read_bytes(e.fqn); };
  if (target) {
    const SavePlan plan = make_save_plan(reader.metadata().entries, *target);
    return write_dcp(plan, chunks_of_whole([&reader](const Entry& e) { return reader.read_tensor(e.fqn); }, bytes), out,
                     options);
  }
  ChunkSource source{[&reader](const Entry& e, size_t k) { return reader.read_chunk(e.fqn, k); }, bytes};
  return write_dcp(plan_as_stored(reader.metadata()), source, out, options);
}

}  // namespace ucpkit::formats::dcp
