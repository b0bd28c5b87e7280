// Rank-local DCP saves -> one reshardable DCP folder. A rank-local save (torch 2.6:
// save_state_dict(..., no_dist=True) per rank into its own folder; later torch: `__{rank}.metadata`
// per rank in one folder, no global `.metadata`) cannot be loaded at another world size: no file
// lists every rank's chunks. Merging the per-rank metadata gives that file: every part's entries and
// chunks in one `.metadata` (each part's data in its own `__{part}_0.distcp`), written by our writer.
#pragma once
#include <string>
#include <vector>

#include "formats/dcp/writer.h"

namespace ucpkit::formats::dcp {

struct RankLocalPart {
  std::string dir;            // the folder holding the part's data files
  std::string metadata_file;  // its metadata (dir/.metadata, or dir/__{rank}.metadata)
};

// The parts of a rank-local save under `dir`: `rank_<n>/.metadata` subfolders, else
// `__<n>.metadata` files, in rank order. Throws Error naming `dir` when it has none, or when it
// already has a global `.metadata` (nothing to merge).
std::vector<RankLocalPart> rank_local_parts(const std::string& dir);

struct MergeResult {
  WriteResult written;
  size_t replicas = 0;  // chunks and bytes items found in several parts with the same contents (kept once)
};

// Merges `parts` into the DCP folder `out`. An fqn in several parts must agree on kind, dtype and
// global size; a chunk (same box) or bytes item in several parts must hold the same bytes (kept
// once, from the first part); the union of a tensor's chunks must tile it. Any disagreement is one
// Error naming the part's metadata file; nothing is written then. planner_data: the parts' merged.
MergeResult merge_rank_local(const std::vector<RankLocalPart>& parts, const std::string& out, WriteOptions options = {});

}  // namespace ucpkit::formats::dcp
