// Command-line paths made absolute.
#include "pec/paths.h"

#include <filesystem>

namespace fs = std::filesystem;

namespace ucpkit::pec {

std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  if (ec) return path;  // no working folder: the path as given (opening it names it)
  fs::path out;
  for (const auto& part : abs) {
    const std::string s = part.string();
    if (s.empty() || s == ".") continue;
    out /= part;
  }
  if (out.filename() == "..") {
    const fs::path canonical = fs::weakly_canonical(out, ec);
    if (!ec) out = canonical;
  }
  return out.string();
}

void make_absolute(std::initializer_list<std::string*> paths) {
  for (std::string* p : paths) *p = absolute_path(*p);
}

}  // namespace ucpkit::pec
