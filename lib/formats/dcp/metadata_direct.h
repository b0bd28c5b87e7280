// DCP `.metadata` read in one pass over its opcodes into Metadata, without the general unpickler's value
// tree (io/pickle): torch's FileSystemWriter pickles one Metadata with protocol 4, every object memoized,
// and building a shared Value for each of its millions of objects was most of a 100,000-tensor reshard's
// parse. Only the opcodes and classes such a save holds are taken, each object is a 16-byte node (a torch.Size one);
// anything else, and anything damaged or ambiguous, gives nullopt, and parse_metadata then reads the
// file with the general unpickler, which takes every pickle and words every error. So both give the same
// Metadata for any file this one takes (tests/formats/dcp/metadata_direct_test.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "formats/dcp/metadata.h"

namespace ucpkit::formats::dcp {

// The Metadata of `bytes` (its indexes built, `name` as its path), or nullopt when the file is not of the
// shape read here.
std::optional<Metadata> parse_metadata_direct(std::span<const uint8_t> bytes, const std::string& name);

}  // namespace ucpkit::formats::dcp
