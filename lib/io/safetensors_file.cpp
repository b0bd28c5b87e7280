// In-memory safetensors reader and writer for small tensors.
#include "io/safetensors_file.h"

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ucpkit {
namespace {

size_t element_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

template <typename T>
double element(const std::string& bytes, size_t i) {
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return static_cast<double>(v);
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<double> SafetensorsTensor::to_doubles(const std::string& name) const {
  size_t n = static_cast<size_t>(numel());
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == "I64") out[i] = element<int64_t>(bytes, i);
    else if (dtype == "I32") out[i] = element<int32_t>(bytes, i);
    else if (dtype == "I16") out[i] = element<int16_t>(bytes, i);
    else if (dtype == "I8") out[i] = element<int8_t>(bytes, i);
    else if (dtype == "U8") out[i] = element<uint8_t>(bytes, i);
    else if (dtype == "F32") out[i] = element<float>(bytes, i);
    else if (dtype == "F64") out[i] = element<double>(bytes, i);
    else throw Error(name + ": tensor dtype " + dtype + " is not a count type (I8..I64, U8, F32, F64)");
  }
  return out;
}

std::string safetensors_shard_file(size_t k, size_t count) {
  if (count == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, count);
  return buf;
}

std::string safetensors_tensor_i64(const std::vector<int64_t>& values) {
  std::string b(values.size() * sizeof(int64_t), '\0');
  if (!values.empty()) std::memcpy(b.data(), values.data(), b.size());
  return b;
}

std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // data aligned to 8 bytes, as the reference writer pads
  std::string out(8, '\0');
  const uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + h;
}

std::string safetensors_bytes(const std::map<std::string, SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, t.dtype, t.shape, t.bytes.size()});
  std::string out = safetensors_header(entries, metadata);
  for (const auto& [name, t] : tensors) out += t.bytes;
  return out;
}

std::map<std::string, SafetensorsEntryAt> parse_safetensors_header(std::string_view bytes, const std::string& name,
                                                                   std::map<std::string, std::string>* metadata) {
  if (bytes.size() < 8) throw Error(name + ": not a safetensors file (shorter than its 8-byte header length)");
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  if (len > bytes.size() - 8) throw Error(name + ": safetensors header length " + std::to_string(len) + " beyond the file");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(len));
  } catch (const std::exception& e) {
    throw Error(name + ": safetensors header is not JSON: " + e.what());
  }
  if (!header.is_object()) throw Error(name + ": safetensors header is not a JSON object");
  const uint64_t data = 8 + len;
  std::map<std::string, SafetensorsEntryAt> out;
  for (const auto& [key, v] : header.items()) {
    if (key == "__metadata__") {
      if (metadata && v.is_object())
        for (const auto& [mk, mv] : v.items())
          if (mv.is_string()) (*metadata)[mk] = mv.get<std::string>();
      continue;
    }
    try {
      SafetensorsEntryAt t;
      t.dtype = v.at("dtype").get<std::string>();
      t.shape = v.at("shape").get<std::vector<int64_t>>();
      auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
      size_t es = element_size(t.dtype);
      if (es == 0) throw Error("unknown dtype " + t.dtype);
      int64_t numel = 1;
      for (int64_t d : t.shape) {
        if (d < 0) throw Error("negative dimension");
        numel *= d;
      }
      if (off.size() != 2 || off[0] > off[1] || off[1] > bytes.size() - data)
        throw Error("data_offsets outside the file");
      if (off[1] - off[0] != static_cast<uint64_t>(numel) * es)
        throw Error("data_offsets hold " + std::to_string(off[1] - off[0]) + " bytes, shape and dtype need " +
                    std::to_string(static_cast<uint64_t>(numel) * es));
      t.begin = data + off[0];
      t.end = data + off[1];
      out.emplace(key, std::move(t));
    } catch (const Error& e) {
      throw Error(name + ": tensor \"" + key + "\": " + e.what());
    } catch (const std::exception& e) {
      throw Error(name + ": tensor \"" + key + "\": malformed entry (" + e.what() + ")");
    }
  }
  return out;
}

std::map<std::string, SafetensorsTensor> parse_safetensors(const std::string& bytes, const std::string& name,
                                                           std::map<std::string, std::string>* metadata) {
  std::map<std::string, SafetensorsTensor> out;
  for (auto& [key, e] : parse_safetensors_header(bytes, name, metadata))
    out.emplace(key, SafetensorsTensor{e.dtype, e.shape, bytes.substr(e.begin, e.end - e.begin)});
  return out;
}

}  // namespace ucpkit
