// The manifest of one committed step in one store tier: what was saved, where its bytes are, and the
// bookkeeping the next save and a restore need (token counts, last-saved steps). JSON schema and
// binder in one place; the file carries a checksum of its own content.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pec/checkpoint.h"
#include "pec/policy.h"
#include "pec/record_crcs.h"
#include "pec/source_layout.h"
#include "pec/tier.h"
#include "pec/tokens.h"

namespace ucpkit::pec {

inline constexpr const char* kManifestFormat = "ucpkit-pec-manifest/1";

struct ChunkRef {
  std::string object;  // object id
  uint64_t size = 0;   // uncompressed bytes
  uint64_t stored = 0;  // bytes on disk when written (statistics only)
};

// One file of the checkpoint, relative to the step folder, split into chunks.
struct FileEntry {
  std::string path;
  uint64_t size = 0;
  std::string digest;  // DigestChain over the chunks' bytes
  std::vector<ChunkRef> chunks;
  // Expert fragments inside a shared file (checkpoint.h); the chunks then hold those ranges' bytes
  // concatenated. None for a whole file.
  std::optional<std::vector<ByteRange>> ranges;
  // Non-expert shared file stored with the expert ranges cut out (checkpoint.h).
  std::optional<CutList> cut;
  // Shared files: the CRC-32 of each expert range at this save, certified by the source's record
  // CRCs (pec/record_crcs.h). A non-expert entry lists every expert range of the file, an expert
  // entry its own. None in manifests of older pec-save releases.
  std::optional<std::vector<RangeCrc>> range_crcs;
};

struct ExpertEntry {
  int moe_layer = 0;
  int expert = 0;
  std::vector<FileEntry> files;
};

struct Manifest {
  int64_t step = 0;
  Tier tier = Tier::durable;
  SourceLayout layout = SourceLayout::DeepSpeedMoe;
  std::string tag;     // folder name of the step in the source checkpoint (global_step<N>, ...)
  MoeShape shape;
  std::string policy;
  int k = 0;                  // --k of this tier (0 with the budget policy)
  uint64_t budget_bytes = 0;  // byte budget of the budget policy (0 otherwise)
  std::vector<int> k_per_layer;  // experts the policy selected per MoE layer (bootstrap additions excluded)
  int64_t save_index = 0;
  TokenMatrix tokens_interval;    // since the previous save (empty when unknown)
  TokenMatrix tokens_cumulative;  // since the first save this store chain saw
  bool tokens_known = false;
  std::vector<std::vector<int64_t>> last_saved_step;  // per expert, after this commit, in this tier
  TokenMatrix unsaved_tokens;                          // per expert, after this commit
  bool non_expert_pruned = false;  // garbage collection removed the non-expert state of this step
  std::vector<FileEntry> non_expert;
  std::vector<ExpertEntry> experts;
  nlohmann::json stats = nlohmann::json::object();
  nlohmann::json source = nlohmann::json::object();  // layout-specific facts (root files, ...)

  const ExpertEntry* find_expert(int moe_layer, int expert) const;
};

// Makes the chunks' `stored` statistic independent of thread timing: an object written by this save
// counts its bytes once, at the first chunk naming it in manifest order (non-expert files, then the
// experts'), and 0 at every other; an object that was already stored counts 0 everywhere. Which of
// several parallel jobs holding the same bytes wrote the object (or whether two both did) no longer
// changes the manifest.
void attribute_stored_once(Manifest& m);

// One file entry's JSON form, as in a manifest's "non_expert" and "files" lists (the MPI ranks of
// pec-save send their entries to rank 0 in it). file_from_json checks the path and object ids (Error
// naming `name`); a missing key throws nlohmann::json::exception.
nlohmann::json file_to_json(const FileEntry& f);
FileEntry file_from_json(const nlohmann::json& j, const std::string& name);

nlohmann::json manifest_to_json(const Manifest& m);
// Checks format and checksum; throws Error naming `name` when the manifest is damaged.
Manifest manifest_from_json(const nlohmann::json& j, const std::string& name);
// Serialized text with the checksum field filled in.
std::string manifest_text(const Manifest& m);
Manifest parse_manifest(const std::string& text, const std::string& name);

}  // namespace ucpkit::pec
