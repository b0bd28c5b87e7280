#include "formats/megatron_core/key_model.h"

#include <regex>

#include "core/error.h"

namespace ucpkit::formats::megatron_core {

namespace {

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (;;) {
    const size_t e = s.find('.', b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}

bool is_number(const std::string& s) {
  return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (const char c : s)
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

[[noreturn]] void unknown(const std::string& file, const std::string& fqn, const std::string& why) {
  fail(file, "Megatron-Core torch_dist: unknown key " + escaped_brief(fqn) + " (" + why + ")");
}

// The known ShardedObject keys (docs/formats-megatron-core.md lists where each comes from).
bool known_object(const std::string& key) {
  static const std::regex dist_optim(
      R"(optimizer\.distributed\.dp_group_idx_\d+\.(optimizer|per_bucket_numel|per_bucket_numel_unpadded|param_state))");
  static const std::regex extra_state(R"((embedding|decoder|output_layer)\.[A-Za-z0-9_.]*_extra_state)");
  return key == "common_state" || key == "rng_state" || key == "rerun_state_machine_state" ||
         std::regex_match(key, dist_optim) || std::regex_match(key, extra_state);
}

}  // namespace

ModelKey parse_model_key(const std::string& key, const std::string& file) {
  const auto parts = split_dots(key);
  for (const auto& p : parts)
    if (!is_identifier(p) && !is_number(p)) unknown(file, key, "not a module path");
  const std::string& root = parts[0];
  if (root != "embedding" && root != "decoder" && root != "output_layer" || parts.size() < 2)
    unknown(file, key, "not under embedding, decoder or output_layer");
  ModelKey m;
  m.key = key;
  size_t i = 1;
  if (root == "decoder" && parts[1] == "layers") {
    if (parts.size() < 4) unknown(file, key, "no parameter after decoder.layers");
    m.head = "decoder.layers.";
    i = 2;
    if (is_number(parts[2])) {
      m.layer = std::stoll(parts[2]);
      i = 3;
    } else {
      m.layer_axis = true;
    }
  }
  // The last `experts` component followed by more marks the expert part: an expert axis, or the
  // expert number (singleton_local_shards). An earlier one is a module name (MoELayer.experts:
  // mlp.experts.experts.linear_fc1.weight).
  size_t marker = parts.size();
  for (size_t k = i; k + 2 < parts.size() + 1; ++k)
    if (parts[k] == "experts" && k + 1 < parts.size()) marker = k;
  std::string inner;
  for (size_t k = i; k < parts.size(); ++k) {
    if (k == marker) {
      inner += "experts.";
      m.expert_at = inner.size();
      if (is_number(parts[k + 1])) {
        m.expert = std::stoll(parts[k + 1]);
        ++k;
      } else {
        m.expert_axis = true;
      }
      continue;
    }
    if (is_number(parts[k])) unknown(file, key, "a number where a module name belongs");
    inner += parts[k];
    if (k + 1 < parts.size()) inner += ".";
  }
  if (inner.empty() || inner.back() == '.') unknown(file, key, "no parameter name");
  if (m.head.empty() && (m.expert || m.expert_axis)) unknown(file, key, "experts outside decoder.layers");
  m.inner = m.head.empty() ? key : inner;
  return m;
}

Key classify_key(const std::string& fqn, bool is_bytes, const std::string& file) {
  Key k;
  k.fqn = fqn;
  if (is_bytes) {
    static const std::regex object(R"((.+)/shard_(\d+(\.\d+)*)_(\d+(\.\d+)*))");
    std::smatch m;
    if (!std::regex_match(fqn, m, object)) unknown(file, fqn, "a bytes item that is no ShardedObject");
    k.kind = KeyKind::Object;
    k.object = m[1].str();
    static const std::regex chained_object(R"(chained_(\d{1,9})\.(optimizer\..*))");
    std::smatch cm;
    if (std::regex_match(k.object, cm, chained_object)) k.chain = std::stoll(cm[1].str());
    if (!known_object(k.chain >= 0 ? cm[2].str() : k.object)) unknown(file, fqn, "a ShardedObject the model does not know");
    return k;
  }
  // A ChainedOptimizer (dense + expert optimizers) prefixes its dp_reshardable keys and objects
  // with chained_{i}. (its fully_reshardable keys not: chained_optim_avoid_prefix).
  std::string rest_fqn = fqn;
  static const std::regex chained(R"(chained_(\d{1,9})\.(optimizer\..*))");
  std::smatch cm;
  if (std::regex_match(fqn, cm, chained)) {
    k.chain = std::stoll(cm[1].str());
    rest_fqn = cm[2].str();
  }
  static const std::string state_prefix = "optimizer.state.";
  if (fqn.rfind(state_prefix, 0) == 0) {
    const std::string rest = fqn.substr(state_prefix.size());
    const size_t dot = rest.find('.');
    const std::string state = rest.substr(0, dot);
    if (dot == std::string::npos || (state != "param" && state != "exp_avg" && state != "exp_avg_sq"))
      unknown(file, fqn, "optimizer state other than param, exp_avg, exp_avg_sq");
    k.kind = KeyKind::OptimizerState;
    k.state = state;
    k.model = parse_model_key(rest.substr(dot + 1), file);
    return k;
  }
  if (rest_fqn.rfind("optimizer.", 0) == 0) {
    static const std::regex bucket(
        R"(optimizer\.distributed\.dp_group_idx_(\d{1,9})\.gbuf_idx_(\d{1,9})\.dtype_(.+)\.bucket_idx_(\d{1,9})\.(param|exp_avg|exp_avg_sq))");
    std::smatch m;
    if (!std::regex_match(rest_fqn, m, bucket)) unknown(file, fqn, "an optimizer tensor of no known format");
    k.kind = KeyKind::DpBucket;
    k.bucket = {std::stoll(m[1].str()), std::stoll(m[2].str()), m[3].str(), std::stoll(m[4].str()), m[5].str()};
    k.state = k.bucket.state;
    return k;
  }
  k.kind = KeyKind::Model;
  k.model = parse_model_key(fqn, file);
  return k;
}

std::vector<ParamSlice> param_slices(const ModelKey& key, const std::vector<int64_t>& size,
                                     const std::string& file) {
  const size_t lead = key.leading_axes();
  if (size.size() < lead)
    fail(file, "Megatron-Core torch_dist: " + escaped_brief(key.key) + " has " + std::to_string(size.size()) +
                   " dims, fewer than its layer/expert axes");
  const std::vector<int64_t> shape(size.begin() + static_cast<std::ptrdiff_t>(lead), size.end());
  const int64_t layers = key.layer_axis ? size[0] : 1;
  const int64_t experts = key.expert_axis ? size[key.layer_axis ? 1 : 0] : 1;
  std::vector<ParamSlice> out;
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t e = 0; e < experts; ++e) {
      ParamSlice s;
      s.shape = shape;
      if (key.layer_axis) s.index.push_back(l);
      if (key.expert_axis) s.index.push_back(e);
      if (key.head.empty()) {
        s.name = key.key;
      } else {
        const int64_t layer = key.layer_axis ? l : *key.layer;
        std::string inner = key.inner;
        if (key.expert_axis || key.expert) {
          inner.insert(key.expert_at, std::to_string(key.expert_axis ? e : *key.expert) + ".");
        }
        s.name = key.head + std::to_string(layer) + "." + inner;
      }
      out.push_back(std::move(s));
    }
  }
  return out;
}

namespace {
const std::regex& local_norm_re() {
  static const std::regex re(R"((decoder\.layers\.\d{1,9}\.)mlp\.linear_fc1\.layer_norm_(weight|bias))");
  return re;
}
const std::regex& te_norm_re() {
  static const std::regex re(R"((decoder\.layers\.\d{1,9}\.)pre_mlp_layernorm\.(weight|bias))");
  return re;
}
}  // namespace

std::string other_spec_norm_name(const std::string& name) {
  std::smatch m;
  if (std::regex_match(name, m, local_norm_re())) return m[1].str() + "pre_mlp_layernorm." + m[2].str();
  if (std::regex_match(name, m, te_norm_re())) return m[1].str() + "mlp.linear_fc1.layer_norm_" + m[2].str();
  return "";
}

bool is_te_spec_norm_name(const std::string& name) { return std::regex_match(name, te_norm_re()); }

}  // namespace ucpkit::formats::megatron_core
