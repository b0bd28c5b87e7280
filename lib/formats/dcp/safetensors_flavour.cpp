// HuggingFaceStorageWriter folders read into Metadata (safetensors_flavour.h).
#include "formats/dcp/safetensors_flavour.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::dcp {

namespace {

// torch 2.14.1 _hf_utils.py:17-18 (CUSTOM_METADATA_KEY, DEFAULT_EXTRA_METADATA_KEY), :38 (DCP_VERSION_KEY).
constexpr const char* kShardingInfo = "DCP_SHARDING_INFO";
constexpr const char* kDcpVersion = "DCP_VERSION";
constexpr const char* kExtra = "__metadata__";

struct Header {
  nlohmann::json j;
  uint64_t data_start = 0;  // 8 + header length
  uint64_t file_size = 0;
};

Header read_header(const std::string& file) {
  auto m = MappedFile::open(file);
  const auto b = m->bytes();
  if (b.size() < 8) fail(file, "safetensors: shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | b[static_cast<size_t>(k)];
  if (n > b.size() - 8) fail(file, "safetensors: header length " + std::to_string(n) + " runs past the end of the file");
  Header h;
  h.data_start = 8 + n;
  h.file_size = b.size();
  try {
    h.j = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::exception& e) {
    fail(file, std::string("safetensors: header is not JSON (") + e.what() + ")");
  }
  if (!h.j.is_object()) fail(file, "safetensors: header is not a JSON object");
  return h;
}

bool has_dcp_marker(const Header& h) {
  const auto x = h.j.find(kExtra);
  return x != h.j.end() && x->is_object() && (x->contains(kShardingInfo) || x->contains(kDcpVersion));
}

std::optional<DType> dtype_of(const std::string& s) {
  for (DType t : {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64, DType::Int8, DType::Int16,
                  DType::Int32, DType::Int64, DType::UInt8, DType::Bool})
    if (dtype_safetensors_name(t) == s) return t;
  return std::nullopt;
}

std::vector<int64_t> ints(const nlohmann::json& v, const std::string& file, const std::string& what) {
  if (!v.is_array()) fail(file, "safetensors: " + what + " is not a list");
  std::vector<int64_t> out;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0) fail(file, "safetensors: " + what + " holds a non-count");
    out.push_back(x.get<int64_t>());
  }
  return out;
}

}  // namespace

std::vector<std::string> safetensors_flavour_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || fs::exists(fs::path(dir) / ".metadata", ec)) return {};
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  for (const auto& f : files)
    if (!has_dcp_marker(read_header(f))) return {};
  return files;
}

