// torch.save files: load (zip or legacy container, any archive prefix) into a Value tree with lazy
// tensors, and save a Value tree as a zip file that Python torch.load reads back.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/pickle/value.h"
#include "io/zip/zip_directory.h"

namespace ucpkit {

class MappedFile;

enum class TorchContainer { Zip, Legacy };

struct TorchFile {
  pickle::ValuePtr root;
  TorchContainer container = TorchContainer::Zip;
  std::string archive_prefix;               // zip only
  std::shared_ptr<const MappedFile> file;   // keeps storages' bytes alive (they also hold it)
};

struct TorchLoadOptions {
  bool verify_crc = false;  // recompute record CRC-32s (zip); off by default: costs a full read
  // load_torch_file / load_torch: the check of every record's CRC-32 at open that the tools'
  // --verify asks for (verify.h). False for a caller that checks the file's CRCs itself (ucp-load's
  // direct mode computes them on the bytes its copy reads).
  bool crc_at_open = true;
};

// Loads `path`; every error names the file and what is wrong.
TorchFile load_torch_file(const std::string& path, const TorchLoadOptions& options = {});
// Same for bytes in memory (`name` is used in messages).
TorchFile load_torch_bytes(std::span<const uint8_t> bytes, const std::string& name,
                           const TorchLoadOptions& options = {});
// Same for a file already mapped (MappedFile::slice of a larger file: nothing is copied, storages are
// views of `file`); `file->path()` names it in messages.
TorchFile load_torch_mapped(std::shared_ptr<const MappedFile> file, const TorchLoadOptions& options = {});
// Convenience: just the root value.
pickle::ValuePtr load_torch(const std::string& path, const TorchLoadOptions& options = {});

struct TorchSaveOptions {
  std::string archive_prefix = "archive";
  bool durable = false;  // fsync file and directory before returning
  bool start_writeback = false;  // start the file's write-back once written (ZipWriter's constructor)
};

// Writes `root` as a zip-format torch file: to a temporary name, then renamed into place. Each
// distinct storage is written once, as one record; generated storages (Storage::generated) are
// streamed window by window, never held whole in memory.
void save_torch_file(const std::string& path, const pickle::ValuePtr& root, const TorchSaveOptions& options = {});

class AtomicFile;
class ZipWriter;

// The bytes save_torch_file writes for `root`, appended to `out` at its current offset instead of a
// file of their own (a zip whose offsets count from its first byte: a DCP data item). Returns how many.
uint64_t append_torch_file(AtomicFile& out, const pickle::ValuePtr& root, const TorchSaveOptions& options = {});

// append_torch_file(out, Value::of_tensor(t)) for many small tensors (a DCP data file's items): the zip of
// a tensor differs from that of another with the same signature (dtype, shape, strides, storage offset and
// size, location, flags) only in its data record's bytes and CRC-32, so the zip is made once per signature
// and each tensor's bytes and CRC go into a copy of it (a 100,000-tensor DCP rewrite spent 7 us a tensor
// pickling and zipping). The same bytes as append_torch_file; storages of zeros (holes) and storages above
// kMaxBytes go through append_torch_file. The zips kept take kMaxKept bytes at most (past that a new
// signature's zip is made for its tensor and not kept). Thread-safe: one for every file of a write.
class TensorZipWriter {
 public:
  static constexpr size_t kMaxBytes = 64 << 10, kMaxKept = 8 << 20;
  explicit TensorZipWriter(TorchSaveOptions options = {});
  ~TensorZipWriter();
  // Appends `t` to `out` at its current offset; returns the bytes written.
  uint64_t append(AtomicFile& out, const Tensor& t);

