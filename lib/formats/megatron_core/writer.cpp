#include "formats/megatron_core/writer.h"

#include <algorithm>
#include <map>
#include <set>
#include <regex>
#include <tuple>

#include "core/error.h"
#include "formats/megatron_core/key_model.h"
#include "io/shape.h"

namespace ucpkit::formats::megatron_core {

namespace {

const char* const kStates[] = {"param", "exp_avg", "exp_avg_sq"};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// One universal name taken apart.
struct Named {
  std::string key;  // the stored model key
  int64_t layer = -1, expert = -1;
  std::string inner;  // parameter inside its layer, expert number dropped
};

Named take_apart(const std::string& name, bool homogeneous, const std::string& file) {
  static const std::regex layer_re(R"(decoder\.layers\.(\d{1,9})\.(.+))");
  static const std::regex expert_re(R"((.*\.experts\.)(\d{1,9})\.(.+))");
  Named n;
  std::smatch m;
  if (!std::regex_match(name, m, layer_re)) {
    if (name.rfind("decoder.layers.", 0) == 0)
      fail(file, "Megatron-Core universal name " + escaped_brief(name) + ": no layer number after decoder.layers.");
    (void)parse_model_key(name, file);  // embedding / decoder / output_layer only
    n.key = n.inner = name;
    return n;
  }
  n.layer = std::stoll(m[1].str());
  n.inner = m[2].str();
  std::smatch em;
  if (std::regex_match(n.inner, em, expert_re)) {
    n.expert = std::stoll(em[2].str());
    n.inner = em[1].str() + em[3].str();
  }
  n.key = homogeneous ? "decoder.layers." + n.inner : "decoder.layers." + std::to_string(n.layer) + "." + n.inner;
  (void)parse_model_key(n.key, file);
  return n;
}

// The TP split of a parameter of the local GPT layer spec (module names of
// transformer/transformer_layer.py, attention.py, mlp.py; embedding and output layer vocab-parallel).
int tp_dim_of(const Named& n, bool expert) {
  if (expert) return ends_with(n.inner, "linear_fc1.weight") ? 0 : -1;  // only the SwiGLU halves (ETP 1)
  if (n.key == "embedding.word_embeddings.weight" || n.key == "output_layer.weight") return 0;
  for (const char* col : {"linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "linear_fc1.bias"})
    if (ends_with(n.inner, col)) return 0;
  for (const char* row : {"linear_proj.weight", "linear_fc2.weight"})
    if (ends_with(n.inner, row)) return 1;
  return -1;
}

struct Member {
  size_t param;
  int64_t layer, expert;
};

}  // namespace

bool homogeneous_layers(bool moe_layer_freq_list, int64_t moe_layer_freq, bool linear_attention_freq_list,
                        int64_t linear_attention_freq, bool heterogeneous) {
  return !(moe_layer_freq_list || moe_layer_freq > 1 || linear_attention_freq_list || linear_attention_freq > 1 ||
           heterogeneous);
}

namespace {

void check_mesh(const WriteLayout& layout) {
  const WriteMesh& mesh = layout.mesh;
  if (mesh.tp < 1 || mesh.pp < 1 || mesh.ep < 1 || mesh.dp < 1) throw UsageError("torch_dist: parallel sizes must be positive");
  if (layout.num_layers < 1 || layout.num_layers % mesh.pp != 0)
    throw UsageError("torch_dist: --pp " + std::to_string(mesh.pp) + " does not divide the " +
                     std::to_string(layout.num_layers) + " layers");
  if (mesh.ep > 1 && mesh.dp % mesh.ep != 0 && mesh.ep % mesh.dp != 0)
    throw UsageError("torch_dist: --ep " + std::to_string(mesh.ep) + " and --dp " + std::to_string(mesh.dp) + " do not nest");
}

// The universal names grouped into stored keys (out.keys, in first-seen order); members[k] and named[k]
// are key k's parameters and its first name taken apart.
void group_into_keys(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
                     const WriteLayout& layout, const std::string& file, TorchDistWritePlan& out,
                     std::vector<std::vector<Member>>& members, std::vector<Named>& named) {
  const WriteMesh& mesh = layout.mesh;
  std::map<std::string, size_t> key_index;
  for (size_t i = 0; i < names.size(); ++i) {
    Named n = take_apart(names[i], layout.homogeneous, file);
    auto [it, fresh] = key_index.emplace(n.key, out.keys.size());
    if (fresh) {
      StoredKey k;
      k.key = n.key;
      k.expert = n.expert >= 0;
      k.tp_dim = tp_dim_of(n, k.expert);
      k.swiglu = layout.swiglu && k.tp_dim == 0 && n.inner.find("linear_fc1.") != std::string::npos;
      k.tp = k.expert ? 1 : mesh.tp;  // expert tensor parallelism 1
      if (k.expert && !k.swiglu) k.tp_dim = -1;
      out.keys.push_back(std::move(k));
      members.emplace_back();
      named.push_back(n);
    }
    StoredKey& k = out.keys[it->second];
    if ((n.expert >= 0) != k.expert)
      fail(file, "Megatron-Core universal name " + escaped_brief(names[i]) + ": experts and non-experts share the key " + n.key);
    if (!members[it->second].empty() && shapes[members[it->second][0].param] != shapes[i])
      fail(file, "Megatron-Core universal name " + escaped_brief(names[i]) + ": shape " + shape_str(shapes[i]) +
                     " differs from " + escaped_brief(names[members[it->second][0].param]) + "'s " +
                     shape_str(shapes[members[it->second][0].param]) + " stored in the same key");
    members[it->second].push_back({i, n.layer, n.expert});
  }
}

// Key k's leading axes (layer, expert) and its members in row-major order, every position filled once.
void place_members(StoredKey& key, const std::vector<Member>& ms, const Named& n,
                   const std::vector<std::vector<int64_t>>& shapes, const std::vector<std::string>& names,
                   const WriteLayout& layout, const std::string& file) {
  const bool layer_axis = n.layer >= 0 && layout.homogeneous;
  int64_t experts = 1;
  if (key.expert)
    for (const auto& m : ms) experts = std::max(experts, m.expert + 1);
  const int64_t layers = layer_axis ? layout.num_layers : 1;
  key.leading = (layer_axis ? 1 : 0) + (key.expert ? 1 : 0);
  key.stage_layer = layer_axis ? -1 : n.layer;
  if (layer_axis) key.size.push_back(layers);
  if (key.expert) key.size.push_back(experts);
  const auto& shape = shapes[ms[0].param];
  key.size.insert(key.size.end(), shape.begin(), shape.end());
  key.members.assign(static_cast<size_t>(layers * experts), SIZE_MAX);
  for (const auto& m : ms) {
    if (m.layer >= layout.num_layers)
      fail(file, "Megatron-Core universal name " + escaped_brief(names[m.param]) + ": layer beyond the " +
                     std::to_string(layout.num_layers) + " layers of args.num_layers");
    const int64_t pos = (layer_axis ? m.layer : 0) * experts + (key.expert ? m.expert : 0);
    if (key.members[static_cast<size_t>(pos)] != SIZE_MAX)
      fail(file, "Megatron-Core universal name " + escaped_brief(names[m.param]) + " twice");
    key.members[static_cast<size_t>(pos)] = m.param;
  }
  for (size_t pos = 0; pos < key.members.size(); ++pos)
    if (key.members[pos] == SIZE_MAX)
      fail(file, "Megatron-Core universal folder: " + key.key + " has no parameter for " +
                     (layer_axis ? "layer " + std::to_string(static_cast<int64_t>(pos) / experts) : std::string("")) +
                     (key.expert ? " expert " + std::to_string(static_cast<int64_t>(pos) % experts) : std::string("")));
  if (key.tp_dim >= 0 && key.parts() > 1) {
    const int64_t parts = key.parts();
    if (key.tp_dim >= static_cast<int>(shape.size()) || shape[static_cast<size_t>(key.tp_dim)] % parts != 0)
      throw UsageError("torch_dist: --tp " + std::to_string(key.tp) + " does not divide " + key.key + " " +
                       shape_str(shape) + " into " + std::to_string(parts) + " parts along dim " +
                       std::to_string(key.tp_dim));
  }
}

// One chunk of a key and the rank that writes it.
struct Box {
  dcp::Chunk chunk;
  int64_t rank;
};

// A key's chunks: one per member and TP part, each written by the rank of its stage, EP and TP rank.
std::vector<Box> chunk_boxes(const StoredKey& key, const WriteMesh& mesh, int64_t per_stage) {
  std::vector<Box> boxes;
  const std::vector<int64_t> shape(key.size.begin() + static_cast<std::ptrdiff_t>(key.leading), key.size.end());
  const int64_t experts = key.expert ? key.size[key.leading - 1] : 1;
  for (size_t pos = 0; pos < key.members.size(); ++pos) {
    const int64_t layer = key.leading == 2 || (key.leading == 1 && !key.expert) ? static_cast<int64_t>(pos) / experts
                                                                                 : key.stage_layer;
    const int64_t expert = key.expert ? static_cast<int64_t>(pos) % experts : -1;
    int64_t stage = 0;
    if (layer >= 0) stage = layer / per_stage;
    else if (key.key != "embedding.word_embeddings.weight") stage = mesh.pp - 1;
    int64_t ep_rank = 0;
    if (expert >= 0 && experts % mesh.ep == 0) ep_rank = expert / (experts / mesh.ep);
    std::vector<int64_t> lead_off, lead_size;
    if (key.leading == 2 || (key.leading == 1 && !key.expert)) lead_off.push_back(layer), lead_size.push_back(1);
    if (key.expert) lead_off.push_back(expert), lead_size.push_back(1);
    const int64_t parts = key.parts();
    const bool split = parts > 1;
    for (int64_t j = 0; j < parts; ++j) {
      dcp::Chunk c;
      c.offsets = lead_off;
      c.sizes = lead_size;
      for (size_t d = 0; d < shape.size(); ++d) {
        int64_t off = 0, size = shape[d];
        if (split && static_cast<int>(d) == key.tp_dim) {
          size = shape[d] / parts;
          off = j * size;
        }
        c.offsets.push_back(off);
        c.sizes.push_back(size);
      }
      const int64_t t = split ? j % key.tp : 0;  // SwiGLU: pieces j and j + TP are TP rank j's W and V
      boxes.push_back({std::move(c), t + mesh.tp * (ep_rank % mesh.dp) + mesh.tp * mesh.dp * stage});
    }
  }
  return boxes;
}

// The plan's entries (model keys, then each optimizer state's, then the bytes items) and its files,
// one per writing rank.
void plan_entries(const std::vector<std::vector<Box>>& boxes, const std::vector<std::string>& bytes_fqns,
                  const WriteLayout& layout, TorchDistWritePlan& out) {
  std::map<int64_t, dcp::PlannedFile> files;
  auto add_entry = [&](std::string fqn, DType dtype, size_t k, EntrySource src) {
    dcp::Entry e;
    e.fqn = std::move(fqn);
    e.dtype = dtype;
    e.size = out.keys[k].size;
    const size_t index = out.plan.entries.size();
    for (size_t c = 0; c < boxes[k].size(); ++c) {
      e.chunks.push_back(boxes[k][c].chunk);
      auto& f = files[boxes[k][c].rank];
      f.items.push_back({index, c});
    }
    out.plan.entries.push_back(std::move(e));
    out.sources.push_back(std::move(src));
  };
  for (size_t k = 0; k < out.keys.size(); ++k) add_entry(out.keys[k].key, layout.model_dtype, k, {EntrySource::Model, k, ""});
  if (layout.optimizer)
    for (const char* s : kStates)
      for (size_t k = 0; k < out.keys.size(); ++k)
        add_entry(std::string("optimizer.state.") + s + "." + out.keys[k].key, DType::Float32, k, {EntrySource::State, k, s});
  for (const auto& fqn : bytes_fqns) {
    dcp::Entry e;
    e.fqn = fqn;
    e.is_bytes = true;
    files[0].items.push_back({out.plan.entries.size(), dcp::PlannedItem::kBytes});
    out.plan.entries.push_back(std::move(e));
    out.sources.push_back({EntrySource::Bytes, 0, ""});
  }
  const WriteMesh& mesh = layout.mesh;
  out.plan.mesh = {mesh.pp, mesh.dp, mesh.tp};
  for (auto& [rank, f] : files) {
    f.rank = rank;
    f.relative_path = dcp::data_file_name(rank);
    out.plan.files.push_back(std::move(f));
  }
}

// The write order: the bytes items, then parameter by parameter its model chunks and each optimizer state's
// (param, exp_avg, exp_avg_sq). A torch_dist import reads a parameter's source rows for its model copy and again for
// its fp32 master; written key after key (every model tensor, then every fp32 master), the rows were read twice from
// disk once the input outgrew the page cache (a 13.7-GB fp32 folder: 1.47x the floor, two processes 1.02x).
void order_by_parameter(TorchDistWritePlan& out) {
  static const std::vector<std::string> kStates = {"param", "exp_avg", "exp_avg_sq"};
  struct Item {
    size_t param;
    size_t state;  // 0 the model copy, then kStates' order
    dcp::PlannedItem at;
  };
  std::vector<Item> items;
  auto& order = out.plan.write_order;
  order.clear();
  for (size_t k = 0; k < out.plan.entries.size(); ++k) {
    if (out.plan.entries[k].is_bytes) {
      order.push_back({k, dcp::PlannedItem::kBytes});
      continue;
    }
    const EntrySource& s = out.sources.at(k);
    const size_t state = s.kind == EntrySource::Model
                             ? 0
                             : 1 + static_cast<size_t>(std::find(kStates.begin(), kStates.end(), s.state) - kStates.begin());
    for (size_t c = 0; c < out.plan.entries[k].chunks.size(); ++c) items.push_back({chunk_origin(out, k, c).param, state, {k, c}});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return std::tie(a.param, a.state) < std::tie(b.param, b.state); });
  for (const Item& i : items) order.push_back(i.at);
}

// The other layer spec's names of the MoE layers' pre-MLP norms (WriteLayout::both_norm_keys,
// other_spec_norm_name) in the layers with a router, unless named already; each with the parameter it repeats.
std::vector<std::pair<std::string, size_t>> other_spec_norm_names(const std::vector<std::string>& names) {
  const std::set<std::string> present(names.begin(), names.end());
  std::vector<std::pair<std::string, size_t>> out;
  for (size_t i = 0; i < names.size(); ++i) {
    std::string alias = other_spec_norm_name(names[i]);
    if (alias.empty() || present.count(alias)) continue;
    const std::string layer = names[i].substr(0, names[i].find('.', std::string("decoder.layers.").size()) + 1);
    if (present.count(layer + "mlp.router.weight")) out.emplace_back(std::move(alias), i);
  }
  return out;
}

}  // namespace

TorchDistWritePlan plan_torch_dist_write(const std::vector<std::string>& names,
                                         const std::vector<std::vector<int64_t>>& shapes,
                                         const std::vector<std::string>& bytes_fqns, const WriteLayout& layout,
                                         const std::string& file) {
  check_mesh(layout);
  TorchDistWritePlan out;
  std::vector<std::vector<Member>> members;
  std::vector<Named> named;
  // Alias names are planned as parameters of their own, then made to read the parameter they repeat.
  std::vector<std::string> all_names = names;
  std::vector<std::vector<int64_t>> all_shapes = shapes;
  std::vector<size_t> param_of(names.size());
  for (size_t i = 0; i < names.size(); ++i) param_of[i] = i;
  if (layout.both_norm_keys)
    for (auto& [alias, param] : other_spec_norm_names(names)) {
      all_names.push_back(std::move(alias));
      all_shapes.push_back(shapes[param]);
      param_of.push_back(param);
    }
  group_into_keys(all_names, all_shapes, layout, file, out, members, named);
  for (size_t k = 0; k < out.keys.size(); ++k) {
    place_members(out.keys[k], members[k], named[k], all_shapes, all_names, layout, file);
    for (size_t& m : out.keys[k].members) m = param_of[m];
  }
  const int64_t per_stage = layout.num_layers / layout.mesh.pp;
  std::vector<std::vector<Box>> boxes;
  for (const StoredKey& key : out.keys) boxes.push_back(chunk_boxes(key, layout.mesh, per_stage));
  plan_entries(boxes, bytes_fqns, layout, out);
  order_by_parameter(out);
  return out;
}

ChunkOrigin chunk_origin(const TorchDistWritePlan& p, size_t entry, size_t chunk) {
  const EntrySource& s = p.sources.at(entry);
  const StoredKey& key = p.keys.at(s.key);
  const dcp::Chunk& c = p.plan.entries.at(entry).chunks.at(chunk);
  int64_t pos = 0;
  const int64_t experts = key.expert ? key.size[key.leading - 1] : 1;
  if (key.leading == 2) pos = c.offsets[0] * experts + c.offsets[1];
  else if (key.leading == 1) pos = c.offsets[0];
  ChunkOrigin o;
  o.param = key.members.at(static_cast<size_t>(pos));
  o.box.offsets.assign(c.offsets.begin() + static_cast<std::ptrdiff_t>(key.leading), c.offsets.end());
  o.box.sizes.assign(c.sizes.begin() + static_cast<std::ptrdiff_t>(key.leading), c.sizes.end());
  return o;
}

}  // namespace ucpkit::formats::megatron_core
