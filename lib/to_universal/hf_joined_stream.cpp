// The joined value made on demand (hf_joined_stream.h).
#include "to_universal/hf_joined_stream.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/megatron_core/deepspeed_map.h"

namespace ucpkit::to_universal {

Tensor hf_joined_stream(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan,
                        const formats::hf::ImportParam& p) {
  struct Source {
    std::span<const uint8_t> bytes;
    std::shared_ptr<const MappedFile> map;
    DType dtype;
  };
  struct Row {
    size_t source;
    uint64_t offset;  // of its first byte in the source
  };
  struct Rows {
    std::vector<Source> sources;
    std::vector<Row> order;  // the joined tensor's rows
    int64_t cols = 1;
  };
  auto rows = std::make_shared<Rows>();
  int64_t numel = 1;
  for (int64_t d : p.shape) numel *= d;
  const int64_t height = p.shape.empty() ? 1 : p.shape[0];
  rows->cols = height > 0 ? numel / height : 1;
  const int64_t cols = std::max<int64_t>(rows->cols, 1);
  auto bad = [&](const std::string& what) { return Error(folder.dir() + ": " + p.name + ": " + what); };
  if (p.index >= 0 && p.sources.size() != 1) throw bad("an expert of a fused tensor joined with others (internal)");
  std::vector<Row> joined;  // the sources' rows one after another
  for (const std::string& name : p.sources) {
    auto [bytes, map] = folder.mapped(name);
    const DType dtype = folder.tensors().at(name).dtype;
    if (!dtype_is_floating(dtype))
      throw Error(folder.dir() + ": tensor " + name + " is " + std::string(dtype_name(dtype)) + ", not a floating weight");
    const uint64_t es = dtype_size(dtype), row = static_cast<uint64_t>(cols) * es;
    uint64_t begin = 0, size = bytes.size();
    if (p.index >= 0) {  // element `index` of the first axis
      begin = static_cast<uint64_t>(p.index) * static_cast<uint64_t>(numel) * es, size = static_cast<uint64_t>(numel) * es;
      if (begin + size > bytes.size()) throw bad("expert " + std::to_string(p.index) + " lies past the end of " + name);
    }
    if (size % row != 0) throw bad(name + " is not made of rows of " + std::to_string(cols));
    for (uint64_t at = 0; at < size; at += row) joined.push_back({rows->sources.size(), begin + at});
    rows->sources.push_back({bytes, map, dtype});
  }
  if (static_cast<int64_t>(joined.size()) != height)
    throw bad("its tensors hold " + std::to_string(joined.size()) + " rows, the plan " + std::to_string(height));
  if (p.merge == formats::hf::Split::Qkv) {
    // qkv_split_to_grouped's order: the runs that take the grouped rows back to [Q; K; V], read the other way (they
    // also refuse a shape that is not (heads + 2 groups) x head size, as the whole join does).
    rows->order.resize(joined.size());
    for (const auto& run : formats::megatron_core::qkv_grouped_to_split_rows(p.shape.size(), height,
                                                                            {plan.heads, plan.kv_heads, plan.head_dim}))
      for (int64_t r = 0; r < run.rows; ++r) rows->order[static_cast<size_t>(run.in + r)] = joined[static_cast<size_t>(run.out + r)];
  } else {
    rows->order = std::move(joined);
  }
  auto fill = [rows, cols](uint64_t off, std::span<uint8_t> out) {
    int64_t e = static_cast<int64_t>(off / 4), left = static_cast<int64_t>(out.size() / 4);
    uint8_t* to = out.data();
    while (left > 0) {
      const Row& r = rows->order[static_cast<size_t>(e / cols)];
      const Source& s = rows->sources[r.source];
      const int64_t c = e % cols, len = std::min(cols - c, left);
      const uint64_t es = dtype_size(s.dtype);
      const uint8_t* from = s.bytes.data() + r.offset + static_cast<uint64_t>(c) * es;
      convert_floats(from, s.dtype, to, DType::Float32, static_cast<size_t>(len));
      s.map->drop_pages({from, static_cast<size_t>(len) * es});
      e += len, left -= len, to += static_cast<size_t>(len) * 4;
    }
  };
  return Tensor(Storage::generated(DType::Float32, numel, fill), 0, p.shape, Tensor::contiguous_strides(p.shape));
}

}  // namespace ucpkit::to_universal
