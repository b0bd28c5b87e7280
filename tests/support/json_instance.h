// nlohmann::json's members compiled once for all test files (json_instance.cpp) instead of in each of them:
// part of the tests' precompiled header (tests/CMakeLists.txt), a test file compiles in about a sixth less time
// unoptimized (docs/notes/ci-times.md). Inline members may still be inlined where a binary is optimized.
#pragma once

#include <nlohmann/json.hpp>

extern template class nlohmann::basic_json<>;
