// Decoder layers and MoE layers (see layers_map.h and docs/moe-replace.md).
#include "placement/layers_map.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"

namespace ucpkit::placement {
namespace {

[[noreturn]] void bad_spec(const std::string& spec, const std::string& why) {
  throw UsageError("--layers-map " + spec + ": " + why +
                   " (expected D:a-b[,c...], e.g. 61:3-60, or a model's config.json)");
}

int spec_int(const std::string& text, const std::string& spec) {
  if (text.empty() || text.size() > 9 || !std::all_of(text.begin(), text.end(), ::isdigit))
    bad_spec(spec, "\"" + text + "\" is not a layer number");
  return std::stoi(text);
}

LayersMap from_spec(const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) bad_spec(spec, "no such file, and no ':' after the number of decoder layers");
  LayersMap m;
  m.decoder_layers = spec_int(spec.substr(0, colon), spec);
  std::set<int> ids;
  std::stringstream list(spec.substr(colon + 1));
  for (std::string item; std::getline(list, item, ',');) {
    const size_t dash = item.find('-');
    const int a = spec_int(item.substr(0, dash), spec);
    const int b = dash == std::string::npos ? a : spec_int(item.substr(dash + 1), spec);
    if (b < a) bad_spec(spec, "range " + item + " is empty");
    if (b >= m.decoder_layers)
      bad_spec(spec, "layer " + std::to_string(b) + " is beyond the " + std::to_string(m.decoder_layers) +
                         " decoder layers (0.." + std::to_string(m.decoder_layers - 1) + ")");
    for (int i = a; i <= b; ++i) ids.insert(i);
  }
  if (ids.empty()) bad_spec(spec, "no MoE layer listed");
  m.moe_layers.assign(ids.begin(), ids.end());
  return m;
}

int config_int(const nlohmann::json& c, const char* key, int fallback, const std::string& path) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_number_integer() || c[key].get<long long>() < 0 || c[key].get<long long>() > 1000000)
    throw Error(path + ": \"" + key + "\" must be a non-negative integer");
  return c[key].get<int>();
}

// The MoE rule of each model family, as its Hugging Face model code decides per decoder layer.
LayersMap from_config(const std::string& path) {
  const std::string text = read_text_file(path, "model config");
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw Error(path + ": not a JSON model config: " + e.what());
  }
  if (c.contains("text_config") && c["text_config"].is_object()) c = c["text_config"];
  LayersMap m;
  m.decoder_layers = config_int(c, "num_hidden_layers", -1, path);
  if (m.decoder_layers <= 0) throw Error(path + ": no \"num_hidden_layers\" (the number of decoder layers)");
  std::function<bool(int)> moe;
  if (config_int(c, "n_routed_experts", 0, path) > 0) {  // DeepSeek V2 / V3
    const int k = config_int(c, "first_k_dense_replace", 0, path);
    const int freq = std::max(1, config_int(c, "moe_layer_freq", 1, path));
    moe = [=](int i) { return i >= k && i % freq == 0; };
  } else if (config_int(c, "num_experts", 0, path) > 0) {  // Qwen2-MoE / Qwen3-MoE
    const int step = std::max(1, config_int(c, "decoder_sparse_step", 1, path));
    std::set<int> dense;
    if (c.contains("mlp_only_layers") && c["mlp_only_layers"].is_array())
      for (const auto& v : c["mlp_only_layers"])
        if (v.is_number_integer()) dense.insert(v.get<int>());
    moe = [=](int i) { return !dense.count(i) && (i + 1) % step == 0; };
  } else if (config_int(c, "num_local_experts", 0, path) > 0) {  // Mixtral: every layer
    moe = [](int) { return true; };
  } else {
    throw Error(path +
                ": no MoE layer rule known for this config (expected n_routed_experts, num_experts or "
                "num_local_experts); give --layers-map D:a-b instead");
  }
  for (int i = 0; i < m.decoder_layers; ++i)
    if (moe(i)) m.moe_layers.push_back(i);
  if (m.moe_layers.empty()) throw Error(path + ": the config makes no decoder layer an MoE layer");
  return m;
}

}  // namespace

LayersMap parse_layers_map(const std::string& spec) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(spec, ec)) return from_config(spec);
  return from_spec(spec);
}

LoadMatrix moe_rows(const LoadMatrix& loads, const LayersMap& map, const std::string& loads_name) {
  const size_t moe = map.moe_layers.size();
  if (loads.layers == moe) return loads;
  if (loads.layers != static_cast<size_t>(map.decoder_layers))
    throw Error(loads_name + ": " + std::to_string(loads.layers) + " layers of loads, but --layers-map has " +
                std::to_string(map.decoder_layers) + " decoder layers of which " + std::to_string(moe) +
                " are MoE layers (the loads must have one of the two)");
  LoadMatrix out;
  out.layers = moe;
  out.experts = loads.experts;
  for (int l : map.moe_layers) {
    auto row = loads.layer(static_cast<size_t>(l));
    out.values.insert(out.values.end(), row.begin(), row.end());
  }
  return out;
}

std::vector<int> parse_pp_partition(const std::string& text) {
  std::vector<int> out;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    if (item.empty() || item.size() > 9 || !std::all_of(item.begin(), item.end(), ::isdigit) || std::stoi(item) < 1)
      throw UsageError("--pp-layer-partition " + text +
                       ": expected positive numbers of decoder layers per stage, a,b,...");
    out.push_back(std::stoi(item));
  }
  if (out.empty() || text.back() == ',')
    throw UsageError("--pp-layer-partition " + text +
                     ": expected positive numbers of decoder layers per stage, a,b,...");
  return out;
}

std::vector<PpStage> pp_stages(const LayersMap& map, int pp_size, const std::vector<int>& partition) {
  const int D = map.decoder_layers;
  if (pp_size < 1 || pp_size > D)
    throw UsageError("--pp-size " + std::to_string(pp_size) + " must be 1.." + std::to_string(D) +
                     " (the model's decoder layers)");
  std::vector<int> sizes = partition;
  if (sizes.empty()) {
    sizes.assign(pp_size, D / pp_size);
    for (int i = 2; i < D % pp_size + 2; ++i) sizes[pp_size - i]++;
  } else {
    long long sum = 0;
    for (int x : sizes) {
      if (x < 1) throw UsageError("--pp-layer-partition: every stage needs at least one decoder layer");
      sum += x;
    }
    if (static_cast<int>(sizes.size()) != pp_size || sum != D)
      throw UsageError("--pp-layer-partition has " + std::to_string(sizes.size()) + " stages summing to " +
                       std::to_string(sum) + " layers; --pp-size " + std::to_string(pp_size) + " and " +
                       std::to_string(D) + " decoder layers need " + std::to_string(pp_size) + " summing to " +
                       std::to_string(D));
  }
  std::vector<PpStage> out;
  int first = 0, row = 0;
  for (int s = 0; s < pp_size; ++s) {
    PpStage st;
    st.stage = s;
    st.first_layer = first;
    st.end_layer = first + sizes[s];
    st.first_moe_row = row;
    for (int l : map.moe_layers)
      if (l >= st.first_layer && l < st.end_layer) st.moe_layers.push_back(l);
    row += static_cast<int>(st.moe_layers.size());
    st.end_moe_row = row;
    first = st.end_layer;
    out.push_back(std::move(st));
  }
  return out;
}

}  // namespace ucpkit::placement
