// DCP save plans: torch's per-rank DTensor boxes, replica deduplication and the global chunk order
// (sources: torch 2.6 distributed/tensor/_utils.py, tensor/placement_types.py
// Shard._local_shard_size_on_dim, checkpoint/_dedup_save_plans.py, checkpoint/default_planner.py
// create_default_global_save_plan).
#include "formats/dcp/save_plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string_view>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "core/error.h"
#include "core/name_table.h"

namespace ucpkit::formats::dcp {

namespace {

// Shard._local_shard_size_on_dim(size, chunks, rank, return_offset=True): torch.chunk's split.
std::pair<int64_t, int64_t> shard_size_and_offset(int64_t size, int64_t chunks, int64_t rank) {
  if (size % chunks == 0) return {size / chunks, size / chunks * rank};
  const int64_t full = (size + chunks - 1) / chunks;
  const int64_t start = full * rank;
  if (size < start) return {0, size};
  return {std::min(size, start + full) - start, start};
}

uint64_t chunk_bytes(const Entry& e, const Chunk& c) {
  uint64_t n = dtype_size(e.dtype);
  for (int64_t s : c.sizes) n *= static_cast<uint64_t>(s);
  return n;
}

// The first fqn listed twice, or nullptr.
const std::string* repeated_fqn(const std::vector<Entry>& entries) {
  NameTable names;
  names.reserve(entries.size());
  auto name_of = [&entries](uint32_t k) -> std::string_view { return entries[k].fqn; };
  for (size_t k = 0; k < entries.size(); ++k)
    if (names.add(entries[k].fqn, static_cast<uint32_t>(k), name_of)) return &entries[k].fqn;
  return nullptr;
}

// [first, last] ranks holding a box, ascending: the first run in place (most boxes have one, which then needs no
// allocation of its own).
struct PlanRuns {
  std::pair<int64_t, int64_t> first{-1, -1};
  std::vector<std::pair<int64_t, int64_t>> more;
  void add(int64_t r) {
    auto& last = more.empty() ? first : more.back();
    if (first.first < 0) first = {r, r};
    else if (last.second == r - 1) last.second = r;
    else more.push_back({r, r});
  }
  template <class F>
  void each(F&& f) const {
    f(first);
    for (const auto& x : more) f(x);
  }
};

// Sorts `v`, a sequence of runs each in order, by merging neighbouring runs until one is left: a rank's boxes come in
// one run per first holder (std::sort of them did not make use of that).
template <class Less>
void merge_runs(std::vector<size_t>& v, Less less) {
  std::vector<size_t> starts{0};
  for (size_t i = 1; i < v.size(); ++i)
    if (less(v[i], v[i - 1])) starts.push_back(i);
  while (starts.size() > 1) {
    std::vector<size_t> merged;
    for (size_t r = 0; r < starts.size(); r += 2) {
      merged.push_back(starts[r]);
      if (r + 1 == starts.size()) break;
      const size_t end = r + 2 < starts.size() ? starts[r + 2] : v.size();
      std::inplace_merge(v.begin() + static_cast<std::ptrdiff_t>(starts[r]),
                         v.begin() + static_cast<std::ptrdiff_t>(starts[r + 1]),
                         v.begin() + static_cast<std::ptrdiff_t>(end), less);
    }
    starts = std::move(merged);
  }
}

}  // namespace

std::string_view target_kind_name(Target::Kind kind) {
  switch (kind) {
    case Target::Kind::Whole: return "whole";
    case Target::Kind::Replicated: return "replicated";
    case Target::Kind::Rows: return "rows";
    case Target::Kind::Columns: return "columns";
    case Target::Kind::Grid: return "grid";
  }
  return "?";
}

std::vector<int64_t> mesh_shape(const Target& t) {
  if (t.world < 1) throw UsageError("DCP target: world size " + std::to_string(t.world) + " (must be >= 1)");
  switch (t.kind) {
    case Target::Kind::Whole: return {1};
    case Target::Kind::Replicated:
    case Target::Kind::Rows:
    case Target::Kind::Columns: return {t.world};
    case Target::Kind::Grid:
      if (t.cols < 1 || t.world % t.cols != 0)
        throw UsageError("DCP target: a " + std::to_string(t.cols) + "-column grid does not divide " +
                         std::to_string(t.world) + " ranks");
      return {t.world / t.cols, t.cols};
  }
  return {1};
}

std::vector<Placement> placements_for(const Target& t, size_t ndim) {
  switch (t.kind) {
    case Target::Kind::Whole:
    case Target::Kind::Replicated: return {Placement::replicate()};
    case Target::Kind::Rows: return {ndim >= 1 ? Placement::shard(0) : Placement::replicate()};
    case Target::Kind::Columns:
      return {ndim >= 2 ? Placement::shard(1) : ndim == 1 ? Placement::shard(0) : Placement::replicate()};
    case Target::Kind::Grid:
      if (ndim >= 2) return {Placement::shard(0), Placement::shard(1)};
      if (ndim == 1) return {Placement::shard(0), Placement::replicate()};
      return {Placement::replicate(), Placement::replicate()};
  }
  return {};
}

Chunk local_box(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh,
                const std::vector<int64_t>& coordinate, const std::vector<Placement>& placements) {
  Chunk c{std::vector<int64_t>(shape.size(), 0), shape};
  for (size_t m = 0; m < placements.size() && m < mesh.size(); ++m) {
    const int d = placements[m].dim;
    if (d < 0) continue;
    if (static_cast<size_t>(d) >= shape.size())
      throw Error("DCP plan: Shard(" + std::to_string(d) + ") of a " + std::to_string(shape.size()) + "-d tensor");
    const auto [size, local_offset] = shard_size_and_offset(c.sizes[d], mesh[m], coordinate[m]);
    c.sizes[d] = size;
    // torch: an offset already set by an earlier mesh dim is added to, else replaced.
    if (c.offsets[d] <= local_offset)
      c.offsets[d] = local_offset;
    else
      c.offsets[d] += local_offset;
  }
  return c;
}

std::string data_file_name(int64_t rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

SavePlan make_save_plan(const std::vector<Entry>& entries, const Target& target, bool fqns_unique) {
  SavePlan plan;
  plan.mesh = mesh_shape(target);
  int64_t world = 1;
  for (int64_t m : plan.mesh) world *= m;
  if (const std::string* twice = fqns_unique ? nullptr : repeated_fqn(entries))
    throw Error("DCP plan: '" + escaped_brief(*twice) + "' is listed twice");
  for (const Entry& in : entries)
    for (int64_t s : in.size)
      if (s < 0) throw Error("DCP plan: '" + escaped_brief(in.fqn) + "' has a negative size");
  // Each rank's local plan holds one box per entry, in state-dict order (bytes items on every rank).
  // Nothing here is kept per rank: a box a million ranks hold (a scalar, a bytes item, the empty
  // rows past the end of a small tensor) is one box with the runs of consecutive ranks holding it,
  // so a plan grows with the distinct boxes, not with --world-size. Entries are independent: each one's boxes
  // are found on the cores at once (on one, a plan of 100,000 entries was a tenth of a reshard).
  struct Held {
    Chunk box;
    PlanRuns runs;
    uint64_t weight = 0;  // its bytes (a bytes item: 1)
  };
  std::vector<std::vector<Held>> boxes(entries.size());  // per entry: its boxes, in the order of their first rank
  plan.entries.resize(entries.size());
  tbb::parallel_for(tbb::blocked_range<size_t>(0, entries.size(), 512), [&](const tbb::blocked_range<size_t>& range) {
    std::vector<int64_t> coord(plan.mesh.size());
    std::vector<std::optional<std::vector<Placement>>> placements_of;  // by the number of dims, made once
    for (size_t k = range.begin(); k != range.end(); ++k) {
      const Entry& in = entries[k];
      Entry& e = plan.entries[k];
      e = Entry{in.fqn, in.is_bytes, in.dtype, in.is_bytes ? std::vector<int64_t>{} : in.size, {}};
      if (placements_of.size() <= e.size.size()) placements_of.resize(e.size.size() + 1);
      auto& made = placements_of[e.size.size()];
      if (!made) made = placements_for(target, e.size.size());
      const std::vector<Placement>& placements = *made;
      std::vector<Held>& mine = boxes[k];
      // A box is found among the entry's first few by comparing them (most entries have one box per rank of a few,
      // or one for all); past kFew, through an index.
      constexpr size_t kFew = 8;
      std::map<std::vector<int64_t>, size_t> index;
      for (int64_t r = 0; r < world; ++r) {
        for (size_t m = plan.mesh.size(), rest = static_cast<size_t>(r); m-- > 0;) {
          coord[m] = static_cast<int64_t>(rest % static_cast<size_t>(plan.mesh[m]));
          rest /= static_cast<size_t>(plan.mesh[m]);
        }
        Chunk box = e.is_bytes ? Chunk{} : local_box(e.size, plan.mesh, coord, placements);
        size_t h = mine.size();
        for (size_t j = 0; j < std::min(mine.size(), kFew) && h == mine.size(); ++j)
          if (mine[j].box.offsets == box.offsets) h = j;
        if (h == mine.size() && mine.size() > kFew)
          if (const auto it = index.find(box.offsets); it != index.end()) h = it->second;
        if (h == mine.size()) {
          if (mine.size() >= kFew) index.emplace(box.offsets, mine.size());
          mine.push_back({std::move(box), {}});
        }
        mine[h].runs.add(r);
      }
      for (Held& x : mine) x.weight = e.is_bytes ? 1 : chunk_bytes(e, x.box);
      if (!e.is_bytes) e.chunks.reserve(mine.size());  // each box is one rank's chunk
    }
  });
  // dedup_save_plans' order: first appearance over the ranks (rank by rank, each rank's entries in order), so by
  // the first rank holding a box, then by entry (a rank holds one box of an entry).
  std::vector<size_t> start(static_cast<size_t>(world) + 1, 0);
  for (const auto& mine : boxes)
    for (const Held& x : mine) ++start[static_cast<size_t>(x.runs.first.first) + 1];
  for (size_t r = 0; r < static_cast<size_t>(world); ++r) start[r + 1] += start[r];
  std::vector<std::pair<size_t, size_t>> held(start.back());  // (entry, its box)
  for (size_t k = 0; k < boxes.size(); ++k)
    for (size_t j = 0; j < boxes[k].size(); ++j)
      held[start[static_cast<size_t>(boxes[k][j].runs.first.first)]++] = {k, j};
  // dedup_save_plans: each box goes to the holder with the fewest planned bytes so far, the lowest rank
  // on ties (bytes items weigh 1).
  std::vector<uint64_t> planned(static_cast<size_t>(world), 0);
  std::map<int64_t, std::vector<size_t>> owned;  // rank -> its boxes (ascending entry: its local order)
  for (size_t h = 0; h < held.size(); ++h) {
    const Held& x = boxes[held[h].first][held[h].second];
    int64_t best = -1;
    x.runs.each([&](const std::pair<int64_t, int64_t>& run) {
      for (int64_t r = run.first; r <= run.second; ++r)
        if (best < 0 || planned[r] < planned[best]) best = r;
    });
    planned[best] += x.weight;
    owned[best].push_back(h);
  }
  // The global plan: rank by rank, each kept item appends its chunk to its tensor's list.
  for (auto& [r, mine] : owned) {
    merge_runs(mine, [&](size_t a, size_t b) { return held[a].first < held[b].first; });
    PlannedFile f{r, data_file_name(r), {}};
    f.items.reserve(mine.size());
    for (size_t h : mine) {
      const auto [k, j] = held[h];
      Entry& e = plan.entries[k];
      if (e.is_bytes) {
        f.items.push_back({k, PlannedItem::kBytes});
      } else {
        f.items.push_back({k, e.chunks.size()});
        e.chunks.push_back(std::move(boxes[k][j].box));
      }
    }
    plan.files.push_back(std::move(f));
  }
  return plan;
}

std::string plan_json(const SavePlan& plan) {
  nlohmann::ordered_json j;
  j["mesh"] = plan.mesh;
  auto& entries = j["entries"] = nlohmann::ordered_json::array();
  for (const Entry& e : plan.entries) {
    nlohmann::ordered_json x;
    x["fqn"] = e.fqn;
    if (e.is_bytes) {
      x["bytes"] = true;
    } else {
      x["dtype"] = std::string(dtype_name(e.dtype));
      x["size"] = e.size;
      auto& chunks = x["chunks"] = nlohmann::ordered_json::array();
      for (const Chunk& c : e.chunks) chunks.push_back({{"offsets", c.offsets}, {"sizes", c.sizes}});
    }
    entries.push_back(std::move(x));
  }
  auto& files = j["files"] = nlohmann::ordered_json::array();
  for (const PlannedFile& f : plan.files) {
    nlohmann::ordered_json x;
    x["rank"] = f.rank;
    x["relative_path"] = f.relative_path;
    auto& items = x["items"] = nlohmann::ordered_json::array();
    for (const PlannedItem& it : f.items) {
      nlohmann::ordered_json i;
      i["fqn"] = plan.entries[it.entry].fqn;
      if (it.chunk == PlannedItem::kBytes)
        i["bytes"] = true;
      else
        i["offsets"] = plan.entries[it.entry].chunks[it.chunk].offsets;
      items.push_back(std::move(i));
    }
    files.push_back(std::move(x));
  }
  return j.dump(1);
}

}  // namespace ucpkit::formats::dcp
