// Stopgap until io/pickle accepts hashable objects as dict keys (Python hashes a frozen dataclass;
// our VM refuses any non-builtin key: "unhashable dict key of type object"). DCP's storage_data is a
// dict keyed by MetadataIndex objects, so `.metadata` cannot be unpickled as written. This rewrites,
// in a copy of the pickle and byte for byte (same length, so protocol-4 FRAME sizes stay right), the
// storage_data dict into a list [key0, value0, key1, value1, ...]: its EMPTY_DICT becomes EMPTY_LIST
// and each of its SETITEMS batches an APPENDS; a one-item dict (EMPTY_DICT key value SETITEM)
// becomes the tuple (None, key, value) (NONE ... TUPLE3). Located by walking the opcodes: the EMPTY_DICT that is
// the value of the 'storage_data' key of the top-level Metadata state (mark depth 1).
// Remove when io/pickle keys objects by identity (the report of issue 30's first slice asks for it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ucpkit::formats::dcp {

// The pickle with storage_data as a flat key/value list; unchanged when there is no such dict.
// Throws Error naming `name` on an opcode it cannot step over.
std::vector<uint8_t> storage_data_as_list(std::vector<uint8_t> pickle, const std::string& name);

}  // namespace ucpkit::formats::dcp
