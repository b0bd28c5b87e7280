// Small file helpers shared by the tests/core files.
#pragma once
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace coretest {

// The whole file's bytes.
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The number of entries directly inside `dir`.
inline size_t entries(const std::filesystem::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace coretest
