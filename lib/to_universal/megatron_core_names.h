// ucp-union --to-names megatron-core | megatron-deepspeed: a universal folder rewritten into the other
// naming (docs/megatron-core-mapping.md). Pure re-indexing, one parameter at a time: renames and row
// permutations (formats/megatron_core/deepspeed_map), every bit kept.
//  * megatron-core: a Megatron-DeepSpeed-named universal folder (ucp-union of a DeepSpeed checkpoint) ->
//    Megatron-Core names (docs/formats-megatron-core.md "Universal names"); the Megatron-DeepSpeed facts a
//    way back needs (the original manifest entries, patterns, model-file copies under megatron_deepspeed/)
//    are recorded in manifest.json source.megatron_core_names.
//  * megatron-deepspeed: such a folder -> the Megatron-DeepSpeed-named universal folder again, which
//    ucp-load --format deepspeed reads (values from the Megatron-Core-named state files; everything else
//    from the record). A Megatron-Core-named folder without the record (ucp-union of a torch_dist save)
//    takes the record from --template (the Megatron-DeepSpeed model files cannot be synthesized).
//    The Megatron-Core-named folder also gets megatron_core/common_state.pt (Megatron-DeepSpeed's args as
//    Megatron-Core's, formats/megatron_core/deepspeed_common_state) for ucp-load --format torch_dist.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "core/reporter.h"
#include "to_universal/convert.h"

namespace ucpkit::to_universal {

enum class NamesTarget { MegatronCore, MegatronDeepSpeed };

struct NamesOptions {
  NamesTarget target = NamesTarget::MegatronCore;
  std::string map_file;  // --model-map; empty: the shipped family maps, the family detected
  // --template (megatron-deepspeed only): a universal folder giving the Megatron-DeepSpeed facts (names,
  // patterns, model files, DeepSpeed optimizer state): the Megatron-DeepSpeed one, or its --to-names
  // megatron-core folder; for inputs without the record (ucp-union of a torch_dist save)
  std::string template_dir;
  int threads = 0;
  bool overwrite = false;
  bool sync = true;
  Reporter reporter;
  std::string* family = nullptr;  // when set: receives "<family> (<map origin>)" of the map used
};

// Whether a universal manifest's source (manifest.json "source") is a Megatron-Core-named folder made by
// --to-names megatron-core (ucp-load --format deepspeed cannot read it; ucp-info describes it from the
// manifest alone).
bool is_megatron_core_named(const nlohmann::json& source);

// Whether `dir` holds a ucpkit universal manifest.
bool is_universal_folder(const std::string& dir);

// Rewrites universal folder `input` into `output` (staged, committed atomically). Throws Error naming
// the file or parameter on any mismatch (nothing left at `output`).
RunSummary rename_universal(const std::string& input, const std::string& output, const NamesOptions& options);

}  // namespace ucpkit::to_universal
