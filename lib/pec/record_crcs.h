// CRC-32 of every expert range of a shared file at the step pec-save stores (the mixed-save
// gap of cause 8). A restore that fills a zip record with expert fragments of older saves cannot keep
// the CRC-32 the source recorded for it; it checks each piece against the CRC-32 its own save
// recorded instead: the target step's non-expert bytes together with this table must give the
// source's record CRC, and a fragment of an older save must have the CRC that save recorded for its
// range. pec-save computes the table while checking each record the expert ranges touch against its
// zip entry's CRC-32 (the whole record is read once), so every range CRC it records is certified by
// the CRC the source itself recorded, and a damaged source is refused before anything is stored.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pec/checkpoint.h"

namespace ucpkit::pec {

struct RangeCrc {
  std::string record;
  uint64_t offset = 0;  // inside the record's bytes
  uint64_t length = 0;
  uint32_t crc = 0;
};

// The CRC-32 of each expert range of shared file `rel` of `src` (src.expert_ranges[rel], in that
// order). With `check`, every zip record those ranges touch must have the CRC-32 its central entry
// records, else Error naming the file and record.
std::vector<RangeCrc> expert_range_crcs(const SourceCheckpoint& src, const std::string& rel, bool check = true);

// [[record, offset, length, crc], ...]; from_json throws Error naming `name` on a malformed table.
nlohmann::json range_crcs_to_json(const std::vector<RangeCrc>& t);
std::vector<RangeCrc> range_crcs_from_json(const nlohmann::json& j, const std::string& name);

std::string crc_hex(uint32_t c);

}  // namespace ucpkit::pec
