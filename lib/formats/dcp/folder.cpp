// DCP folder kinds and rank-local metadata merged (folder.h).
#include "formats/dcp/folder.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/file_io.h"
#include "core/error.h"
#include "core/json_input.h"
#include "formats/dcp/safetensors_flavour.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::dcp {

namespace {

// torch.distributed.checkpoint.filesystem `_metadata_fn` (2.6: filesystem.py:63).
constexpr const char* kMetadataName = ".metadata";
// megatron/core/dist_checkpointing/core.py:13 (core_v0.19.0) CONFIG_FNAME; CheckpointingConfig :33.
constexpr const char* kMcoreConfigName = "metadata.json";

// A name the readers look for that is there but is no regular file (a FIFO, a device, a folder) is
// refused by name here, before anything could block reading it.
bool is_file(const fs::path& p) {
  std::error_code ec;
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return false;
  if (const std::string kind = special_file_kind(st.st_mode); !kind.empty())
    fail(p.string(), "is " + kind + ", not a regular file; nothing was read from it");
  return true;
}

// `<prefix><digits><suffix>` -> the number, or -1.
long rank_of(const std::string& name, std::string_view prefix, std::string_view suffix) {
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 7 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stol(digits);
}

// `__<rank>_<k>.distcp` (a rank's data file) -> the rank, or -1.
long data_rank_of(const std::string& name) {
  const auto u = name.find('_', 2);
  if (u == std::string::npos || rank_of(name.substr(u), "_", ".distcp") < 0) return -1;
  return rank_of(name.substr(0, u), "__", "");
}

// Rank-local files or folders, keyed by rank; they must number 0..n-1.
bool rank_local(Folder& f) {
  std::map<long, std::pair<std::string, std::string>> by_rank;  // rank -> (metadata file, data dir)
  long data_rank = -1;  // the highest rank of a __<rank>_<k>.distcp data file
  std::string data_file;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(f.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (long r = rank_of(name, "__", ".metadata"); r >= 0 && e.is_regular_file(ec))
      by_rank[r] = {e.path().string(), ""};
    else if (long q = rank_of(name, "rank_", ""); q >= 0 && is_file(e.path() / kMetadataName))
      by_rank[q] = {(e.path() / kMetadataName).string(), name};
    else if (long d = data_rank_of(name); d > data_rank)
      data_rank = d, data_file = name;
  }
  if (by_rank.empty()) return false;
  // A rank whose metadata is missing while its data file is there: name that rank, not the others.
  if (by_rank.begin()->second.second.empty() && data_rank >= 0 && !by_rank.count(data_rank))
    throw Error(f.dir + ": rank-local DCP checkpoint without __" + std::to_string(data_rank) + ".metadata (the metadata of rank " +
                std::to_string(data_rank) + ", whose data file " + data_file + " is there)");
  long want = 0;
  for (const auto& [r, files] : by_rank) {
    if (r != want)
      throw Error(f.dir + ": rank-local DCP checkpoint without the metadata of rank " + std::to_string(want) +
                  " (found ranks up to " + std::to_string(by_rank.rbegin()->first) + ")");
    ++want;
    f.metadata_files.push_back(files.first);
    f.data_dirs.push_back(files.second);
  }
  f.kind = FolderKind::RankLocal;
  return true;
}

std::string backend_of(const fs::path& config) {
  const std::string file = config.string();
  const nlohmann::json j = parse_json_input(read_text_file(file), file);
  if (!j.is_object() || !j.contains("sharded_backend") || !j["sharded_backend"].is_string())
    throw Error(file + ": a Megatron-Core metadata.json without a sharded_backend string");
  // CheckpointingConfig.sharded_backend_version (dist_checkpointing/core.py:23-34, default 1): the
  // torch_dist load strategy reads version 1 only and refuses others; so does this reader.
  if (j.contains("sharded_backend_version")) {
    const auto& v = j["sharded_backend_version"];
    if (!v.is_number_integer() || v.get<int64_t>() != 1)
      throw Error(file + ": Megatron-Core sharded_backend_version " + escaped_brief(v.dump(), 40) +
                  " (the torch_dist layout read here is version 1)");
  }
  return j["sharded_backend"].get<std::string>();
}

bool same_box(const Chunk& a, const Chunk& b) { return a.offsets == b.offsets && a.sizes == b.sizes; }

}  // namespace

std::string_view folder_kind_name(FolderKind kind) {
  switch (kind) {
    case FolderKind::None: return "none";
    case FolderKind::Global: return "dcp";
    case FolderKind::RankLocal: return "dcp-rank-local";
    case FolderKind::TorchDist: return "torch_dist";
    case FolderKind::Safetensors: return "dcp-safetensors";
  }
  return "?";
}

