// Zip container reader (stored records only, ZIP64 aware), bounds-checked against the file.
#include "io/zip/zip_reader.h"

#include "core/crc32.h"
#include "core/error.h"
#include "core/mapped_file.h"

namespace ucpkit {

ZipReader::ZipReader(std::shared_ptr<const MappedFile> file)
    : file_(std::move(file)), records_(read_zip_directory(file_->bytes(), file_->path())) {
  const std::string& path = file_->path();
  // The archive prefix is the folder holding data.pkl (any name: it is the file stem at save time).
  for (const auto& [name, rec] : records_) {
    auto slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash + 1) == "data.pkl") {
      prefix_ = name.substr(0, slash);
      break;
    }
  }
  if (prefix_.empty() && !records_.count("data.pkl")) fail(path, "zip: no data.pkl record (not a torch file?)");
}

std::optional<ZipRecord> ZipReader::find(const std::string& relative_name) const {
  auto it = records_.find(prefix_.empty() ? relative_name : prefix_ + "/" + relative_name);
  if (it == records_.end()) return std::nullopt;
  return it->second;
}

std::span<const uint8_t> ZipReader::bytes(const ZipRecord& r) const {
  return file_->bytes().subspan(static_cast<size_t>(r.data_offset), static_cast<size_t>(r.size));
}

void ZipReader::verify_crc(const std::string& relative_name) const {
  auto r = find(relative_name);
  if (!r) fail(file_->path(), "zip: no record '" + relative_name + "'");
  if (crc32_parallel(bytes(*r)) != r->crc32) fail(file_->path(), "zip: CRC-32 mismatch in record '" + relative_name + "'");
}

}  // namespace ucpkit
