// Byte sizes on the command line.
#include "tool/size.h"

#include <cctype>
#include <cmath>

#include "core/error.h"

namespace ucpkit::tool {

namespace {
constexpr const char kUnits[] = "KMGT";
}  // namespace

uint64_t parse_size(const std::string& text, const std::string& option) {
  auto bad = [&](const std::string& why) {
    return UsageError(option + " " + escaped_brief(text) + ": " + why +
                      " (a size is bytes, or a number with K, M, G or T: binary multiples, e.g. 64K, 256M, 5G)");
  };
  size_t i = 0;
  uint64_t whole = 0;
  bool digits = false;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, digits = true) {
    if (whole > (UINT64_MAX - 9) / 10) throw bad("too large");
    whole = whole * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  std::string fraction;
  if (i < text.size() && text[i] == '.') {
    for (++i; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) fraction += text[i];
    if (fraction.empty()) throw bad("not a number");
  }
  if (!digits) throw bad(!text.empty() && text[0] == '-' ? "must not be negative" : "not a number");
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!unit.empty() && unit != "B") {
    const char* at = std::char_traits<char>::find(kUnits, 4, unit[0]);
    if (!at) throw bad("unknown unit '" + text.substr(i) + "'");
    shift = 10 * static_cast<int>(at - kUnits + 1);
    const std::string rest = unit.substr(1);
    if (rest == "B") throw bad("decimal units are ambiguous: write " + text.substr(0, i + 1) + " (2^" +
                               std::to_string(shift) + ") or the number of bytes");
    if (!rest.empty() && rest != "IB") throw bad("unknown unit '" + text.substr(i) + "'");
  }
  if (shift < 64 && whole > (uint64_t{1} << (63 - shift))) throw bad("too large");
  uint64_t bytes = whole << shift;
  // The fraction times the multiple must be a whole number of bytes: digits d1..dn give
  // (d1..dn << shift) / 10^n, exact only when 10^n divides it.
  if (!fraction.empty()) {
    if (fraction.size() > 12) throw bad("too many decimals");
    uint64_t num = std::stoull(fraction), den = 1;
    for (size_t k = 0; k < fraction.size(); ++k) den *= 10;
    const __uint128_t scaled = static_cast<__uint128_t>(num) << shift;
    if (scaled % den != 0) throw bad("not a whole number of bytes");
    bytes += static_cast<uint64_t>(scaled / den);
  }
  if (bytes > (uint64_t{1} << 63)) throw bad("too large");
  return bytes;
}

std::string size_text(uint64_t bytes) {
  int shift = 0;
  while (shift < 40 && bytes != 0 && bytes % (uint64_t{1} << (shift + 10)) == 0) shift += 10;
  return std::to_string(bytes >> shift) + (shift ? std::string(1, kUnits[shift / 10 - 1]) : "");
}

}  // namespace ucpkit::tool
