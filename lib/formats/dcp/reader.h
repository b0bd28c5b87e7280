// Reads tensors out of a DCP checkpoint folder (FileSystemWriter's layout): `.metadata` plus data files
// `__{rank}_{k}.distcp` that concatenate items with no header; a tensor item is a complete torch.save
// zip at [offset, offset + length), a bytes item the raw bytes of torch.save(obj). One fqn or one
// chunk at a time, the data files mapped and each item's zip read in place: read_tensor holds one
// tensor in memory, stream_tensor none (a writer's window at a time).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/dcp/metadata.h"
#include "io/pickle/value.h"
#include "io/tensor.h"
#include "io/torch/torch_file.h"

namespace ucpkit {
class MappedFile;
}

namespace ucpkit::formats::dcp {

struct Stored;

// Throws Error naming `file` unless `chunks` tile the box `size` exactly: every chunk inside it, no
// two overlapping, together as many elements as the box (so no gap).
void check_chunks_cover(const Entry& entry, const std::string& file);

// The sub-tensor of `e` at leading indices `index` (a layer of a Megatron-Core stack): its entry (size
// and chunk boxes without the leading axes; not checked to cover it) and in `which` the indices of e's
// chunks inside it. Nullopt when a chunk holding it spans several leading indices.
std::optional<Entry> leading_sub_entry(const Entry& e, const std::vector<int64_t>& index, std::vector<size_t>& which);

// Where the elements of one chunk lie, for a reader of element ranges (range_reader.h): in the data
// file `file` from byte `file_offset` (an item's zip data record, read in place), or, for an item that
// had to be decoded (zstd transforms, the safetensors flavour, a big-endian or strided record), in
// `memory`. Row-major, `nbytes` bytes.
struct ChunkBytes {
  Chunk box;
  uint64_t nbytes = 0;
  std::string file;          // the data file; empty when the bytes are in `memory`
  uint64_t file_offset = 0;
  Tensor memory;             // contiguous
  std::optional<uint32_t> crc;  // the data record's CRC-32 over these bytes, still to check (--verify)
  std::string record;           // that record's name
  std::string name;             // "<file> (item '<fqn>' at byte N)"
};

class Reader {
 public:
  // `dir` holds the data files; `metadata_file` defaults to dir/.metadata.
  explicit Reader(std::string dir, std::string metadata_file = "");
  // Over metadata already read (a rank-local folder's merged metadata, formats/dcp/folder.h); item
  // paths are relative to `dir`.
  Reader(std::string dir, Metadata metadata);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const Metadata& metadata() const { return md_; }
  const std::string& dir() const { return dir_; }

  // Chunk `k` of tensor `fqn` (chunks as listed in the metadata), a tensor of the chunk's sizes.
  Tensor read_chunk(const std::string& fqn, size_t k) const;
  // The global tensor of `fqn`, assembled from its chunks (checked to cover it exactly).
  Tensor read_tensor(const std::string& fqn) const;
  // The global tensor of `fqn` without assembling it: a contiguous tensor over a generated storage
  // (io/tensor.h) whose bytes are copied straight out of the mapped items, window by window, as a
  // writer asks for them (save_torch_file streams it through one small buffer). Every item is decoded
  // and checked here, as read_tensor checks it (chunks tile the tensor, bounds, dtype, shape, the small
  // records' CRC-32s under --verify); each chunk's data record CRC-32 is computed while its bytes are
  // copied and checked when its last byte is (an Error from inside the writer, naming the item). The
  // windows must be asked for in order, from byte 0 to the end, once (an Error otherwise); each item's
  // pages are dropped from the process once copied. Memory: the writer's window, not the tensor.
  Tensor stream_tensor(const std::string& fqn) const;
  // The global tensor of `fqn` when it was saved as one item (one chunk, the whole tensor), nothing copied: for an
  // item read in place, a contiguous tensor over a mapped storage of the item; for a decoded one (zstd, the
  // safetensors flavour), the decoded tensor. The data record's CRC-32 is checked here under --verify, over the map: the pass that brings its
  // pages in (without --verify they are brought in at once). The item's pages are dropped from the process when the
  // last copy of the tensor goes. Nullopt for a tensor of several chunks (read_tensor or stream_tensor then).
  std::optional<Tensor> view_tensor(const std::string& fqn) const;
  // Where the elements of chunk `k` of tensor `fqn` lie. Its item is decoded and checked as read_chunk
  // does (dtype, shape, the small records' CRC-32s under --verify), its pages dropped from the process;
  // the data record's CRC-32 is left to the caller (`crc`).
  ChunkBytes locate_chunk(const std::string& fqn, size_t k) const;
  // A read-only descriptor of data file `file` (a ChunkBytes::file), opened once per reader and closed
  // with it: range readers of many states share it. Throws Error naming the file.
  int descriptor(const std::string& file) const;
  // Data file `file` (a ChunkBytes::file) mapped, once per reader: the map item reads and range readers' checks share.
  std::shared_ptr<const MappedFile> mapped(const std::string& file) const;
  // The stored bytes of a bytes item (a torch.save of the object).
  std::vector<uint8_t> read_bytes(const std::string& fqn) const;
  // A bytes item decoded: the object torch.save wrote (record CRC-32s checked under the tools' --verify).
  pickle::ValuePtr read_object(const std::string& fqn) const;

 private:
  const Entry& entry(const std::string& fqn, bool bytes) const;
  // Chunk `k` of tensor entry `e` decoded where it lies in the mapped data file (nothing copied).
  // With `view`, a record that matches a remembered zip and holds the chunk's tensor as it is gives only its bytes
  // (`tensor` empty, `mapped`): the caller (view_tensor) makes the one storage over them.
  Stored stored_chunk(const Entry& e, size_t k, bool view = false) const;
  // The item's bytes inside its data file, bounds-checked.
  // `file`: the data file's path (the Reader keeps it).
  std::span<const uint8_t> item_bytes(const Item& item, std::shared_ptr<const MappedFile>& keep,
                                      const std::string*& file) const;

  std::string dir_;
  Metadata md_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const MappedFile>> files_;
  // An item's relative_path -> its data file's path and map (10^5 items name a few files: each checked, joined and
  // mapped once; one lookup an item).
  struct DataFile {
    std::string path;
    std::shared_ptr<const MappedFile> map;
  };
  mutable std::unordered_map<std::string, DataFile> data_files_;
  mutable std::map<std::string, int> descriptors_;
  mutable std::mutex zips_mu_;
  mutable TensorZipReader zips_;  // the items' zips by length: most share their layout with an earlier one
};

// The error message of a stored record whose CRC-32 differs from its zip entry's (the readers' common wording).
std::string crc_mismatch(const std::string& record);

}  // namespace ucpkit::formats::dcp
