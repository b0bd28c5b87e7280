// DCP item transforms (torch >= 2.7 FileSystemWriter `_extensions`): an item written through stream
// extensions lists their descriptors in `_StorageInfo.transform_descriptors`, "name[@domain]/version"
// (torch 2.14.1 checkpoint/_extension.py:56-61), in the order the load side applies them: the first
// one reads the stored bytes (filesystem.py:281 lists them reversed from the writer's chain,
// :831-842 and _extension.py:199-222 wrap the raw stream in list order). The one built-in extension
// is ZStandard, "stream.zstd/1" (_extension.py:91-119). docs/formats-dcp.md.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ucpkit::formats::dcp {

// Throws Error naming `name` unless every descriptor is one this reader decodes: "stream.zstd" with a
// version whose major part is 1 (torch's own test, _extension.py:96-99).
void check_transforms(const std::vector<std::string>& descriptors, const std::string& name);

// The item's bytes as torch.save (or the bytes item) wrote them: `stored` with every transform undone,
// in list order. A zstd stream must decode completely (one or more whole frames, nothing after them):
// a frame cut short, a corrupt frame or trailing bytes are an Error naming `name`, and so is a stream
// that decodes to more than `max_bytes` (a tensor chunk's zip is its data plus small records: the
// reader passes the chunk's size plus 1 MiB, so a damaged or hostile frame cannot fill the memory).
std::vector<uint8_t> undo_transforms(std::span<const uint8_t> stored, const std::vector<std::string>& descriptors,
                                     const std::string& name, uint64_t max_bytes = UINT64_MAX);

}  // namespace ucpkit::formats::dcp
