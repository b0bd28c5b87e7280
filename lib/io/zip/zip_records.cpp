// CRC-32 fix-up of zip records patched in place.
#include "io/zip/zip_records.h"

namespace ucpkit {
void store_zip_crc(uint64_t size, const ZipRecord& r, uint32_t crc, const std::function<void(uint64_t, size_t, uint8_t*)>& read,
                   const std::function<void(uint64_t, uint32_t)>& write) {
  write(r.central_entry + kCentralCrcField, crc);
  uint8_t flags[2];
  read(r.local_header + 6, 2, flags);
  if (flags[0] & 0x8) {
    // CRC and sizes follow the data in a data descriptor (torch.save writes them this way).
    uint64_t d = r.data_offset + r.size;
    uint8_t sig[4] = {0, 0, 0, 0};
    if (d + 4 <= size) read(d, 4, sig);
    if (d + 4 <= size && sig[0] == 0x50 && sig[1] == 0x4b && sig[2] == 0x07 && sig[3] == 0x08) d += 4;
    if (d + 4 <= size) write(d, crc);
  } else {
    write(r.local_header + kLocalCrcField, crc);
  }
}

}  // namespace ucpkit
