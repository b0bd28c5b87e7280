// Byte sizes on the command line: one syntax for every size option of every tool.
#pragma once
#include <cstdint>
#include <string>

namespace ucpkit::tool {

// Parses a size: a plain number of bytes (`1048576`), or a number with a binary multiple, K = 2^10,
// M = 2^20, G = 2^30, T = 2^40 (`64K`, `256M`, `5G`, `1.5G`; case-insensitive; `KiB`/`MiB`/`GiB`/`TiB`
// and a trailing `B` accepted). The decimal units `KB`/`MB`/`GB`/`TB` are refused (1000 or 1024?).
// Throws UsageError naming `option` and the text when it is not a size, is negative, has a fraction
// of a byte, or is over 2^63 bytes.
uint64_t parse_size(const std::string& text, const std::string& option);

// The shortest exact form parse_size reads back: `256M`, `5G`, `1536` (bytes when no multiple divides).
std::string size_text(uint64_t bytes);

}  // namespace ucpkit::tool
