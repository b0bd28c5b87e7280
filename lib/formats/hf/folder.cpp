// A Hugging Face model folder (folder.h).
#include "formats/hf/folder.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/safetensors_file.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::hf {

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not JSON (" + e.what() + ")");
  }
}

bool regular(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

}  // namespace

bool is_hf_folder(const std::string& dir) {
  const fs::path d(dir);
  return regular(d / kConfigFile) && (regular(d / kSingleFile) || regular(d / kIndexFile));
}

Folder::Folder(const std::string& dir) : dir_(dir) {
  const fs::path d(dir);
  const std::string config_path = (d / kConfigFile).string();
  if (!regular(config_path)) throw Error(config_path + ": missing (a Hugging Face model folder has config.json)");
  config_ = read_json(config_path);
  if (!config_.is_object()) throw Error(config_path + ": not a JSON object");
  // Which file holds which tensor: the index's weight_map, or the one file.
  std::map<std::string, std::string> placed;  // tensor -> shard file name (from the index)
  std::set<std::string> shards;
  const std::string index_path = (d / kIndexFile).string();
  if (regular(index_path)) {
    const nlohmann::json index = read_json(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(index_path + ": no \"weight_map\" object");
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) throw Error(index_path + ": weight_map[\"" + escaped_brief(name) + "\"] is not a file name");
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        throw Error(index_path + ": weight_map[\"" + escaped_brief(name) + "\"] names '" + escaped_brief(f) + "', not a file in the folder");
      placed[name] = f;
      shards.insert(f);
    }
  } else {
    shards.insert(kSingleFile);
  }
  for (const auto& shard : shards) {
    const std::string path = (d / shard).string();
    if (!regular(path))
      throw Error(path + ": missing" + (placed.empty() ? std::string() : " (" + index_path + " names it)"));
    auto m = MappedFile::open(path);
    const std::string_view bytes(reinterpret_cast<const char*>(m->data()), m->size());
    for (auto& [name, e] : parse_safetensors_header(bytes, path)) {
      if (!placed.empty()) {
        const auto it = placed.find(name);
        if (it == placed.end()) throw Error(path + ": tensor " + escaped_brief(name) + " is not in " + index_path);
        if (it->second != shard)
          throw Error(path + ": tensor " + escaped_brief(name) + " is in two shards (here, and in " + it->second + " where " +
                      index_path + " places it)");
      }
      if (tensors_.count(name)) throw Error(path + ": tensor " + escaped_brief(name) + " is in two shards");
      TensorRef r;
      r.file = path;
      std::optional<DType> dt;
      for (DType t : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64, DType::Int64, DType::Int32,
                      DType::Int16, DType::Int8, DType::UInt8, DType::Bool})
        if (dtype_safetensors_name(t) == e.dtype) dt = t;
      if (!dt) throw Error(path + ": tensor " + escaped_brief(name) + " has dtype " + e.dtype + ", which ucpkit does not convert");
      r.dtype = *dt;
      r.shape = e.shape;
      r.begin = e.begin;
      r.end = e.end;
      tensors_.emplace(name, std::move(r));
    }
    files_[path] = std::move(m);
  }
  for (const auto& [name, file] : placed)
    if (!tensors_.count(name)) throw Error((d / file).string() + ": tensor " + escaped_brief(name) + " is missing (" + index_path + " names it)");
  if (tensors_.empty()) throw Error(dir + ": a Hugging Face folder without tensors");
}

Tensor Folder::read(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(dir_ + ": no tensor " + escaped_brief(name));
  const TensorRef& r = it->second;
  const auto& m = files_.at(r.file);
  std::vector<uint8_t> bytes(m->data() + r.begin, m->data() + r.end);
  // Copied: its pages leave this process's memory (a model larger than memory is read tensor by tensor in bounded RSS).
  MappedFile::done_with({m->data() + r.begin, r.end - r.begin});
  return Tensor::from_bytes(r.dtype, r.shape, std::move(bytes));
}

std::pair<std::span<const uint8_t>, std::shared_ptr<const MappedFile>> Folder::mapped(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(dir_ + ": no tensor " + escaped_brief(name));
  const TensorRef& r = it->second;
  const auto& m = files_.at(r.file);
  return {{m->data() + r.begin, r.end - r.begin}, m};
}

}  // namespace ucpkit::formats::hf
