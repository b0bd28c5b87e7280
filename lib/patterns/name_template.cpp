#include "patterns/name_template.h"

#include <cctype>

namespace ucpkit::patterns {

bool match_name_template(const std::string& pattern, const std::string& name, std::map<std::string, long>& values) {
  size_t p = 0, n = 0;
  while (p < pattern.size()) {
    if (pattern[p] == '{') {
      const size_t close = pattern.find('}', p);
      if (close == std::string::npos) return false;
      const std::string key = pattern.substr(p, close + 1 - p);
      size_t e = n;
      while (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
      if (e == n || e - n > 9) return false;
      const long v = std::stol(name.substr(n, e - n));
      if (auto it = values.find(key); it != values.end() && it->second != v) return false;
      values[key] = v;
      n = e;
      p = close + 1;
    } else {
      if (n >= name.size() || name[n] != pattern[p]) return false;
      ++n;
      ++p;
    }
  }
  return n == name.size();
}

std::string substitute_placeholder(std::string s, const std::string& key, long v) {
  for (size_t at; (at = s.find(key)) != std::string::npos;) s.replace(at, key.size(), std::to_string(v));
  return s;
}

}  // namespace ucpkit::patterns
