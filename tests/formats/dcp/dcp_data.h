// The committed real DCP fixtures (tests/formats/dcp/data, README.md there), a Metadata as text, whole-file
// reads, and a damaged copy of one.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include "core/error.h"
#include "formats/dcp/reader.h"
#include "io/dtype.h"

namespace ucpkit::testing {

inline const std::string kDcpData = std::string(UCPKIT_SOURCE_DIR) + "/tests/formats/dcp/data";

inline std::string metadata_ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t k = 0; k < v.size(); ++k) s += (k ? "," : "") + std::to_string(v[k]);
  return s + "]";
}

// A `.metadata` as text, one line per entry, item and optional field (metadata_test.cpp's Python prints the
// same from pickle's own reading).
inline std::string describe_metadata(const formats::dcp::Metadata& md) {
  std::ostringstream o;
  for (const formats::dcp::Entry& e : md.entries) {
    if (e.is_bytes) {
      o << "B " << e.fqn << "\n";
      continue;
    }
    o << "E " << e.fqn << " " << dtype_name(e.dtype) << " " << metadata_ints(e.size);
    for (const formats::dcp::Chunk& c : e.chunks) o << " " << metadata_ints(c.offsets) << metadata_ints(c.sizes);
    o << "\n";
  }
  for (const formats::dcp::Item& it : md.items) {
    o << "I " << it.fqn << " " << (it.offset ? metadata_ints(*it.offset) : "None") << " " << it.storage.relative_path << " "
      << it.storage.offset << " " << it.storage.length;
    for (const auto& t : it.storage.transform_descriptors) o << " " << t;
    o << "\n";
  }
  // planner_data's paths, listed by key
  std::map<std::string, std::vector<std::string>> paths;
  for (size_t k = 0; md.planner && k < md.planner->size(); ++k)
    paths[std::string(md.planner->flat(k))] = md.planner->strings(md.planner->flat(k));
  for (const auto& [flat, path] : paths) {
    o << "F " << flat;
    for (const auto& p : path) o << " " << p;
    o << "\n";
  }
  if (md.checkpoint_id) o << "C " << *md.checkpoint_id << "\n";
  if (md.save_id) o << "S " << *md.save_id << "\n";
  if (md.version) o << "V " << *md.version << "\n";
  return o.str();
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Copies the folder `from` to `dir` and flips one bit inside the first chunk of `fqn` there, found by
// the tensor's first 64 bytes inside its item (row-sharded, they are the chunk's first bytes). Returns
// the data file changed.
inline std::string flip_first_chunk(const std::string& from, const std::string& fqn, const std::string& dir) {
  std::filesystem::copy(from, dir, std::filesystem::copy_options::recursive);
  const formats::dcp::Reader clean(dir);
  const Tensor whole = clean.read_tensor(fqn);
  const auto* e = clean.metadata().find(fqn);
  EXPECT_NE(e, nullptr);
  const auto& item = clean.metadata().item_of(e->fqn, &e->chunks[0].offsets);
  const std::string file = dir + "/" + item.storage.relative_path;
  std::string bytes = slurp(file);
  const auto first = whole.contiguous().contiguous_bytes().subspan(0, 64);
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(first.data()), first.size()), item.storage.offset);
  EXPECT_NE(at, std::string::npos);
  EXPECT_LT(at, item.storage.offset + item.storage.length);
  bytes[at + 5] ^= 0x10;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  return file;
}

// Expects `f` to throw a one-line CRC-32 mismatch Error naming `file`.
inline void expect_crc_error(const std::function<void()>& f, const std::string& file) {
  try {
    f();
    ADD_FAILURE() << "a flipped bit went through";
  } catch (const Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find(file), std::string::npos) << m;
    EXPECT_NE(m.find("CRC-32 mismatch"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace ucpkit::testing
