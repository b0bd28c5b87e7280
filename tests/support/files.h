// Tiny file helpers shared by test binaries: a file's bytes, every file's bytes under a folder.
#pragma once
#include <map>
#include <string>

namespace ucpkit::testing {

// The whole file's bytes; empty when it cannot be read (a log a command never wrote).
std::string file_bytes(const std::string& path);

// Relative path -> bytes of every regular file under `dir` (recursively), for byte-exact comparisons.
std::map<std::string, std::string> tree_bytes(const std::string& dir);

}  // namespace ucpkit::testing
