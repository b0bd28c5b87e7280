// Confined names and outputs kept apart from inputs.
#include "core/confine.h"

#include <cstdio>

#include "core/error.h"

namespace fs = std::filesystem;

namespace ucpkit {

namespace {

fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) r = fs::absolute(p, ec).lexically_normal();
  // "a/b/" and "a/b" are the same folder.
  if (!r.has_filename() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
  return r;
}

}  // namespace

bool is_confined_name(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.find('\0') != std::string::npos) return false;
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

fs::path confined_path(const fs::path& dir, const std::string& name, const std::string& source, const std::string& what) {
  if (!is_confined_name(name))
    fail(source, what + " '" + escaped_brief(name) + "' is not a relative path inside " + dir.string() +
                     " (absolute, '..', '.' or empty parts are refused)");
  return dir / name;
}

bool path_within(const fs::path& inner, const fs::path& outer) {
  const fs::path a = resolved(inner), b = resolved(outer);
  auto ai = a.begin();
  for (auto bi = b.begin(); bi != b.end(); ++bi, ++ai)
    if (ai == a.end() || *ai != *bi) return false;
  return true;
}

void refuse_output_over_input(const fs::path& output, const std::string& output_option, const fs::path& input,
                              const std::string& input_option) {
  const bool out_in = path_within(output, input), in_out = path_within(input, output);
  if (!out_in && !in_out) return;
  const std::string how = out_in && in_out ? "is" : out_in ? "lies inside" : "holds";
  throw UsageError(output_option + " " + output.string() + " " + how + " " + input_option + " " + input.string() +
                   ": writing it would replace or change the input (choose an output outside the input)");
}

}  // namespace ucpkit
