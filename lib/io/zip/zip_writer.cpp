// Zip container writer in torch.save's layout.
#include "io/zip/zip_writer.h"

#include <algorithm>
#include <atomic>

#include "core/atomic_file.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/staging.h"
#include "io/zip/zip_directory.h"

namespace ucpkit {
namespace {

constexpr uint64_t kAlign = 64;

struct Bytes {
  std::string b;
  void u16(uint64_t v) { put(v, 2); }
  void u32(uint64_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void put(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) b += static_cast<char>((v >> (8 * k)) & 0xff);
  }
};

constexpr uint16_t kDosTime = 0, kDosDate = (1 << 5) | 1;  // 1980-01-01: reproducible files

std::atomic<size_t> g_window{8u << 20};

}  // namespace

ZipWriter::ZipWriter(const std::string& path, bool durable, bool start_writeback)
    : out_(std::make_unique<AtomicFile>(path, durable)), file_(out_.get()), start_writeback_(start_writeback) {}
ZipWriter::ZipWriter(AtomicFile& into) : file_(&into), base_(into.offset()) {}
ZipWriter::ZipWriter(std::string* into) : mem_(into), base_(into->size()) {}
ZipWriter::~ZipWriter() = default;

uint64_t ZipWriter::here() const { return (mem_ ? mem_->size() : file_->offset()) - base_; }

void ZipWriter::put(std::span<const uint8_t> bytes) {
  if (mem_) mem_->append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  else file_->write(bytes);
}

AtomicFile& ZipWriter::file() {
  if (!file_) throw Error("internal: a zip in memory takes whole records only");
  return *file_;
}

std::optional<ZipWriter::Place> ZipWriter::place(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return Place{e.header_offset, e.data, e.size, e.directory};
  return std::nullopt;
}

void ZipWriter::add(const std::string& name, std::span<const uint8_t> data) {
  add(name, std::vector<std::span<const uint8_t>>{data});
}

void ZipWriter::add(const std::string& name, const std::vector<std::span<const uint8_t>>& parts) {
  uint64_t size = 0;
  uint32_t crc = 0;
  for (auto p : parts) {
    crc = crc32_parallel(p, crc);
    size += p.size();
  }
  const uint64_t offset = local_header(name, size, crc);
  Entry e{name, offset, size, crc};
  e.data = here();
  for (auto p : parts) put(p);
  entries_.push_back(std::move(e));
}

void ZipWriter::set_stream_window(size_t bytes) { g_window = std::max<size_t>(bytes, 4096); }

void ZipWriter::add_streamed(const std::string& name, uint64_t size, const Fill& fill, size_t align) {
  AtomicFile& out = file();
  const uint64_t offset = local_header(name, size, 0);
  const uint64_t data = here();
  // One buffer per thread, reused for every window of every record: the kernel copies out of a
  // cache-warm buffer far faster than out of a large cold one (measured ~3x on this kind of VM).
  thread_local std::vector<uint8_t> buffer;
  size_t window = g_window;
  if (align > 1) window = std::max(align, window / align * align);
  if (buffer.size() < window) buffer.resize(window);
  uint32_t crc = 0;
  for (uint64_t done = 0; done < size;) {
    check_interrupted();  // SIGINT/SIGTERM: a record of many GiB stops at its next window, not at its end
    const size_t n = static_cast<size_t>(std::min<uint64_t>(window, size - done));
    // Made where the file buffers it when it can (an O_DIRECT block): one copy of the bytes less.
    std::span<uint8_t> w = out.room(n, align);
    const bool in_place = !w.empty();
    if (!in_place) w = {buffer.data(), n};
    fill(done, w);
    crc = crc32_update(crc, w);
    if (in_place) out.filled(w.size());
    else out.write(w);
    done += w.size();
  }
  uint8_t le[4];
  for (int k = 0; k < 4; ++k) le[k] = static_cast<uint8_t>(crc >> (8 * k));
  out.pwrite_at(base_ + offset + kLocalCrcField, le);
  Entry e{name, offset, size, crc};
  e.data = data;
  entries_.push_back(std::move(e));
}

void ZipWriter::add_zeros(const std::string& name, uint64_t size) {
  AtomicFile& out = file();
  const uint32_t crc = crc32_zeros(size);
  const uint64_t offset = local_header(name, size, crc);
  Entry e{name, offset, size, crc};
  e.data = here();
  out.skip(size);
  entries_.push_back(std::move(e));
}

size_t ZipWriter::reserve(const std::string& name, uint64_t size) {
  AtomicFile& out = file();
  const uint64_t offset = local_header(name, size, 0);
  Entry e{name, offset, size, 0};
  e.data = here();
  e.data_offset = out.offset();
  e.reserved = true;
  out.skip(size);
  entries_.push_back(std::move(e));
  return entries_.size() - 1;
}

void ZipWriter::write_reserved(size_t record, uint64_t offset, std::span<const uint8_t> bytes) {
  const Entry& e = entries_.at(record);
  if (!e.reserved || offset > e.size || bytes.size() > e.size - offset)
    throw Error("zip record " + e.name + ": write outside its reserved bytes");
  file().pwrite_at(e.data_offset + offset, bytes);
}

void ZipWriter::flush() {
  if (file_) file_->flush();
}

void ZipWriter::set_crc(size_t record, uint32_t crc) {
  Entry& e = entries_.at(record);
  if (!e.reserved) throw Error("zip record " + e.name + ": not a reserved record");
  e.crc = crc;
  uint8_t le[4];
  for (int k = 0; k < 4; ++k) le[k] = static_cast<uint8_t>(crc >> (8 * k));
  file().pwrite_at(base_ + e.header_offset + kLocalCrcField, le);
}

uint64_t ZipWriter::local_header(const std::string& name, uint64_t size, uint32_t crc) {
  const uint64_t offset = here();
  const bool z64 = size >= 0xFFFFFFFFull || offset >= 0xFFFFFFFFull;
  Bytes h;
  h.u32(0x04034b50);
  h.u16(z64 ? 45 : 20);
  h.u16(0);  // flags
  h.u16(0);  // stored
  h.u16(kDosTime);
  h.u16(kDosDate);
  h.u32(crc);
  h.u32(z64 ? 0xFFFFFFFF : size);
  h.u32(z64 ? 0xFFFFFFFF : size);
  h.u16(name.size());
  // Extra fields: ZIP64 sizes when needed, then "FB" padding so the data starts 64-byte aligned.
  uint64_t z64_len = z64 ? 20 : 0;
  uint64_t before = offset + 30 + name.size() + z64_len + 4;
  uint64_t pad = (kAlign - before % kAlign) % kAlign;
  h.u16(z64_len + 4 + pad);
  h.b += name;
  if (z64) {
    h.u16(0x0001);
    h.u16(16);
    h.u64(size);
    h.u64(size);
  }
  h.u16(0x4246);  // 'FB'
  h.u16(pad);
  h.b.append(pad, 'Z');
  put({reinterpret_cast<const uint8_t*>(h.b.data()), h.b.size()});
  return offset;
}

void ZipWriter::finish() {
  const uint64_t cd_offset = here();
  Bytes cd;
  for (auto& e : entries_) {
    e.directory = cd_offset + cd.b.size();
    const bool z64 = e.size >= 0xFFFFFFFFull || e.header_offset >= 0xFFFFFFFFull;
    cd.u32(0x02014b50);
    cd.u16(z64 ? 45 : 20);  // made by
    cd.u16(z64 ? 45 : 20);  // needed
    cd.u16(0);
    cd.u16(0);
    cd.u16(kDosTime);
    cd.u16(kDosDate);
    cd.u32(e.crc);
    cd.u32(z64 ? 0xFFFFFFFF : e.size);
    cd.u32(z64 ? 0xFFFFFFFF : e.size);
    cd.u16(e.name.size());
    cd.u16(z64 ? 28 : 0);
    cd.u16(0);  // comment
    cd.u16(0);  // disk
    cd.u16(0);  // internal attributes
    cd.u32(0);  // external attributes
    cd.u32(z64 ? 0xFFFFFFFF : e.header_offset);
    cd.b += e.name;
    if (z64) {
      cd.u16(0x0001);
      cd.u16(24);
      cd.u64(e.size);
      cd.u64(e.size);
      cd.u64(e.header_offset);
    }
  }
  const uint64_t cd_size = cd.b.size();
  const uint64_t n = entries_.size();
  const bool z64 = n >= 0xFFFF || cd_offset >= 0xFFFFFFFFull || cd_size >= 0xFFFFFFFFull;
  if (z64) {
    const uint64_t z64_offset = cd_offset + cd_size;
    cd.u32(0x06064b50);
    cd.u64(44);
    cd.u16(45);
    cd.u16(45);
    cd.u32(0);
    cd.u32(0);
    cd.u64(n);
    cd.u64(n);
    cd.u64(cd_size);
    cd.u64(cd_offset);
    cd.u32(0x07064b50);
    cd.u32(0);
    cd.u64(z64_offset);
    cd.u32(1);
  }
  cd.u32(0x06054b50);
  cd.u16(0);
  cd.u16(0);
  cd.u16(z64 ? 0xFFFF : n);
  cd.u16(z64 ? 0xFFFF : n);
  cd.u32(z64 ? 0xFFFFFFFF : cd_size);
  cd.u32(z64 ? 0xFFFFFFFF : cd_offset);
  cd.u16(0);
  put({reinterpret_cast<const uint8_t*>(cd.b.data()), cd.b.size()});
  if (!out_) return;  // appended to a file the caller commits
  if (start_writeback_) out_->start_writeback();  // a hint: failures are left to the final flush, which reports them
  out_->commit();
}

}  // namespace ucpkit
