// Shared helpers for the placement tests: paths to ../shared/data and small builders.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace placement_test {

// The repository root: $UCPKIT_SOURCE, else three levels above this header.
inline std::filesystem::path source_root() {
  if (const char* src = std::getenv("UCPKIT_SOURCE")) return src;
  std::filesystem::path file(__FILE__);
  if (file.is_relative()) {
    // ccache's base_dir makes __FILE__ relative to the build folder (Ninja compiles from there):
    // <build>/tests/test_placement -> <build>.
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) file = self.parent_path().parent_path() / file;
  }
  return file.lexically_normal().parent_path().parent_path().parent_path();
}

// The folder with the tools: $UCPKIT_BIN, else <build>/bin beside <build>/tests/test_placement.
inline std::string tool_dir() {
  if (const char* bin = std::getenv("UCPKIT_BIN")) return bin;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : (self.parent_path().parent_path() / "bin").string();
}

// $UCPKIT_SOURCE/../shared/data/<name>, or "" when absent.
inline std::string shared_data(const std::string& name) {
  std::filesystem::path root = source_root();
  auto p = root / ".." / "shared" / "data" / name;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

}  // namespace placement_test
