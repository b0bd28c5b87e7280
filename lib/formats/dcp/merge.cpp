// Rank-local DCP parts merged into one reshardable DCP folder through the reader and the writer.
#include "formats/dcp/merge.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "core/error.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/reader.h"

namespace ucpkit::formats::dcp {

namespace fs = std::filesystem;

namespace {

struct Origin {
  size_t part, chunk;  // chunk: index in the part's entry (PlannedItem::kBytes for bytes items)
};

// The merged entries and where each chunk comes from.
struct Merged {
  SavePlan plan;
  std::vector<std::vector<Origin>> origin;  // per merged entry, per chunk (bytes: one)
  std::vector<std::string> last_file;       // per merged entry: the last part's metadata that added to it
  size_t replicas = 0;
};

void add_part(Merged& m, std::map<std::string, size_t>& index, const Reader& r, size_t p,
              const std::vector<std::unique_ptr<Reader>>& readers) {
  const Metadata& md = r.metadata();
  for (const Entry& e : md.entries) {
    const std::string what = "DCP merge: '" + escaped_brief(e.fqn) + "' ";
    auto [it, fresh] = index.try_emplace(e.fqn, m.plan.entries.size());
    if (fresh) {
      m.plan.entries.push_back({e.fqn, e.is_bytes, e.dtype, e.size, {}});
      m.origin.emplace_back();
      m.last_file.push_back(md.path);
    }
    const size_t k = it->second;
    Entry& into = m.plan.entries[k];
    if (into.is_bytes != e.is_bytes || (!e.is_bytes && (into.dtype != e.dtype || into.size != e.size)))
      fail(md.path, what + "differs from the earlier part's (" + m.last_file[k] + "): kind, dtype or global size");
    m.last_file[k] = md.path;
    if (e.is_bytes) {
      if (fresh) {
        m.origin[k].push_back({p, PlannedItem::kBytes});
      } else {
        if (readers[m.origin[k][0].part]->read_bytes(e.fqn) != r.read_bytes(e.fqn))
          fail(md.path, what + "holds other bytes than in " + readers[m.origin[k][0].part]->metadata().path);
        ++m.replicas;
      }
      continue;
    }
    for (size_t c = 0; c < e.chunks.size(); ++c) {
      const Chunk& ch = e.chunks[c];
      auto same = std::find_if(into.chunks.begin(), into.chunks.end(),
                               [&](const Chunk& x) { return x.offsets == ch.offsets && x.sizes == ch.sizes; });
      if (same == into.chunks.end()) {
        into.chunks.push_back(ch);
        m.origin[k].push_back({p, c});
        continue;
      }
      const Origin& o = m.origin[k][static_cast<size_t>(same - into.chunks.begin())];
      if (!readers[o.part]->read_chunk(e.fqn, o.chunk).equal(r.read_chunk(e.fqn, c)))
        fail(md.path, what + "chunk " + std::to_string(c) + " holds other values than the same box in " +
                          readers[o.part]->metadata().path);
      ++m.replicas;
    }
  }
}

// planner_data of every part, merged into `options` (the first wins); none when a part has none.
void merge_planner_data(const std::vector<std::unique_ptr<Reader>>& readers, WriteOptions& options) {
  bool other = false;
  for (const auto& r : readers) {
    if (!r->metadata().has_planner_data()) return;
    other = other || r->metadata().other_planner_data;
  }
  if (!other) {  // DefaultSavePlanner's paths in every part
    auto all = std::make_shared<PlannerPaths>();
    for (const auto& r : readers) all->add_all(*r->metadata().planner);
    options.planner = std::move(all);
    return;
  }
  pickle::ValuePtr all = pickle::Value::dict();  // a custom planner's in some part: its str keys, as pickled
  std::map<std::string, bool> seen;
  for (const auto& r : readers) {
    const Metadata& md = r->metadata();
    const pickle::ValuePtr pd = md.other_planner_data ? md.other_planner_data : md.planner->value();
    if (pd->kind != pickle::Kind::Dict) return;
    for (const auto& [k, v] : pd->entries)
      if (k->kind == pickle::Kind::Str && seen.emplace(k->s, true).second) all->entries.emplace_back(k, v);
  }
  options.other_planner_data = std::move(all);
}

}  // namespace

std::vector<RankLocalPart> rank_local_parts(const std::string& dir) {
  if (fs::exists(fs::path(dir) / ".metadata"))
    fail(dir, "DCP merge: the folder has a global .metadata already (not a rank-local save)");
  const Folder f = find_folder(dir);  // the one discovery of rank_<n>/ and __<n>.metadata parts
  if (f.kind != FolderKind::RankLocal)
    fail(dir, "DCP merge: no rank-local parts (rank_<n>/.metadata or __<n>.metadata)");
  std::vector<RankLocalPart> parts;
  for (size_t r = 0; r < f.metadata_files.size(); ++r)
    parts.push_back({f.data_dirs[r].empty() ? dir : (fs::path(dir) / f.data_dirs[r]).string(), f.metadata_files[r]});
  return parts;
}

MergeResult merge_rank_local(const std::vector<RankLocalPart>& parts, const std::string& out, WriteOptions options) {
  std::vector<std::unique_ptr<Reader>> readers;
  for (const auto& part : parts) readers.push_back(std::make_unique<Reader>(part.dir, part.metadata_file));
  Merged m;
  std::map<std::string, size_t> index;
  for (size_t p = 0; p < parts.size(); ++p) add_part(m, index, *readers[p], p, readers);
  for (size_t k = 0; k < m.plan.entries.size(); ++k)
    if (!m.plan.entries[k].is_bytes) check_chunks_cover(m.plan.entries[k], m.last_file[k]);
  // Each part's chunks go into its own data file, in merged-entry order.
  std::map<size_t, PlannedFile> files;
  for (size_t k = 0; k < m.plan.entries.size(); ++k)
    for (size_t c = 0; c < m.origin[k].size(); ++c) {
      const size_t p = m.origin[k][c].part;
      PlannedFile& f = files[p];
      f.rank = static_cast<int64_t>(p);
      f.relative_path = data_file_name(f.rank);
      f.items.push_back({k, m.plan.entries[k].is_bytes ? PlannedItem::kBytes : c});
    }
  for (auto& [p, f] : files) m.plan.files.push_back(std::move(f));
  m.plan.mesh = {static_cast<int64_t>(parts.size())};
  if (!options.planner && !options.other_planner_data) merge_planner_data(readers, options);
  ChunkSource source;
  source.chunk = [&](const Entry& e, size_t c) {
    const Origin& o = m.origin[index.at(e.fqn)][c];
    return readers[o.part]->read_chunk(e.fqn, o.chunk);
  };
  source.bytes = [&](const Entry& e) { return readers[m.origin[index.at(e.fqn)][0].part]->read_bytes(e.fqn); };
  MergeResult result;
  result.written = write_dcp(m.plan, source, out, options);
  result.replicas = m.replicas;
  return result;
}

}  // namespace ucpkit::formats::dcp