Metadata read_safetensors_metadata(const std::vector<std::string>& files) {
  if (files.empty()) throw Error("DCP safetensors flavour: no .safetensors files");
  Metadata md;
  md.path = files.front();
  md.era = ClassEra::Safetensors;
  for (const auto& file : files) {
    const Header h = read_header(file);
    nlohmann::json sharding;  // fqn -> {"saved_offsets": [...]}
    if (auto x = h.j.find(kExtra); x != h.j.end() && x->is_object()) {
      if (auto s = x->find(kShardingInfo); s != x->end()) {
        if (!s->is_string()) fail(file, std::string("safetensors: ") + kShardingInfo + " is not a string");
        try {
          sharding = nlohmann::json::parse(s->get<std::string>());
        } catch (const nlohmann::json::exception& e) {
          fail(file, std::string("safetensors: ") + kShardingInfo + " is not JSON (" + e.what() + ")");
        }
        if (!sharding.is_object()) fail(file, std::string("safetensors: ") + kShardingInfo + " is not a JSON object");
      }
      if (auto v = x->find(kDcpVersion); v != x->end() && v->is_string() && !md.version) md.version = v->get<std::string>();
    }
    const std::string rel = fs::path(file).filename().string();
    for (const auto& [fqn, t] : h.j.items()) {
      if (fqn == kExtra) continue;
      const std::string what = "'" + escaped_brief(fqn) + "'";
      if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
          !t.contains("data_offsets"))
        fail(file, "safetensors: tensor " + what + " lacks dtype, shape or data_offsets");
      const auto dt = dtype_of(t["dtype"].get<std::string>());
      if (!dt) fail(file, "safetensors: tensor " + what + " has dtype " + t["dtype"].get<std::string>() +
                              ", which ucpkit has no type for");
      const std::vector<int64_t> shape = ints(t["shape"], file, what + " shape");
      const std::vector<int64_t> span = ints(t["data_offsets"], file, what + " data_offsets");
      std::vector<int64_t> offsets(shape.size(), 0);
      if (!sharding.is_null()) {
        const auto s = sharding.find(fqn);
        if (s == sharding.end() || !s->is_object() || !s->contains("saved_offsets"))
          fail(file, std::string("safetensors: ") + kShardingInfo + " has no saved_offsets for " + what);
        offsets = ints((*s)["saved_offsets"], file, what + " saved_offsets");
        if (offsets.size() != shape.size())
          fail(file, "safetensors: " + what + " saved_offsets " + std::to_string(offsets.size()) + "-d for a " +
                         std::to_string(shape.size()) + "-d tensor");
      }
      // The byte count checked for overflow: a wrapped product would let [2^32, 2^32] pass as 0 bytes.
      uint64_t bytes = dtype_size(*dt);
      bool wrapped = false;
      for (int64_t d : shape) wrapped |= d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
      if (wrapped || span.size() != 2 || span[0] > span[1] ||
          static_cast<uint64_t>(span[1]) > h.file_size - h.data_start ||
          static_cast<uint64_t>(span[1] - span[0]) != bytes)
        fail(file, "safetensors: tensor " + what + " data_offsets do not hold its shape x dtype inside the file");
      Entry* e = md.find(fqn);
      if (!e) {
        e = &md.add_entry(Entry{fqn, false, *dt, std::vector<int64_t>(shape.size(), 0), {}});
      } else if (e->dtype != *dt || e->size.size() != shape.size()) {
        fail(file, "safetensors: tensor " + what + " differs in dtype or rank from the earlier files' chunks");
      }
      for (size_t d = 0; d < shape.size(); ++d) e->size[d] = std::max(e->size[d], offsets[d] + shape[d]);
      e->chunks.push_back(Chunk{offsets, shape});
      Item it;
      it.fqn = fqn;
      it.offset = offsets;
      it.storage.relative_path = rel;
      it.storage.offset = h.data_start + static_cast<uint64_t>(span[0]);
      it.storage.length = static_cast<uint64_t>(span[1] - span[0]);
      it.storage.raw = true;
      md.items.push_back(std::move(it));
    }
  }
  index_metadata(md);
  return md;
}

Tensor raw_chunk(std::span<const uint8_t> bytes, DType dtype, const std::vector<int64_t>& sizes,
                 const std::string& name) {
  Tensor t = Tensor::zeros(dtype, sizes);
  auto out = t.storage()->mutable_bytes();
  if (out.size() != bytes.size())
    fail(name, "DCP: a raw item of " + std::to_string(bytes.size()) + " bytes for a chunk of " +
                   std::to_string(out.size()));
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return t;
}

int safetensors_world_size(const std::vector<std::string>& files) {
  long top = 0;
  for (const auto& f : files) {
    const std::string name = fs::path(f).filename().string();
    if (name.rfind("shard-", 0) != 0) continue;
    const size_t dash = name.find('-', 6);
    const std::string digits = name.substr(6, dash == std::string::npos ? 0 : dash - 6);
    if (!digits.empty() && digits.size() <= 7 && std::all_of(digits.begin(), digits.end(), ::isdigit))
      top = std::max(top, std::stol(digits));
  }
  return static_cast<int>(std::max(top, 1L));
}

}  // namespace ucpkit::formats::dcp
