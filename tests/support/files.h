// Tiny file helpers shared by test binaries: a file's bytes, every file's bytes under a folder, a
// temporary folder removed with its contents when the test is done.
#pragma once
#include <filesystem>
#include <map>
#include <string>

namespace ucpkit::testing {

// The whole file's bytes; empty when it cannot be read (a log a command never wrote).
std::string file_bytes(const std::string& path);

// Relative path -> bytes of every regular file under `dir` (recursively), for byte-exact comparisons.
std::map<std::string, std::string> tree_bytes(const std::string& dir);

// A new folder under the system's temporary folder (`<prefix>.XXXXXX`), removed with what it holds on
// destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ucpkit_test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace ucpkit::testing
