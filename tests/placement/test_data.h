// Shared helpers for the placement tests: paths to ../shared/data and small builders.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace placement_test {

// $UCPKIT_SOURCE/../shared/data/<name>, or "" when absent.
inline std::string shared_data(const std::string& name) {
  const char* src = std::getenv("UCPKIT_SOURCE");
  std::filesystem::path root = src ? src : ".";
  auto p = root / ".." / "shared" / "data" / name;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

}  // namespace placement_test
