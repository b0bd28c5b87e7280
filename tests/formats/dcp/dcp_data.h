// The committed real DCP fixtures (tests/formats/dcp/data, README.md there) and whole-file reads.
#pragma once
#include <fstream>
#include <sstream>
#include <string>

namespace ucpkit::testing {

inline const std::string kDcpData = std::string(UCPKIT_SOURCE_DIR) + "/tests/formats/dcp/data";

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace ucpkit::testing
