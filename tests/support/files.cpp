// Test helpers: file and folder bytes.
#include "support/files.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace ucpkit::testing {

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::map<std::string, std::string> tree_bytes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[fs::relative(e.path(), dir).string()] = file_bytes(e.path().string());
  return m;
}

TempDir::TempDir(const std::string& prefix) {
  std::string t = (std::filesystem::temp_directory_path() / (prefix + ".XXXXXX")).string();
  if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp " + t + " failed");
  path_ = t;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace ucpkit::testing
