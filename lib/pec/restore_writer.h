// Streaming writer of a restored checkpoint. Every stored chunk is read in small blocks, decompressed
// by zstd's streaming decoder into a small reused window, hashed once for its object digest (the
// whole-file digest is chained from the chunk digests, so no byte is hashed twice for it) and written
// with pwrite straight to its place in the output file: whole files, non-expert files with their
// expert ranges cut out (the cut ranges stay holes until the experts are written into them), and
// expert fragments patched into optimizer shards at their record offsets. CRC-32s of the zip records
// expert fragments touch are combined from per-piece CRCs computed as the bytes stream past (only the
// non-expert bytes inside such records are read back). Memory is a fixed set of per-worker buffers
// (input block, output window, zstd decoder), sized from the --memory-mb budget, whatever the
// checkpoint size. Under MPI each rank writes the files it owns (greedy split by bytes).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "io/zip/zip_directory.h"
#include "pec/manifest.h"
#include "pec/record_crcs.h"

namespace ucpkit::pec {

class Store;

// CRC-32 of a byte range written into a zip record of a shared (cut) file.
struct CrcPiece {
  std::string file;  // relative path
  std::string record;
  uint64_t offset = 0;  // absolute in the file
  uint64_t length = 0;
  uint32_t crc = 0;
  int64_t step = -1;  // step of the save the bytes come from (the copy's)
  // The expert range the piece belongs to (a range stored in several chunks gives several pieces) and
  // the CRC-32 its save recorded for it (expect < 0: a manifest of an older pec-save recorded none).
  uint64_t range_offset = 0, range_length = 0;
  int64_t expect = -1;
};

// What writing one expert copy did on this rank.
struct CopyOutcome {
  std::string error;  // empty when every part owned here was intact
  std::vector<CrcPiece> pieces;
  std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> fragments;  // file, [offset, length]
  std::vector<std::string> whole_files;
};

class RestoreWriter {
 public:
  // `dir`: the (temporary) step folder to write. Throws UsageError when the budget cannot hold one
  // worker's buffers.
  RestoreWriter(std::string dir, uint64_t memory_bytes, int rank = 0, int world = 1);
  // The constructor's budget check alone (a restore and its --plan refuse before writing anything).
  static void check_memory(uint64_t memory_bytes);
  ~RestoreWriter();
  RestoreWriter(const RestoreWriter&) = delete;
  RestoreWriter& operator=(const RestoreWriter&) = delete;

  int workers() const { return workers_; }
  // Assigns every output file to a rank (largest first to the least loaded; deterministic). Files not
  // named here go to a rank chosen by a hash of their path.
  void assign(const std::vector<std::pair<std::string, uint64_t>>& files);
  bool owns(const std::string& path) const;

  // Creates and writes this rank's non-expert files (cut ranges left as holes). Throws ObjectError
  // when a stored object or a whole-file digest is damaged, Error on I/O failures.
  // `step`: the step of the save these files come from; a zip record whose expert fragments all come
  // from that same save must end with the CRC-32 the source had (finish refuses it otherwise).
  void write_non_expert(const Store& store, const std::vector<FileEntry>& files, int64_t step = -1);

  // Writes the parts owned by this rank of each expert copy (whole files and fragments inside the
  // non-expert files written before). Damage is reported in the outcome, not thrown.
  struct ExpertCopy {
    const Store* store = nullptr;
    const ExpertEntry* entry = nullptr;
    int64_t step = -1;  // step of the manifest the entry belongs to
  };
  std::vector<CopyOutcome> write_experts(const std::vector<ExpertCopy>& copies);
  // A copy that will not be used: its fragments are zeroed and its whole files removed.
  void discard(const CopyOutcome& outcome);
  // A copy that is used: its CRC pieces count for the records it touched.
  void accept(CopyOutcome&& outcome);

  // Checks the CRC-32 of every zip record an accepted copy touched against the one the source file had
  // (still in the restored non-expert bytes): a record rebuilt only from the non-expert state's own
  // save must match it, else Error naming the file and record (damage in the source is refused, never
  // given a fresh CRC). A record mixing fragments of older saves cannot keep the source's CRC: each
  // piece is checked against the CRC its own save recorded (the non-expert bytes with the target
  // save's range CRCs must give the source's record CRC; each older fragment the CRC its save recorded
  // for its range; pec/record_crcs.h), else Error naming the file, record and step; then the record
  // gets the CRC of its bytes. Stores written by an older pec-save record no range CRCs: such a mixed
  // record gets a recomputed CRC unchecked. Then fsyncs this rank's files.
  void finish();
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  struct Job;
  struct CutFile;
  void run(std::vector<Job>& jobs);
  const CutFile& cut_file(const std::string& path);
  void check_mixed_record(const std::string& path, const std::string& name, const ZipRecord& r,
                          const std::vector<const CrcPiece*>& pieces, std::vector<RangeCrc>& slots,
                          const std::function<uint32_t(uint64_t, uint64_t)>& crc_of) const;
  std::string dir_;
  int rank_, world_, workers_;
  std::map<std::string, int> owner_;
  std::map<std::string, std::unique_ptr<CutFile>> cut_;
  std::set<std::string> non_expert_;  // every non-expert file of the step (all ranks')
  std::set<std::string> written_;     // files this rank created
  uint64_t bytes_written_ = 0;
  int64_t step_ = -1;  // step of the non-expert state written
};

}  // namespace ucpkit::pec
