// Small file helpers shared by the tests/core files.
#pragma once
#include <filesystem>
#include <string>

#include "support/files.h"

namespace coretest {

// The whole file's bytes (tests/support's file_bytes, for paths).
inline std::string slurp(const std::filesystem::path& p) { return ucpkit::testing::file_bytes(p.string()); }

// The number of entries directly inside `dir`.
inline size_t entries(const std::filesystem::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace coretest
