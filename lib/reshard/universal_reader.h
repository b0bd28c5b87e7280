// Reading atomic tensors of a universal checkpoint (memory-mapped, verified against the manifest's
// checksums on first use) and copying any flat range of a target TP slice out of them.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "io/pickle/value.h"
#include "io/tensor.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"

namespace ucpkit::reshard {

// Elements of atomic tensors held in memory: under ucp-load's MPI exchange, the elements of one
// batch that this rank needs, received from the ranks that read them. Filled, then only read.
class AtomicCache {
 public:
  // Elements [start, start + count) of state `state` (index into ModelInfo::states) of `param`;
  // intervals of one tensor must not overlap and are added in increasing `start` order. `data` must outlive the cache's use.
  void add(int param, int state, int64_t start, int64_t count, const float* data);
  void clear() { intervals_.clear(); }
  // Copies the elements [start, start + count) to `dst`; they must lie inside added intervals that
  // continue each other (throws Error otherwise).
  void copy(int param, int state, int64_t start, int64_t count, float* dst) const;

 private:
  struct Interval {
    int64_t start, count;
    const float* data;
  };
  std::map<std::pair<int, int>, std::vector<Interval>> intervals_;  // added in increasing start order
};

// Where the atomic tensors' elements come from when they are not universal state files (ucp-load's
// direct mode: the source checkpoint's ZeRO fragments, lib/reshard/direct_source.h).
class AtomicSource {
 public:
  virtual ~AtomicSource() = default;
  // Elements [a, a + n) of the stored fp32 tensor of state `state` (index into ModelInfo::states) of
  // `param` into `dst`; thread-safe.
  virtual void read(int param, int state, int64_t a, int64_t n, float* dst) = 0;
  // The raw step value of a parameter, or nullptr.
  virtual pickle::ValuePtr step(int param) = 0;
  // When verifying: the CRC-32 of a whole tensor, computed on the way (compared or recorded there).
  virtual void whole_crc(int param, int state, uint32_t crc) = 0;
  // Whether whole_crc uses the CRC-32s (false: read_part does not compute them; the source checks its
  // own bytes, as the torch_dist items' CRC-32s are).
  virtual bool wants_crc() const { return true; }
};

class UniversalReader {
 public:
  UniversalReader(const ModelInfo& model, std::string dir, bool verify);
  // Restricts checksum verification to the parameters marked true (MPI: each atomic tensor is
  // verified by exactly one rank, so together the ranks read every atomic byte once for it).
  void set_verify_mask(std::vector<char> mask) { verify_mask_ = std::move(mask); }
  bool verifies(int param) const { return verify_ && (verify_mask_.empty() || verify_mask_[param]); }
  bool verifying() const { return verify_; }
  // Opens (once) and checks the fp32 tensor of `state` of parameter `param`: shape and dtype against
  // the manifest, CRC-32 when verifying. Throws Error when the file is missing, is not what the
  // manifest says, or fails its checksum.
  void check(int param, const std::string& state);
  // Copies elements [a, b) of the flattened TP slice `s` of that tensor into `dst` with pread (no
  // memory map: page faults on fresh mappings cost more than the copy on virtual machines).
  void read_range(int param, const std::string& state, const TpSlice& s, int64_t a, int64_t b, float* dst);
  // Elements [a, a + n) of the whole tensor of `state` of `param` into `dst` (several threads at
  // once for different parts), returning their CRC-32 when verifying (0 otherwise); then
  // verify_whole with the parts' CRCs combined in order: each atomic byte is read once, checksum
  // included (MPI exchange owners).
  uint32_t read_part(int param, const std::string& state, int64_t a, int64_t n, float* dst);
  void verify_whole(int param, const std::string& state, uint32_t crc);
  // While set, read_range copies from `cache` instead of reading files (nullptr: files again).
  void set_cache(const AtomicCache* cache) { cache_ = cache; }
  // Reads every atomic tensor from `source` instead of files (nullptr: files); not owned.
  void set_source(AtomicSource* source) { source_ = source; }
  int state_index(const std::string& state) const;
  // The raw step value (int or tensor) of a parameter, or nullptr when it has none.
  pickle::ValuePtr step(int param);
  // Bytes copied out of atomic tensors into target files, and bytes read to verify checksums.
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t bytes_verified() const { return bytes_verified_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    std::once_flag once;
    bool ready = false;   // checked against the manifest
    int fd = -1;          // kept open (the first max_kept_fds_ files opened), else -1: opened for each read
    uint64_t offset = 0;  // of the tensor's elements in the file
    std::string path;
    ~Entry();
  };
  // An entry's descriptor for one read: its own, or one opened for the read and closed after it.
  class ReadFd {
   public:
    explicit ReadFd(const Entry& e);
    int get() const { return fd_; }

   private:
    UniqueFd owned_;
    int fd_;
  };
  Entry& entry(int param, const std::string& state);
  const ModelInfo& model_;
  std::string dir_;
  bool verify_;
  std::vector<std::unique_ptr<Entry>> entries_;  // [param * states + state]
  // How many entries keep their file open: a folder of 10^5 state files would pass the process's limit
  // of open files (a quarter of it), so the others open their file for each read.
  std::atomic<int64_t> kept_fds_{0};
  int64_t max_kept_fds_ = 0;
  std::vector<char> verify_mask_;
  const AtomicCache* cache_ = nullptr;
  AtomicSource* source_ = nullptr;
  std::atomic<uint64_t> bytes_read_{0}, bytes_verified_{0};
};

// Calls run(src_element or -1 for zeros, count, dst_element) for the maximal contiguous runs that make up
// elements [a, b) of the flattened TP slice `s` of a universal tensor of shape `ushape`.
void for_each_run(const std::vector<int64_t>& ushape, const TpSlice& s, int64_t a, int64_t b,
                  const std::function<void(int64_t, int64_t, int64_t)>& run);
// Copies elements [a, b) of the flattened TP slice `s` of a universal tensor with data `src` and
// shape `ushape` into `dst` (fp32). Vocabulary padding rows read as zeros.
void copy_flat_range(const float* src, const std::vector<int64_t>& ushape, const TpSlice& s, int64_t a, int64_t b,
                     float* dst);

// fp32 -> target float type, round to nearest even (as torch does); `dst` holds n * dtype_size.
void convert_from_fp32(const float* src, size_t n, DType target, uint8_t* dst);

// The whole fp32 tensor of `state` of parameter `i` (any reader: files, or its AtomicSource),
// converted to `dtype`: read straight into the tensor's bytes (fp32), or through one reused window of
// 1M elements (other dtypes), so the tensor is the only full-size buffer (the DCP and torch_dist writers).
Tensor read_whole_tensor(const ModelInfo& model, UniversalReader& reader, int i, const std::string& state, DType dtype);

// Buffer `b` of the universal folder `dir` (ModelInfo::buffers), in its own dtype: the file's tensor
// checked against the manifest's shape, dtype and (when `verify`) crc32. Throws Error naming the file.
Tensor read_buffer(const std::string& dir, const formats::universal::UniversalBuffer& b, bool verify);

}  // namespace ucpkit::reshard