 private:
  struct Template;
  TorchSaveOptions options_;
  const uint64_t serial_;  // tells this writer's templates in a thread's last-used cache from another's
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Template>> templates_;
  size_t kept_ = 0;  // bytes of the zips in templates_
};

// TensorZipWriter's counterpart for reading many small one-tensor zips (a DCP data file's items): a zip
// whose bytes equal those of a zip remembered here but for its data record's bytes, its
// `.data/serialization_id` (torch's differs from item to item; nothing reads it) and those two records'
// CRC-32s (each record's two copies of its CRC agreeing) holds the same tensor over its own data record,
// found by comparing bytes instead of parsing the zip and its pickle again. Up to kPerLength zips remembered
// per length (a 0-dim tensor's zip can have a [4]-tensor's length: the padding takes the difference), the
// latest first, each of kMaxBytes at most, kMaxKept bytes in all. Not thread-safe: one per thread, or a lock.
class TensorZipReader {
 public:
  static constexpr size_t kMaxBytes = 64 << 10, kMaxKept = 8 << 20, kPerLength = 4;
  struct Found {
    Tensor tensor;       // over `file`'s bytes of the zip's data record
    uint32_t crc = 0;    // that record's CRC-32 as the zip records it
    std::string record;  // its name
  };
  // The tensor of the zip at [offset, offset + length) of `file`, when it matches a remembered one. With
  // `verify` (the tools' --verify), only a zip remembered with every record's CRC-32 checked matches, and its
  // serialization id's CRC-32 is checked (the data record's is the caller's, over the bytes as it copies them).
  std::optional<Found> match(const std::shared_ptr<const MappedFile>& file, uint64_t offset, uint64_t length,
                             bool verify) const;
  // Where match() finds the zip's data record, when its tensor is a contiguous `dtype` tensor of `shape` over all of
  // that record's bytes (nullopt otherwise): for a caller making its own storage over them (no tensor made here).
  struct Placed {
    uint64_t data = 0, size = 0;  // the record's bytes, [data, data + size) of `file`
    uint32_t crc = 0;
    std::string record;
  };
  std::optional<Placed> match_place(const std::shared_ptr<const MappedFile>& file, uint64_t offset, uint64_t length,
                                    bool verify, DType dtype, std::span<const int64_t> shape) const;
  // Remembers `zip`, which load_torch_mapped read as `t` (its root tensor) over the bytes of its record `data`
  // (`records`: its directory, offsets counted from the zip's first byte); `verified`: every record's CRC-32
  // was checked. Does nothing for a zip it cannot take (a tensor not over exactly one record's bytes).
  void remember(std::span<const uint8_t> zip, const Tensor& t, const std::map<std::string, ZipRecord>& records,
                const std::string& data, bool verified);

 private:
  struct Template;
  const Template* find(const std::shared_ptr<const MappedFile>& file, uint64_t offset, uint64_t length, bool verify,
                       uint32_t& crc) const;
  std::unordered_map<uint64_t, std::vector<std::shared_ptr<const Template>>> templates_;  // by zip length
  size_t kept_ = 0;  // bytes of the zips in templates_
};

// The generated storages of `root` in the order DeferredTorchFile(path, root).records() lists them
// (nothing is written; the MPI exchange uses it to weigh files before deciding who writes them).
std::vector<std::shared_ptr<Storage>> generated_storages(const pickle::ValuePtr& root);

// The same file written out of order (ucp-load's MPI exchange: data arrives batch by batch, and a
// record spans every batch). The constructor writes the pickle and every stored storage and
// reserves one record per generated storage; write() gives any byte range of a reserved record
// (several threads at once for disjoint ranges; each piece's CRC-32 is kept); finish() checks that
// every reserved byte was written exactly once, combines the CRCs, writes the central directory
// and renames the file into place (the bytes equal what save_torch_file writes for `root`).
// Destroyed without finish(), the temporary file is removed.
class DeferredTorchFile {
 public:
  DeferredTorchFile(const std::string& path, const pickle::ValuePtr& root, const TorchSaveOptions& options = {});
  ~DeferredTorchFile();
  struct Record {
    std::shared_ptr<Storage> storage;  // a generated storage
    size_t zip_index = 0;
  };
  const std::vector<Record>& records() const { return records_; }
  void write(size_t record, uint64_t offset, std::span<const uint8_t> bytes);
  // Returns the file size.
  uint64_t finish();

 private:
  struct Pieces;
  std::string path_;
  std::unique_ptr<ZipWriter> zip_;
  std::vector<Record> records_;
  std::vector<std::unique_ptr<Pieces>> pieces_;
};

}  // namespace ucpkit
