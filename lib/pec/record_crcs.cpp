// Expert range CRC-32s of a shared file, each touched record checked against its zip entry.
#include "pec/record_crcs.h"

#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>

#include "core/crc32.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/mapped_file.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {

std::string crc_hex(uint32_t c) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x00000000";
  for (int i = 0; i < 8; ++i) s[9 - i] = digits[(c >> (4 * i)) & 15];
  return s;
}

std::vector<RangeCrc> expert_range_crcs(const SourceCheckpoint& src, const std::string& rel, bool check) {
  auto it = src.expert_ranges.find(rel);
  if (it == src.expert_ranges.end()) return {};
  const std::vector<ByteRange>& ranges = it->second;
  const std::string path = (fs::path(src.root) / rel).string();
  std::map<std::string, ZipRecord> records;
  {
    auto f = MappedFile::open(path);  // the zip directory's pages only
    records = read_zip_directory(f->bytes(), path);
  }
  std::vector<RangeCrc> out(ranges.size());
  std::map<std::string, std::vector<size_t>> by_record;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ByteRange& r = ranges[i];
    auto rec = records.find(r.record);
    if (rec == records.end()) fail(path, "has no record '" + escaped_brief(r.record) + "' for an expert range");
    if (r.offset > rec->second.size || r.length > rec->second.size - r.offset)
      fail(path, "record '" + escaped_brief(r.record) + "' is smaller than an expert range in it");
    out[i] = {r.record, r.offset, r.length, 0};
    by_record[r.record].push_back(i);
  }
  UniqueFd fd = open_input(path, "checkpoint file");
  std::vector<uint8_t> buf(size_t{1} << 20);
  for (auto& [name, idx] : by_record) {
    const ZipRecord& rec = records.at(name);
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return ranges[a].offset < ranges[b].offset; });
    uint32_t whole = 0;
    size_t first = 0;
    // One sequential pass over the record: its CRC and every range's.
    for (uint64_t pos = 0; pos < rec.size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), rec.size - pos));
      pread_exact(fd.get(), buf.data(), n, rec.data_offset + pos, path);
      whole = crc32_update(whole, {buf.data(), n});
      const uint64_t b0 = pos, b1 = pos + n;
      while (first < idx.size() && ranges[idx[first]].offset + ranges[idx[first]].length <= b0) ++first;
      for (size_t k = first; k < idx.size() && ranges[idx[k]].offset < b1; ++k) {
        const ByteRange& r = ranges[idx[k]];
        const uint64_t lo = std::max(b0, r.offset), hi = std::min(b1, r.offset + r.length);
        if (lo < hi) out[idx[k]].crc = crc32_update(out[idx[k]].crc, {buf.data() + (lo - b0), static_cast<size_t>(hi - lo)});
      }
      pos = b1;
    }
    if (check && whole != rec.crc32)
      fail(path, "record '" + escaped_brief(name) + "': CRC-32 of its bytes " + crc_hex(whole) + " differs from the " +
                     crc_hex(rec.crc32) + " its zip entry records (the file is damaged; pec-save stores no step " +
                     "whose expert records a restore could not check)");
  }
  return out;
}

nlohmann::json range_crcs_to_json(const std::vector<RangeCrc>& t) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : t) j.push_back(nlohmann::json::array({r.record, r.offset, r.length, r.crc}));
  return j;
}

std::vector<RangeCrc> range_crcs_from_json(const nlohmann::json& j, const std::string& name) {
  std::vector<RangeCrc> out;
  if (j.is_null()) return out;
  try {
    for (const auto& e : j) {
      if (!e.is_array() || e.size() != 4) fail(name, "malformed range_crcs entry");
      out.push_back({e.at(0).get<std::string>(), e.at(1).get<uint64_t>(), e.at(2).get<uint64_t>(), e.at(3).get<uint32_t>()});
    }
  } catch (const nlohmann::json::exception&) {
    fail(name, "malformed range_crcs table");
  }
  return out;
}

}  // namespace ucpkit::pec