Folder find_folder(const std::string& path) {
  Folder f;
  f.dir = path;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return f;
  const fs::path dir(path);
  const bool global = is_file(dir / kMetadataName);
  if (is_file(dir / kMcoreConfigName) && global) {
    f.sharded_backend = backend_of(dir / kMcoreConfigName);
    if (f.sharded_backend != "torch_dist")
      throw Error((dir / kMcoreConfigName).string() + ": Megatron-Core sharded backend '" +
                  escaped_brief(f.sharded_backend) + "' (only torch_dist, which is DCP, is read)");
    f.kind = FolderKind::TorchDist;
  } else if (global) {
    f.kind = FolderKind::Global;
  } else if (!rank_local(f)) {
    f.metadata_files = safetensors_flavour_files(path);  // reads their headers
    if (!f.metadata_files.empty()) {
      f.kind = FolderKind::Safetensors;
      f.data_dirs.assign(f.metadata_files.size(), "");
    }
    return f;
  }
  if (f.kind != FolderKind::RankLocal) {
    f.metadata_files = {(dir / kMetadataName).string()};
    f.data_dirs = {""};
  }
  return f;
}

namespace {

// Adds `part` (rank `r`'s metadata, its items under `data_dir`) to `out`.
void merge_part(Metadata& out, const Metadata& part, const std::string& data_dir) {
  std::map<std::pair<std::string, std::vector<int64_t>>, bool> keep;  // (fqn, chunk offsets) -> taken from this part
  for (const Entry& e : part.entries) {
    Entry* have = out.find(e.fqn);
    if (!have) {
      out.add_entry(e);
      for (const Chunk& c : e.chunks) keep[{e.fqn, c.offsets}] = true;
      if (e.is_bytes) keep[{e.fqn, {}}] = true;
      continue;
    }
    if (have->is_bytes != e.is_bytes || (!e.is_bytes && (have->dtype != e.dtype || have->size != e.size)))
      fail(part.path, "DCP metadata: '" + escaped_brief(e.fqn) + "' differs from the lower ranks' entry (" +
                          (e.is_bytes || have->is_bytes ? std::string("bytes vs tensor")
                                                        : std::string("dtype or global size")) + ")");
    Entry& into = *have;
    for (const Chunk& c : e.chunks) {
      const bool replica = std::any_of(into.chunks.begin(), into.chunks.end(), [&](const Chunk& x) { return same_box(x, c); });
      if (!replica) into.chunks.push_back(c);
      keep[{e.fqn, c.offsets}] = !replica;
    }
  }
  for (const Item& it : part.items) {
    const auto k = keep.find({it.fqn, it.offset.value_or(std::vector<int64_t>{})});
    if (k == keep.end() || !k->second) continue;
    Item copy = it;
    if (!data_dir.empty()) copy.storage.relative_path = data_dir + "/" + it.storage.relative_path;
    out.items.push_back(std::move(copy));
  }
}

}  // namespace

int world_size_of(const Metadata& md, const Folder& folder) {
  if (folder.kind == FolderKind::RankLocal) return static_cast<int>(folder.metadata_files.size());
  if (folder.kind == FolderKind::Safetensors) return safetensors_world_size(folder.metadata_files);
  long top = -1;
  auto see = [&](const std::string& name) {
    const size_t us = name.find('_', 2);
    if (name.rfind("__", 0) != 0 || us == std::string::npos || name.size() < 7 ||
        name.compare(name.size() - 7, 7, ".distcp") != 0)
      return;
    const std::string digits = name.substr(2, us - 2);
    if (!digits.empty() && digits.size() <= 7 && std::all_of(digits.begin(), digits.end(), ::isdigit))
      top = std::max(top, std::stol(digits));
  };
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder.dir, ec)) see(e.path().filename().string());
  for (const Item& it : md.items) see(fs::path(it.storage.relative_path).filename().string());
  return static_cast<int>(top + 1);
}

Metadata read_folder_metadata(const Folder& folder) {
  if (folder.metadata_files.empty()) throw Error(folder.dir + ": not a DCP checkpoint folder (no .metadata)");
  if (folder.kind == FolderKind::Safetensors) return read_safetensors_metadata(folder.metadata_files);
  if (folder.kind != FolderKind::RankLocal) return read_metadata(folder.metadata_files[0]);
  Metadata out;
  std::shared_ptr<PlannerPaths> planner;
  for (size_t r = 0; r < folder.metadata_files.size(); ++r) {
    const Metadata part = read_metadata(folder.metadata_files[r]);
    if (r == 0) {
      out.path = part.path;
      out.era = part.era;
      out.checkpoint_id = part.checkpoint_id;
      out.version = part.version;
    } else if (part.era != out.era) {
      fail(part.path, "DCP metadata: class-path era " + std::string(era_name(part.era)) + " differs from rank 0's");
    }
    if (part.planner) {  // every rank's paths, the first wins (as merge.h merges them)
      if (!planner) planner = std::make_shared<PlannerPaths>();
      planner->add_all(*part.planner);
    }
    merge_part(out, part, folder.data_dirs[r]);
  }
  out.planner = std::move(planner);
  index_metadata(out);
  return out;
}

}  // namespace ucpkit::formats::dcp
