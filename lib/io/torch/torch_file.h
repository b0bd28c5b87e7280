// torch.save files: load (zip or legacy container, any archive prefix) into a Value tree with lazy
// tensors, and save a Value tree as a zip file that Python torch.load reads back.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/pickle/value.h"

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
