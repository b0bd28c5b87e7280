// SGLang / vLLM expert-location outputs and expert-load dump inputs.
#include "placement/engine_formats.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/pickle/value.h"
#include "io/safetensors_file.h"
#include "io/torch/torch_file.h"

namespace ucpkit::placement {
namespace {

std::vector<double> tensor_doubles(const Tensor& t, const std::string& name) {
  Tensor c = t.contiguous();
  std::vector<double> out;
  auto conv = [&](auto tag) {
    using T = decltype(tag);
    auto v = c.to_vector<T>();
    out.assign(v.begin(), v.end());
  };
  switch (c.dtype()) {
    case DType::Int64: conv(int64_t{}); break;
    case DType::Int32: conv(int32_t{}); break;
    case DType::Int16: conv(int16_t{}); break;
    case DType::Int8: conv(int8_t{}); break;
    case DType::UInt8: conv(uint8_t{}); break;
    case DType::Float64: conv(double{}); break;
    case DType::Float32: conv(float{}); break;
    default:
      throw Error(name + ": \"logical_count\" has dtype " + std::string(dtype_name(c.dtype())) + ", not a count type");
  }
  return out;
}

// [layers][experts] from a 2-D tensor, or summed over the leading dimension of a 3-D one.
LoadMatrix from_dense(const std::vector<double>& v, const std::vector<int64_t>& shape, const std::string& name,
                      const std::string& key) {
  if (shape.size() != 2 && shape.size() != 3)
    throw Error(name + ": \"" + key + "\" must be [layers, experts] or [window, layers, experts], has " +
                std::to_string(shape.size()) + " dimensions");
  size_t w = shape.size() == 3 ? static_cast<size_t>(shape[0]) : 1;
  LoadMatrix m;
  m.layers = static_cast<size_t>(shape[shape.size() - 2]);
  m.experts = static_cast<size_t>(shape[shape.size() - 1]);
  if (w == 0 || m.layers == 0 || m.experts == 0) throw Error(name + ": \"" + key + "\" is empty");
  m.values.assign(m.layers * m.experts, 0.0);
  for (size_t s = 0; s < w; ++s)
    for (size_t i = 0; i < m.values.size(); ++i) m.values[i] += v[s * m.values.size() + i];
  return m;
}

LoadMatrix sglang_dump(const std::string& path) {
  TorchFile f = load_torch_file(path);
  if (!f.root || !f.root->is(pickle::Kind::Dict))
    throw Error(path + ": expected SGLang's expert-distribution dump (a dict with \"logical_count\")");
  auto lc = f.root->get("logical_count");
  if (!lc) throw Error(path + ": no \"logical_count\" (SGLang's stat dump; per-pass or per-token dumps are not loads)");
  if (!lc->is(pickle::Kind::Tensor)) throw Error(path + ": \"logical_count\" is not a tensor");
  const Tensor& t = lc->as_tensor();
  return from_dense(tensor_doubles(t, path), t.shape(), path, "logical_count");
}

LoadMatrix vllm_dump(const std::string& path) {
  auto tensors = parse_safetensors(read_text_file(path), path);
  auto get = [&](const char* key) -> const SafetensorsTensor* {
    auto it = tensors.find(key);
    return it == tensors.end() ? nullptr : &it->second;
  };
  for (const char* key : {"global_expert_load_window", "logical_count"})
    if (const auto* t = get(key)) return from_dense(t->to_doubles(path), t->shape, path, key);
  const SafetensorsTensor* window = get("expert_load_window");
  const char* wkey = "expert_load_window";
  if (!window) window = get("expert_load_pass"), wkey = "expert_load_pass";
  if (!window)
    throw Error(path +
                ": no expert loads (expected \"expert_load_window\" or \"expert_load_pass\" with "
                "\"physical_to_logical_map\", or \"global_expert_load_window\")");
  const SafetensorsTensor* p2l = get("physical_to_logical_map");
  if (!p2l) throw Error(path + ": \"" + wkey + "\" counts physical experts; \"physical_to_logical_map\" is missing");
  if (p2l->shape.size() != 2) throw Error(path + ": \"physical_to_logical_map\" must be [layers, physical experts]");
  size_t L = static_cast<size_t>(p2l->shape[0]), P = static_cast<size_t>(p2l->shape[1]);
  size_t W = window->shape.size() == 3 ? static_cast<size_t>(window->shape[0]) : 1;
  bool ok = window->shape.size() == 3
                ? (static_cast<size_t>(window->shape[1]) == L && static_cast<size_t>(window->shape[2]) == P)
                : (window->shape.size() == 2 && static_cast<size_t>(window->shape[0]) == L &&
                   static_cast<size_t>(window->shape[1]) == P);
  if (!ok)
    throw Error(path + ": \"" + std::string(wkey) + "\" shape does not match \"physical_to_logical_map\" [" +
                std::to_string(L) + ", " + std::to_string(P) + "]");
  auto map = p2l->to_doubles(path);
  auto counts = window->to_doubles(path);
  double max_e = -1;
  for (double e : map) {
    if (e < 0 || e != std::floor(e)) throw Error(path + ": \"physical_to_logical_map\" holds " + std::to_string(e));
    max_e = std::max(max_e, e);
  }
  LoadMatrix m;
  m.layers = L;
  m.experts = static_cast<size_t>(max_e) + 1;
  if (L == 0 || P == 0) throw Error(path + ": \"physical_to_logical_map\" is empty");
  m.values.assign(L * m.experts, 0.0);
  for (size_t w = 0; w < W; ++w)
    for (size_t l = 0; l < L; ++l)
      for (size_t p = 0; p < P; ++p)
        m.values[l * m.experts + static_cast<size_t>(map[l * P + p])] += counts[(w * L + l) * P + p];
  return m;
}

}  // namespace

std::string sglang_expert_location_json(const Plan& plan, const LayersMap* map) {
  if (map && map->moe_layers.size() != plan.layers.size())
    throw Error("internal: the layers map has " + std::to_string(map->moe_layers.size()) + " MoE layers, the plan " +
                std::to_string(plan.layers.size()));
  const size_t rows = map ? static_cast<size_t>(map->decoder_layers) : plan.layers.size();
  std::vector<int> plan_row(rows, -1);  // decoder layer -> plan layer (-1: dense)
  for (size_t l = 0; l < plan.layers.size(); ++l)
    plan_row[map ? static_cast<size_t>(map->moe_layers[l]) : l] = static_cast<int>(l);
  std::ostringstream o;
  o << "{\"physical_to_logical_map\": [";
  for (size_t r = 0; r < rows; ++r) {
    o << (r ? ", [" : "[");
    if (plan_row[r] >= 0) {
      const auto& p = plan.layers[plan_row[r]].phy2log;
      for (size_t i = 0; i < p.size(); ++i) o << (i ? ", " : "") << p[i];
    } else {
      for (int i = 0; i < plan.cluster.slots(); ++i) o << (i ? ", " : "") << i % plan.experts;
    }
    o << "]";
  }
  o << "]}\n";
  return o.str();
}

std::string vllm_eplb_state_safetensors(const Plan& plan) {
  const int64_t L = static_cast<int64_t>(plan.layers.size()), P = plan.cluster.slots(), E = plan.experts;
  int64_t width = std::max<int64_t>(1, P - E + 1);
  std::vector<std::vector<int>> counts(L);
  for (int64_t l = 0; l < L; ++l) {
    counts[l] = logical_counts(plan.layers[l].phy2log, plan.experts);
    for (int c : counts[l]) width = std::max<int64_t>(width, c);
  }
  std::vector<int64_t> p2l, l2p(static_cast<size_t>(L * E * width), -1), cnt;
  p2l.reserve(static_cast<size_t>(L * P));
  cnt.reserve(static_cast<size_t>(L * E));
  for (int64_t l = 0; l < L; ++l) {
    std::vector<int64_t> fill(static_cast<size_t>(E), 0);
    const auto& phy = plan.layers[l].phy2log;
    for (int64_t p = 0; p < P; ++p) {
      int64_t e = phy[static_cast<size_t>(p)];
      p2l.push_back(e);
      l2p[static_cast<size_t>((l * E + e) * width + fill[static_cast<size_t>(e)]++)] = p;
    }
    for (int64_t e = 0; e < E; ++e) cnt.push_back(fill[static_cast<size_t>(e)]);
  }
  std::map<std::string, SafetensorsTensor> t;
  t["physical_to_logical_map"] = {"I64", {L, P}, safetensors_tensor_i64(p2l)};
  t["logical_to_physical_map"] = {"I64", {L, E, width}, safetensors_tensor_i64(l2p)};
  t["logical_replica_count"] = {"I64", {L, E}, safetensors_tensor_i64(cnt)};
  return safetensors_bytes(t, {{"format", "vllm EplbModelState"},
                               {"num_gpus", std::to_string(plan.cluster.gpus())},
                               {"num_redundant_experts", std::to_string(P - E)},
                               {"algorithm", plan.algorithm}});
}

LoadMatrix read_engine_loads(const std::string& path) {
  LoadMatrix m = path.ends_with(".pt") ? sglang_dump(path) : vllm_dump(path);
  validate_loads(m, path);
  return m;
}

}  // namespace ucpkit::placement
