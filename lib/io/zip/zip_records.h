// Fixing the CRC-32 of a stored zip record after its bytes were patched in place. Used to copy expert
// slices in and out of torch.save optimizer files without re-serializing them (so untouched bytes
// stay identical); where each record lies comes from io/zip/zip_directory (read_zip_directory).
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "io/zip/zip_directory.h"

namespace ucpkit {

// Writes a record's CRC-32 into a file of `file_size` bytes not held in memory: its central entry
// and its data descriptor (or local header), through `read(offset, n, out)` / `write(offset, crc)`.
void store_zip_crc(uint64_t file_size, const ZipRecord& r, uint32_t crc,
                   const std::function<void(uint64_t, size_t, uint8_t*)>& read,
                   const std::function<void(uint64_t, uint32_t)>& write);

}  // namespace ucpkit
