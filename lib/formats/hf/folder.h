// A Hugging Face model folder as save_pretrained writes it (docs/hf.md): config.json, and the weights
// in model.safetensors or in shards named by model.safetensors.index.json ("weight_map": tensor ->
// file). Opened once: config.json parsed, every shard's header read (the shards mapped, not read), and
// checked as a whole before anything is converted: a shard the index names but the folder lacks, a
// tensor in two shards, a tensor the index places in a shard that does not hold it, a dtype ucpkit
// does not convert: Error naming the file and the tensor.
#pragma once
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "io/dtype.h"
#include "io/tensor.h"

namespace ucpkit::formats::hf {

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kSingleFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";

struct TensorRef {
  std::string file;  // the shard's path
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // bytes in the shard
};

class Folder {
 public:
  explicit Folder(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  // The tensor `name` (a copy of its bytes, row-major). Throws Error naming the folder when absent.
  Tensor read(const std::string& name) const;
  // Its bytes where they lie in the shard's map (row-major, not copied) and that map, which keeps them mapped and
  // drops their pages once read (MappedFile::drop_pages). Throws Error naming the folder when absent.
  std::pair<std::span<const uint8_t>, std::shared_ptr<const MappedFile>> mapped(const std::string& name) const;

 private:
  std::string dir_;
  nlohmann::json config_;
  std::map<std::string, TensorRef> tensors_;
  std::map<std::string, std::shared_ptr<const MappedFile>> files_;
};

// Whether `dir` looks like a Hugging Face model folder (config.json beside model.safetensors or its index).
bool is_hf_folder(const std::string& dir);

}  // namespace ucpkit::formats::hf
