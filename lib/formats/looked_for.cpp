// What the readers look for in a folder (looked_for.h).
#include "formats/looked_for.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "core/staging.h"

namespace ucpkit::formats {

bool is_checkpoint_entry(const std::string& n) {
  static const char* const kNames[] = {"manifest.json", "plan.json", "latest", "latest_universal", ".metadata",
                                       "metadata.json", "common.pt", "model.safetensors.index.json",
                                       "ucpkit_layout.json", "latest_checkpointed_iteration.txt"};
  static const char* const kPrefixes[] = {"global_step", "iter_", "mp_rank_", "zero_pp_rank_", "__"};
  static const char* const kSuffixes[] = {".safetensors", ".distcp", ".pt"};
  auto starts = [&](const char* p) { return n.rfind(p, 0) == 0; };
  auto ends = [&](const char* s) {
    const size_t k = std::strlen(s);
    return n.size() >= k && n.compare(n.size() - k, k, s) == 0;
  };
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* k) { return n == k; }) ||
         std::any_of(std::begin(kPrefixes), std::end(kPrefixes), starts) ||
         std::any_of(std::begin(kSuffixes), std::end(kSuffixes), ends);
}

namespace {
// Registered when libucpkit is loaded: every tool's StagingDir asks it.
[[maybe_unused]] const bool kRegistered = (set_checkpoint_entry_test(&is_checkpoint_entry), true);
}  // namespace

}  // namespace ucpkit::formats
