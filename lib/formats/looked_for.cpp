// What the readers look for in a folder (looked_for.h).
#include "formats/looked_for.h"

#include "core/staging.h"

namespace ucpkit::formats {

// The names of each format's folders are registered with it (detect.h); ucp-load's record of the layout
// it wrote is ucpkit's own.
bool is_checkpoint_entry(const std::string& n) { return n == "ucpkit_layout.json" || registered_entry(n); }

namespace {
// Registered when libucpkit is loaded: every tool's StagingDir asks it.
[[maybe_unused]] const bool kLookedForRegistered = (set_checkpoint_entry_test(&is_checkpoint_entry), true);
}  // namespace

}  // namespace ucpkit::formats
