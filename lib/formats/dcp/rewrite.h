// One DCP folder rewritten by our writer: re-chunked for another target mesh, or with its chunks as
// stored (each chunk into the data file of the rank that wrote it). Bounded memory: one tensor (or
// one chunk) at a time.
#pragma once
#include <map>
#include <optional>
#include <string>

#include "formats/dcp/metadata.h"
#include "formats/dcp/reader.h"
#include "formats/dcp/save_plan.h"
#include "formats/dcp/writer.h"

namespace ucpkit::formats::dcp {

// The rank of a data file named like torch's `__{rank}_{k}.distcp` (0 for any other name).
int64_t rank_of_data_file(const std::string& relative_path);

// A plan keeping `md`'s entries and chunks as they are, each chunk in the file
// `__{rank}_0.distcp` of the rank whose data file held it (torch 1.13's one file per item included).
SavePlan plan_as_stored(const Metadata& md);

// Reads the DCP folder `in` (its `.metadata`, or `metadata_file`) and writes it to `out`, re-chunked
// for `target` (tensors read whole, one at a time) or, without one, with its chunks as stored
// (chunk by chunk). The source's planner_data is kept unless `options.planner_data` is set.
WriteResult rewrite_dcp(const std::string& in, const std::string& out, const std::optional<Target>& target,
                        WriteOptions options = {}, const std::string& metadata_file = "");

// The plan rewrite_dcp_into writes: `md`'s entries re-chunked for `target` (else as stored), the
// entries in `convert` with the dtype given there.
SavePlan rewrite_plan(const Metadata& md, const std::optional<Target>& target, const std::map<std::string, DType>& convert);

// rewrite_dcp into the existing empty folder `dir` (a caller's staging folder, whose flush and rename are
// the caller's), from an open reader, as `plan` (rewrite_plan of the reader's metadata for the same target and
// `convert`; made once by the caller, which describes it: for 100,000 tensors a plan takes a second); the tensor
// entries named in `convert` are written in the dtype given there (converted with torch's rounding), every other
// entry as stored (its dtype, its key, its bytes). ucp-load of a DCP into DCP (nothing the source holds is dropped).
WriteResult rewrite_dcp_into(const Reader& reader, const SavePlan& plan, const std::string& dir, bool rechunked,
                             const std::map<std::string, DType>& convert, WriteOptions options);

}  // namespace ucpkit::formats::dcp
