// The committed real Megatron-Core torch_dist fixtures (tests/formats/megatron_core/data, README.md there).
#pragma once
#include <string>

namespace ucpkit::testing {

inline const std::string kMcoreData = std::string(UCPKIT_SOURCE_DIR) + "/tests/formats/megatron_core/data";

}  // namespace ucpkit::testing
