// Option spellings on the command line.
#include "tool/typed_name.h"

namespace ucpkit::tool {

std::string typed_name(const std::vector<std::string>& args, const std::vector<std::string>& names) {
  std::string typed = names.at(0);
  for (const auto& a : args) {
    if (a == "--") break;
    for (const auto& n : names)
      if (a == n || a.rfind(n + "=", 0) == 0) typed = n;
  }
  return typed;
}

}  // namespace ucpkit::tool
