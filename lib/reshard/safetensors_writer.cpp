// safetensors: 8-byte little-endian header length, JSON header (dtype, shape, data_offsets), raw bytes.
#include "reshard/safetensors_writer.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <tbb/parallel_for.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/staging.h"
#include "io/safetensors_file.h"
#include "io/shape.h"
#include "parallel/threads.h"
#include "reshard/output_writer.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

namespace {

const formats::universal::UniversalBuffer* buffer_at(const ModelInfo& model, int i) {
  const size_t n = model.params.size();
  return static_cast<size_t>(i) < n ? nullptr : &model.buffers.at(static_cast<size_t>(i) - n);
}

}  // namespace

const std::vector<int64_t>& safetensors_shape(const ModelInfo& model, int i) {
  const auto* b = buffer_at(model, i);
  return b ? b->shape : model.params[i].shape;
}

const std::string& safetensors_name(const ModelInfo& model, int i) {
  const auto* b = buffer_at(model, i);
  return b ? b->name : model.params[i].name;
}

DType safetensors_dtype(const ModelInfo& model, int i, DType dtype) {
  const auto* b = buffer_at(model, i);
  return b ? *dtype_from_name(b->dtype) : dtype;  // a buffer keeps its own (model_info checked the name)
}

uint64_t safetensors_bytes(const ModelInfo& model, int i, DType dtype) {
  return static_cast<uint64_t>(numel_of(safetensors_shape(model, i))) * dtype_size(safetensors_dtype(model, i, dtype));
}

std::vector<std::vector<int>> safetensors_shards(const ModelInfo& model, DType dtype, uint64_t shard_bytes) {
  std::vector<std::vector<int>> shards;
  uint64_t used = 0;
  for (size_t i = 0; i < model.params.size() + model.buffers.size(); ++i) {
    const uint64_t n = safetensors_bytes(model, static_cast<int>(i), dtype);
    if (shards.empty() || (used > 0 && used + n > shard_bytes)) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(static_cast<int>(i));
    used += n;
  }
  return shards;
}

uint64_t write_safetensors(const ModelInfo& model, UniversalReader& reader, DType dtype, uint64_t shard_bytes,
                           const std::string& dir, int threads) {
  const auto shards = safetensors_shards(model, dtype, shard_bytes);
  const size_t es = dtype_size(dtype);
  std::vector<std::string> names(shards.size());
  for (size_t k = 0; k < shards.size(); ++k) names[k] = safetensors_shard_file(k, shards.size());
  std::vector<uint64_t> written(shards.size(), 0);
  uint64_t total = 0;
  for (const auto& sh : shards)
    for (int i : sh) total += safetensors_bytes(model, i, dtype);

  parallel::in_arena(threads, [&] {
    tbb::parallel_for(size_t{0}, shards.size(), [&](size_t k) {
      std::vector<SafetensorsEntry> entries;
      for (int i : shards[k]) {
        entries.push_back({safetensors_name(model, i), std::string(dtype_safetensors_name(safetensors_dtype(model, i, dtype))),
                           safetensors_shape(model, i), safetensors_bytes(model, i, dtype)});
      }
      const std::string h = safetensors_header(entries, {{"format", "pt"}});
      AtomicFile f((fs::path(dir) / names[k]).string());
      f.write(h.data(), h.size());
      // Each tensor is streamed through one reused window (cache-warm buffers are copied by the
      // kernel far faster than large cold ones), never held whole.
      constexpr int64_t kWindow = 1 << 20;  // elements
      thread_local std::vector<float> f32;
      thread_local std::vector<uint8_t> buf;
      f32.resize(kWindow);
      buf.resize(kWindow * es);
      for (int i : shards[k]) {
        check_interrupted();
        if (const auto* b = buffer_at(model, i)) {  // as stored: its own dtype, whole (buffers are small)
          const Tensor t = read_buffer(reader.dir(), *b, reader.verifying());
          const auto bytes = t.contiguous_bytes();
          f.write(bytes.data(), bytes.size());
          continue;
        }
        const auto& p = model.params[i];
        TpSlice whole{0, {{0, p.shape.empty() ? 1 : p.shape[0]}}, p.shape, -1};
        const int64_t n = whole.numel();
        for (int64_t a = 0; a < n; a += kWindow) {
          const int64_t b = std::min(n, a + kWindow);
          reader.read_range(i, "fp32", whole, a, b, f32.data());
          const size_t m = static_cast<size_t>(b - a);
          if (dtype == DType::Float32) {
            f.write(f32.data(), m * 4);
          } else {
            convert_from_fp32(f32.data(), m, dtype, buf.data());
            f.write(buf.data(), m * es);
          }
        }
      }
      written[k] = f.offset();
      f.commit();
    });
  });
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k)
    for (int i : shards[k]) map[safetensors_name(model, i)] = names[k];
  index["weight_map"] = map;
  const std::string text = index.dump(2);
  write_file_atomic((fs::path(dir) / "model.safetensors.index.json").string(), text);
  uint64_t sum = text.size();
  for (auto w : written) sum += w;
  return sum;
}


namespace {

// --format safetensors: the weights only, unsharded (the parallel layout does not apply); rank 0 writes
// every shard and the index.
class SafetensorsOutput final : public OutputWriter {
 public:
  bool takes_layout_options() const override { return false; }
  std::string why_no_layout() const override { return " (one set of unsharded weights)"; }
  bool takes_world_size() const override { return false; }
  void prepare(const LoadOptions&, Prepared&) const override {}

  // The dtype and which parameters go to which shard.
  nlohmann::json plan_json(const LoadOptions& options, const Prepared& p) const override {
    nlohmann::json j;
    j["format"] = std::string(output_format_name(OutputFormat::Safetensors));
    j["dtype"] = std::string(dtype_name(p.plan.target.dtype));
    j["from_source"] = p.from_source;
    auto& shards = j["shards"] = nlohmann::json::array();
    for (const auto& sh : safetensors_shards(p.model, p.plan.target.dtype, options.shard_bytes)) {
      nlohmann::json names = nlohmann::json::array();
      for (int i : sh) names.push_back(safetensors_name(p.model, i));
      shards.push_back(names);
    }
    return j;
  }

  void write(LoadRun& r, const std::string& staged) const override {
    const auto& o = r.options;
    r.failed.guard([&] {
      if (r.mpi.rank() == 0) {
        const DType dtype = r.prep.plan.target.dtype;
        r.written += write_safetensors(r.prep.model, r.reader, dtype, o.shard_bytes, staged, r.threads);
        r.files += safetensors_shards(r.prep.model, dtype, o.shard_bytes).size() + 1;
      }
    });
  }
};

[[maybe_unused]] const bool kSafetensorsWriterRegistered =
    register_output_writer(OutputFormat::Safetensors, std::make_shared<SafetensorsOutput>());

}  // namespace

}  // namespace ucpkit::reshard
