// The zip records' CRC-32 check of a file whose bytes were partly read already (ucp-load's direct
// mode reads the source shards piece by piece, in any order, and checksums each piece as it is
// read): the known pieces are combined (crc32_combine) and only the bytes no piece covered are
// read, with pread, so each byte of the file is read once for the copy and the check together.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ucpkit {

// The CRC-32 of bytes [offset, offset + size) of a file, computed by whoever read them.
struct KnownCrc {
  uint64_t offset = 0, size = 0;
  uint32_t crc = 0;
};

// Checks every record's CRC-32 against the central directory of the zip file `path`, from `known`
// (any order; overlapping or duplicated pieces allowed: a piece starting inside bytes already
// accounted for is used only if it starts exactly where they end, else the rest is read) and the
// bytes read for what no piece covers. Throws Error naming the file and the record on a mismatch
// ("--no-verify skips this check"). A file that is no zip archive (legacy torch.save) has no
// CRC-32 and is not read. Returns the bytes read.
uint64_t check_zip_crcs(const std::string& path, std::vector<KnownCrc> known);

}  // namespace ucpkit
