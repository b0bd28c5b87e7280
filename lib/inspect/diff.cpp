// ucp-diff: two checkpoints compared tensor by tensor in universal form (diff.h).
#include "inspect/diff.h"

#include <stdlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <sstream>

#include "core/confine.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/staging.h"
#include "formats/megatron_core/key_model.h"
#include "inspect/verify_scope.h"
#include "io/shape.h"
#include "formats/dcp/reader.h"
#include "formats/deepspeed/param_groups.h"
#include "formats/detect.h"
#include "formats/universal/manifest.h"
#include "formats/universal/state_file.h"
#include "io/dtype.h"
#include "io/tensor.h"
#include "io/torch/torch_file.h"
#include "reshard/dcp_output.h"
#include "reshard/direct_source.h"
#include "reshard/model_info.h"
#include "reshard/universal_reader.h"
#include "to_universal/convert.h"
#include "to_universal/megatron_core_names.h"
#include "to_universal/value_json.h"

namespace fs = std::filesystem;

namespace ucpkit::inspect {

namespace {

// A folder of this process's own under the temporary directory (ucp-diff-<pid>-XXXXXX), removed with
// everything in it when it goes out of scope (any exception, or the Error check_interrupted() throws
// after SIGINT/SIGTERM) or when the stop watchdog ends the run; one a SIGKILLed run left is removed by
// the next run with the same temporary directory (its pid is gone).
class TempFolder {
 public:
  explicit TempFolder(const std::string& base, const StagingNote& note) {
    sweep_stale_pid_folders(base, "ucp-diff-", note);
    std::string pattern = (fs::path(base) / ("ucp-diff-" + std::to_string(::getpid()) + "-XXXXXX")).string();
    if (!::mkdtemp(pattern.data()))
      throw Error(base + ": cannot create a temporary folder (--tmp-dir): " + std::strerror(errno));
    owned_ = std::make_unique<OwnedFolder>(pattern);
  }
  const fs::path& path() const { return owned_->path(); }

 private:
  std::unique_ptr<OwnedFolder> owned_;
};

std::string temp_base(const DiffOptions& o) {
  if (!o.tmp_dir.empty()) return o.tmp_dir;
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

// One checkpoint in universal form. A folder ucp-union made from DeepSpeed files is read the way
// ucp-load reads it (its model files give the layout; the reader keeps a reference to `model`: a Side
// does not move). A folder without model files (ucp-union of a PyTorch DCP checkpoint: global tensors
// in their stored dtype, docs/formats-dcp.md) is read from manifest.json alone: each parameter's shape,
// dtype and state files, each state file's tensor converted to float32 for the comparison and its
// stored bytes checksummed against the manifest's crc32.
struct Side {
  std::string dir;
  formats::universal::UniversalManifest manifest;  // read once: the tensors' and the items' comparison use it
  reshard::ModelInfo model;
  std::map<std::string, std::string> dtype;  // manifest.json's dtype of each parameter ("" when absent)
  std::map<std::string, int> index;          // name -> model.params index
  std::unique_ptr<reshard::UniversalReader> reader;  // model files read (DeepSpeed-made folders)
  // Read from the manifest alone: per parameter, its states' files; the state tensor open now.
  bool from_manifest = false;
  bool verify = true;
  std::vector<std::map<std::string, formats::universal::UniversalState>> files;
  int open_param = -1;
  std::string open_state;
  Tensor open;

  bool has(int i, const std::string& state) const {
    if (from_manifest) return files[static_cast<size_t>(i)].count(state) > 0;
    return std::find(model.states.begin(), model.states.end(), state) != model.states.end();
  }
  // Bytes per stored element of the state last read by read_part (what its CRC-32 covers per element).
  uint64_t element_bytes() const { return from_manifest ? dtype_size(open.dtype()) : 4; }
  const Tensor& open_tensor(int i, const std::string& state) {
    if (open_param != i || open_state != state) {
      open = Tensor();
      const std::string path = (fs::path(dir) / files[static_cast<size_t>(i)].at(state).file).string();
      open = formats::universal::read_state_file(load_torch(path), path).param.contiguous();
      if (open.shape() != model.params[static_cast<size_t>(i)].shape)
        fail(path, "holds a tensor of shape " + shape_str(open.shape()) + ", manifest.json says " +
                       shape_str(model.params[static_cast<size_t>(i)].shape));
      open_param = i, open_state = state;
    }
    return open;
  }
  // Elements [at, at + n) of `state` of parameter i as float32 into dst; the CRC-32 of their stored
  // bytes when verifying (0 otherwise).
  uint32_t read_part(int i, const std::string& state, int64_t at, int64_t n, float* dst) {
    if (!from_manifest) return reader->read_part(i, state, at, n, dst);
    const Tensor& t = open_tensor(i, state);
    const size_t es = dtype_size(t.dtype());
    const auto b = t.contiguous_bytes().subspan(static_cast<size_t>(at) * es, static_cast<size_t>(n) * es);
    to_float(t.dtype(), b, dst, files[static_cast<size_t>(i)].at(state).file);
    return verify ? crc32_update(0, b) : 0;
  }
  void verify_whole(int i, const std::string& state, uint32_t crc) {
    if (!from_manifest) return reader->verify_whole(i, state, crc);
    const auto& f = files[static_cast<size_t>(i)].at(state);
    open = Tensor(), open_param = -1;  // one state tensor open at a time
    if (!verify || !f.crc32 || crc == *f.crc32) return;
    char msg[64];
    std::snprintf(msg, sizeof msg, "%08x, manifest says %08x", static_cast<unsigned>(crc), *f.crc32);
    fail((fs::path(dir) / f.file).string(), std::string("checksum mismatch: crc32 ") + msg);
  }

  static float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf, NaN
    if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
    const float v = std::ldexp(static_cast<float>(man), -24);  // subnormal or zero
    return sign ? -v : v;
  }
  static void to_float(DType t, std::span<const uint8_t> b, float* dst, const std::string& file) {
    const size_t n = b.size() / dtype_size(t);
    switch (t) {
      case DType::Float32:
        std::memcpy(dst, b.data(), b.size());
        return;
      case DType::BFloat16:
      case DType::Float16:
        for (size_t k = 0; k < n; ++k) {
          uint16_t h;
          std::memcpy(&h, b.data() + 2 * k, 2);
          dst[k] = t == DType::BFloat16 ? bf16_to_f32(h) : half_to_float(h);
        }
        return;
      case DType::Float64:
        for (size_t k = 0; k < n; ++k) {
          double d;
          std::memcpy(&d, b.data() + 8 * k, 8);
          dst[k] = static_cast<float>(d);
        }
        return;
      default:
        fail(file, "a " + std::string(dtype_name(t)) + " state tensor: ucp-diff compares floating-point states only");
    }
  }
};

std::unique_ptr<Side> open_side(const std::string& dir, bool verify) {
  auto s = std::make_unique<Side>();
  s->dir = dir;
  s->verify = verify;
  s->manifest = formats::universal::read_universal_manifest((fs::path(dir) / formats::universal::kUniversalManifestName).string());
  const auto& manifest = s->manifest;
  for (const auto& p : manifest.params) s->dtype[p.name] = p.dtype.value_or("");
  if (!manifest.model_files.empty()) {
    s->model = reshard::read_model_info(dir);
    for (size_t i = 0; i < s->model.params.size(); ++i) s->index[s->model.params[i].name] = static_cast<int>(i);
    s->reader = std::make_unique<reshard::UniversalReader>(s->model, dir, verify);
    return s;
  }
  s->from_manifest = true;
  for (const auto& p : manifest.params) {
    reshard::ParamInfo info;
    info.name = p.name;
    info.shape = p.shape;
    info.stored_numel = numel_of(p.shape);
    if (!s->index.emplace(p.name, static_cast<int>(s->model.params.size())).second)
      fail((fs::path(dir) / formats::universal::kUniversalManifestName).string(), "parameter '" + p.name + "' listed twice");
    s->model.params.push_back(std::move(info));
    s->files.push_back(p.states);
    for (const auto& [state, f] : p.states)
      if (std::find(s->model.states.begin(), s->model.states.end(), state) == s->model.states.end())
        s->model.states.push_back(state);
  }
  // "fp32" first, as the DeepSpeed-made side lists it.
  std::stable_partition(s->model.states.begin(), s->model.states.end(), [](const std::string& x) { return x == "fp32"; });
  return s;
}

// A checkpoint in transformers' own names (a DeepSpeed engine checkpoint of a transformers model, or the universal
// folder ucp-load makes of a Hugging Face folder for one): a Hugging Face folder compared with it is converted
// into those names (ConvertOptions::hf_engine_names), not Megatron-Core's.
bool in_transformers_names(const std::string& path) {
  if (reshard::is_transformers_named_checkpoint(path)) return true;
  if (!formats::detect(path).is(formats::kUniversal)) return false;
  const auto facts = formats::universal::read_universal_manifest((fs::path(path) / "manifest.json").string()).source.facts;
  return facts.contains("hf") && facts["hf"].is_object() && facts["hf"].value("names", "") == "transformers";
}

// The universal folder of an input: itself, or ucp-union's one-step conversion into `tmp`/`name`;
// `transformers_names`: a Hugging Face input in transformers' own names (in_transformers_names of the other side).
std::string universal_form(const std::string& input, const char* name, std::optional<TempFolder>& tmp,
                           const DiffOptions& o, DiffSide& side, bool transformers_names) {
  side.input = input;
  if (formats::detect(input).is(formats::kUniversal)) {  // an unknown folder is refused here, before any conversion
    side.form = "universal";
    return input;
  }
  side.form = "native";
  if (!tmp) tmp.emplace(temp_base(o), [&](const std::string& m) { o.reporter.detail(m); });
  to_universal::ConvertOptions co;
  co.threads = o.threads;
  co.sync = false;                  // scratch: removed at the end
  co.allow_unused_patterns = true;  // values are compared; a pattern matching nothing changes none
  co.tag_latest = false;            // a scratch folder: no pointer file beside it, no warning about one
  co.reporter = o.reporter;
  co.hf_engine_names = transformers_names;  // read by a Hugging Face input's union only
  const std::string out = (tmp->path() / name).string();
  // ucp-union's own checks would name its options (--output, --tolerance), which ucp-diff has not.
  refuse_output_over_input(tmp->path(), "--tmp-dir", input, std::string("checkpoint ") + (*name == 'a' ? "A" : "B"));
  o.reporter.detail("converting " + input + " to universal form in " + out);
  try {
    to_universal::run_union(input, out, co);
  } catch (const Error& e) {
    std::string what = e.what();
    if (const auto at = what.find("(use --tolerance to accept drifted replicas)"); at != std::string::npos)
      what.replace(at, std::string("(use --tolerance to accept drifted replicas)").size(),
                   "(ucp-union --tolerance converts such a checkpoint; compare its universal folder)");
    if (what == e.what()) throw;
    throw Error(what);
  }
  return out;
}

// A universal folder `u` in Megatron-DeepSpeed names compared with one in Megatron-Core names (`other`: a Hugging Face
// folder's import, a torch_dist save's union): renamed into Megatron-Core names in `tmp` (ucp-union --to-names
// megatron-core, the vocabulary without Megatron's padded rows, as the import holds it), so that the two compare
// parameter by parameter. `u` itself otherwise, or when no shipped map names its parameters (said on stderr).
std::string in_names_of(const std::string& u, const std::string& other, const char* name, std::optional<TempFolder>& tmp,
                        const DiffOptions& o) {
  auto source = [](const std::string& folder) {
    return formats::universal::read_universal_manifest((fs::path(folder) / "manifest.json").string()).source;
  };
  const auto su = source(u), so = source(other);
  const bool other_mcore = to_universal::is_megatron_core_named(so) || so.format_name() == "torch_dist";
  const bool u_deepspeed = su.format_name() == "deepspeed" && !su.names && !in_transformers_names(u);
  if (!other_mcore || !u_deepspeed) return u;
  if (!tmp) tmp.emplace(temp_base(o), [&](const std::string& m) { o.reporter.detail(m); });
  const std::string out = (tmp->path() / (std::string(name) + "-mcore")).string();
  to_universal::NamesOptions no;
  no.target = to_universal::NamesTarget::MegatronCore;
  no.threads = o.threads;
  no.overwrite = true;
  no.sync = false;
  no.pad_vocab = false;
  no.reporter = o.reporter;
  try {
    to_universal::rename_universal(u, out, no);
  } catch (const Error& e) {
    o.reporter.warning(u + ": compared in its Megatron-DeepSpeed names (" + e.what() + ")");
    return u;
  }
  o.reporter.detail(u + ": compared in Megatron-Core names (" + out + ")");
  return out;
}

std::string shape_text(const std::vector<int64_t>& s) { return nlohmann::json(s).dump(); }

// Two elements whose bits differ: the largest difference so far, and whether they differ beyond
// |u - v| <= atol + rtol * |v| (never when `exact`; NaN equals NaN).
void compare_element(TensorDifference& d, double u, double v, bool exact, double rtol, double atol) {
  const bool nan_u = std::isnan(u), nan_v = std::isnan(v);
  double diff = nan_u && nan_v ? 0.0 : std::fabs(u - v);
  if (std::isnan(diff)) diff = INFINITY;  // a NaN against a number, or infinities of two signs
  d.max_abs_diff = std::max(d.max_abs_diff, diff);
  if (exact || !((nan_u && nan_v) || diff <= atol + rtol * std::fabs(v))) ++d.differing;
}

// The one line for people of a "values" difference.
void describe_values(TensorDifference& d) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%lld of %lld elements differ, max abs diff %.9g", static_cast<long long>(d.differing),
                static_cast<long long>(d.elements), d.max_abs_diff);
  d.detail = buf;
}

// Elements of state `state` of parameter ia of `a` and ib of `b` (equal shapes) compared chunk by
// chunk; each side's stored elements are all read (its checksum verified at the end when verifying).
TensorDifference compare_values(Side& a, int ia, Side& b, int ib, const std::string& state, double rtol, double atol) {
  const auto& pa = a.model.params[ia];
  const auto& pb = b.model.params[ib];
  const int64_t n = numel_of(pa.shape), na = pa.stored_numel, nb = pb.stored_numel;
  const bool exact = rtol == 0 && atol == 0;
  constexpr int64_t kChunk = 1 << 20;
  std::vector<float> x(static_cast<size_t>(std::min(kChunk, std::max<int64_t>(na, 1)))),
      y(static_cast<size_t>(std::min(kChunk, std::max<int64_t>(nb, 1))));
  TensorDifference d{pa.name, state, "values", "", n, 0, 0};
  uint32_t ca = 0, cb = 0;
  for (int64_t at = 0; at < std::max(na, nb); at += kChunk) {
    check_interrupted();
    const int64_t ka = std::clamp<int64_t>(na - at, 0, kChunk), kb = std::clamp<int64_t>(nb - at, 0, kChunk);
    if (ka > 0) {
      const uint32_t c = a.read_part(ia, state, at, ka, x.data());
      ca = crc32_combine(ca, c, static_cast<uint64_t>(ka) * a.element_bytes());
    }
    if (kb > 0) {
      const uint32_t c = b.read_part(ib, state, at, kb, y.data());
      cb = crc32_combine(cb, c, static_cast<uint64_t>(kb) * b.element_bytes());
    }
    const int64_t k = std::min({n - at, ka, kb});
    for (int64_t i = 0; i < k; ++i) {
      if (std::memcmp(&x[i], &y[i], sizeof(float)) == 0) continue;
      compare_element(d, x[i], y[i], exact, rtol, atol);
    }
  }
  a.verify_whole(ia, state, ca);
  b.verify_whole(ib, state, cb);
  if (d.differing > 0) describe_values(d);
  return d;
}

void note(DiffResult& r, size_t listed, TensorDifference d, size_t tensors = 1) {
  r.differences += tensors;
  if (r.listed.size() < listed) r.listed.push_back(std::move(d));
}

// Every state of a parameter both hold, in `states` order.
// `name` in a against `name_b` in b (the same name, or the other Megatron layer spec's spelling of an MoE layer's
// pre-MLP norm, formats/megatron_core/key_model.h other_spec_norm_name: where a lacks one and b the other).
void compare_param(DiffResult& r, Side& a, Side& b, const std::string& name, const std::string& name_b,
                   const std::vector<std::string>& states, const DiffOptions& o) {
  const int ia = a.index.at(name), ib = b.index.at(name_b);
  const auto& pa = a.model.params[ia];
  const auto& pb = b.model.params[ib];
  const std::string& da = a.dtype[name];
  const std::string& db = b.dtype[name_b];
  for (const auto& state : states) {
    const bool in_a = a.has(ia, state), in_b = b.has(ib, state);
    if (!in_a && !in_b) continue;  // a state neither holds for this parameter (manifest-read sides)
    ++r.tensors;
    if (!in_a || !in_b) {
      note(r, o.listed, {name, state, in_a ? "only_in_a" : "only_in_b", "state " + state + " in one only"});
    } else if (pa.shape != pb.shape) {
      note(r, o.listed, {name, state, "shape", shape_text(pa.shape) + " vs " + shape_text(pb.shape)});
    } else if (!da.empty() && !db.empty() && da != db) {
      note(r, o.listed, {name, state, "dtype", da + " vs " + db});
    } else if (auto d = compare_values(a, ia, b, ib, state, o.rtol, o.atol); d.differing > 0) {
      note(r, o.listed, std::move(d));
    } else {
      ++r.tensors_equal;
    }
  }
}

void compare_sides(DiffResult& r, Side& a, Side& b, const DiffOptions& o) {
  std::vector<std::string> states = a.model.states;
  for (const auto& s : b.model.states)
    if (std::find(states.begin(), states.end(), s) == states.end()) states.push_back(s);
  std::set<std::string> paired_in_b;  // b's names compared under a's other spelling
  for (const auto& p : a.model.params) {
    std::string in_b = p.name;
    if (const std::string twin = formats::megatron_core::other_spec_norm_name(p.name); !b.index.count(p.name) && !twin.empty() && b.index.count(twin) && !a.index.count(twin))
      paired_in_b.insert(in_b = twin);
    if (!b.index.count(in_b)) {
      r.tensors += a.model.states.size();
      note(r, o.listed, {p.name, "", "only_in_a", "parameter in " + r.a.input + " only"}, a.model.states.size());
      continue;
    }
    compare_param(r, a, b, p.name, in_b, states, o);
  }
  if (!paired_in_b.empty())
    r.skipped.push_back("the names of " + std::to_string(paired_in_b.size()) +
                        " MoE pre-MLP norms (Megatron's local and Transformer Engine layer specs' keys: their values compared as one parameter)");
  for (const auto& p : b.model.params)
    if (!a.index.count(p.name) && !paired_in_b.count(p.name)) {
      r.tensors += b.model.states.size();
      note(r, o.listed, {p.name, "", "only_in_b", "parameter in " + r.b.input + " only"}, b.model.states.size());
    }
}

// A step file's value (a number, or a one-element tensor as DeepSpeed saves it), as text; nullopt when
// it holds something else (listed as a difference, "?").
std::optional<std::string> step_text(const std::string& path) {
  const auto v = load_torch(path);
  if (v && (v->is(pickle::Kind::Float) || v->is(pickle::Kind::Int))) return nlohmann::json(v->as_float()).dump();
  if (!v || !v->is(pickle::Kind::Tensor) || !v->tensor || v->tensor->numel() != 1) return std::nullopt;
  const Tensor& t = *v->tensor;
  switch (t.dtype()) {
    case DType::Int64: return nlohmann::json(static_cast<double>(t.to_vector<int64_t>()[0])).dump();
    case DType::Float64: return nlohmann::json(t.to_vector<double>()[0]).dump();
    case DType::Float32: return nlohmann::json(static_cast<double>(t.to_vector<float>()[0])).dump();
    case DType::BFloat16:
    case DType::Float16: return nlohmann::json(static_cast<double>(t.to(DType::Float32).to_vector<float>()[0])).dump();
    default: {  // another dtype: its stored bytes stand for the value
      std::string text = std::string(dtype_name(t.dtype())) + ":";
      for (const uint8_t b : t.contiguous().contiguous_bytes()) text += "0123456789abcdef"[b >> 4], text += "0123456789abcdef"[b & 15];
      return text;
    }
  }
}

// The optimizer's param_groups of a universal folder (its optimizer_state file), each without what
// depends on the layout (formats/deepspeed layout_free_group), as JSON; an empty array when it has none.
nlohmann::json param_groups_of(const std::string& dir, const formats::universal::UniversalManifest& m) {
  const std::string path = (fs::path(dir) / m.optimizer_state).string();
  nlohmann::json out = nlohmann::json::array();
  if (!fs::exists(path)) return out;
  const auto groups = entry_of(load_torch(path), "param_groups");
  if (!groups || !groups->is_sequence()) return out;
  for (const auto& g : groups->items) {
    out.push_back(formats::deepspeed::layout_free_group(to_universal::value_to_json(g)));
  }
  return out;
}

// What the universal form holds besides tensors (not compared before): each parameter's
// optimizer step (zero/<param>/step.pt) and the optimizer's param_groups (learning rate, betas,
// weight decay, their step), as non-tensor items.
void compare_optimizer_items(DiffResult& r, const Side& a, const Side& b, const DiffOptions& o, bool param_groups = true) {
  const std::string &da = a.dir, &db = b.dir;
  const auto &ma = a.manifest, &mb = b.manifest;
  std::map<std::string, const formats::universal::UniversalParam*> in_b;
  for (const auto& p : mb.params) in_b[p.name] = &p;
  const auto step_file = [](const std::string& d, const formats::universal::UniversalParam& p) {
    return (fs::path(d) / p.states.begin()->second.file).parent_path() / "step.pt";
  };
  for (const auto& pa : ma.params) {
    const auto it = in_b.find(pa.name);
    if (it == in_b.end() || pa.states.empty() || it->second->states.empty()) continue;  // listed by the tensors
    const auto& pb = *it->second;
    if (!pa.step && !pb.step) continue;
    ++r.tensors, ++r.items;
    if (pa.step != pb.step) {
      note(r, o.listed, {pa.name, "step", pa.step ? "only_in_a" : "only_in_b", "optimizer step in one only"});
      continue;
    }
    const auto sa = step_text(step_file(da, pa).string()), sb = step_text(step_file(db, pb).string());
    if (sa && sb && *sa == *sb) {
      ++r.tensors_equal;
    } else {
      note(r, o.listed, {pa.name, "step", "item", sa.value_or("?") + " vs " + sb.value_or("?")});
    }
  }
  if (!param_groups) return;
  const auto ga = param_groups_of(da, ma), gb = param_groups_of(db, mb);
  if (ga.empty() && gb.empty()) return;
  ++r.tensors, ++r.items;
  std::string first;
  if (ga.size() != gb.size()) first = std::to_string(ga.size()) + " vs " + std::to_string(gb.size()) + " groups";
  for (size_t g = 0; first.empty() && g < ga.size(); ++g)
    for (const auto& [k, v] : ga[g].items())
      if (first.empty() && (!gb[g].contains(k) || gb[g][k] != v))
        first = "group " + std::to_string(g) + " " + k + ": " + v.dump() + " vs " +
                (gb[g].contains(k) ? gb[g][k].dump() : std::string("absent"));
  for (size_t g = 0; first.empty() && g < gb.size(); ++g)
    for (const auto& [k, v] : gb[g].items())
      if (first.empty() && !ga[g].contains(k)) first = "group " + std::to_string(g) + " " + k + ": absent vs " + v.dump();
  if (first.empty())
    ++r.tensors_equal;
  else
    note(r, o.listed, {"param_groups", "", "item", first});
}

// Two DCP folders entry by entry, as saved (through the universal form the buffers were
// refused and the non-tensor items not looked at). Tensors: key, dtype, shape, then the values bit
// for bit, or (floating dtypes, a tolerance given) within it; non-tensor items: the stored bytes, or
// else the objects they unpickle to.
// Two tensors of one dtype and shape, element by element: bit for bit, floats within the tolerance
// when one is given, integers and bools exactly (a DCP's entries, a universal folder's buffers).
TensorDifference compare_tensors(const std::string& name, const std::string& state, const Tensor& a, const Tensor& b,
                                 const DiffOptions& o) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  const auto bx = x.contiguous_bytes(), by = y.contiguous_bytes();
  TensorDifference d{name, state, "values", "", x.numel(), 0, 0};
  if (bx.size() == by.size() && (bx.empty() || std::memcmp(bx.data(), by.data(), bx.size()) == 0)) return d;
  if (dtype_is_floating(x.dtype())) {
    const Tensor u = x.to(DType::Float64), v = y.to(DType::Float64);
    const double* pu = reinterpret_cast<const double*>(u.contiguous_bytes().data());
    const double* pv = reinterpret_cast<const double*>(v.contiguous_bytes().data());
    const bool exact = o.rtol == 0 && o.atol == 0;
    for (int64_t i = 0; i < d.elements; ++i)
      if (std::memcmp(&pu[i], &pv[i], sizeof(double)) != 0) compare_element(d, pu[i], pv[i], exact, o.rtol, o.atol);
  } else {
    const size_t es = dtype_size(x.dtype());
    for (int64_t i = 0; i < d.elements; ++i)
      if (std::memcmp(bx.data() + i * es, by.data() + i * es, es) != 0) ++d.differing;
  }
  if (d.differing > 0) describe_values(d);
  return d;
}

// The universal folders' buffers (manifest "buffers") by name: dtype, shape, then every
// element as compare_tensors does; one in one folder only is a difference.
void compare_buffers(DiffResult& r, const Side& a, const Side& b, const DiffOptions& o) {
  std::map<std::string, const formats::universal::UniversalBuffer*> in_b;
  for (const auto& x : b.manifest.buffers) in_b[x.name] = &x;
  for (const auto& x : a.manifest.buffers) {
    check_interrupted();
    ++r.tensors;
    const auto it = in_b.find(x.name);
    if (it == in_b.end()) {
      note(r, o.listed, {x.name, "buffer", "only_in_a", "buffer in " + r.a.input + " only"});
      continue;
    }
    const auto& y = *it->second;
    in_b.erase(it);
    if (x.dtype != y.dtype) {
      note(r, o.listed, {x.name, "buffer", "dtype", x.dtype + " vs " + y.dtype});
    } else if (x.shape != y.shape) {
      note(r, o.listed, {x.name, "buffer", "shape", shape_text(x.shape) + " vs " + shape_text(y.shape)});
    } else if (auto d = compare_tensors(x.name, "buffer", reshard::read_buffer(a.dir, x, a.verify),
                                        reshard::read_buffer(b.dir, y, b.verify), o);
               d.differing > 0) {
      note(r, o.listed, std::move(d));
    } else {
      ++r.tensors_equal;
    }
  }
  for (const auto& [name, y] : in_b) {
    ++r.tensors;
    note(r, o.listed, {name, "buffer", "only_in_b", "buffer in " + r.b.input + " only"});
  }
}

void compare_dcp(DiffResult& r, const std::string& a, const std::string& b, const DiffOptions& o) {
  r.a = {a, "dcp"};
  r.b = {b, "dcp"};
  const formats::dcp::Reader ra(a), rb(b);
  auto count = [&r](const formats::dcp::Entry& e) {
    ++r.tensors;
    if (e.is_bytes) ++r.items;
  };
  for (const auto& e : ra.metadata().entries) {
    check_interrupted();
    count(e);
    const auto* f = rb.metadata().find(e.fqn);
    if (!f) {
      note(r, o.listed, {e.fqn, "", "only_in_a", (e.is_bytes ? "item in " : "tensor in ") + a + " only"});
      continue;
    }
    if (e.is_bytes != f->is_bytes) {
      note(r, o.listed, {e.fqn, "", "kind", e.is_bytes ? "non-tensor item vs tensor" : "tensor vs non-tensor item"});
      continue;
    }
    if (e.is_bytes) {
      if (ra.read_bytes(e.fqn) == rb.read_bytes(e.fqn) || ra.read_object(e.fqn)->repr(64) == rb.read_object(e.fqn)->repr(64))
        ++r.tensors_equal;
      else
        note(r, o.listed, {e.fqn, "", "values", "non-tensor item differs: " + ra.read_object(e.fqn)->repr(2) + " vs " +
                                                   rb.read_object(e.fqn)->repr(2)});
      continue;
    }
    if (e.dtype != f->dtype) {
      note(r, o.listed, {e.fqn, "", "dtype", std::string(dtype_name(e.dtype)) + " vs " + std::string(dtype_name(f->dtype))});
      continue;
    }
    if (e.size != f->size) {
      note(r, o.listed, {e.fqn, "", "shape", shape_text(e.size) + " vs " + shape_text(f->size)});
      continue;
    }
    if (auto d = compare_tensors(e.fqn, "", ra.read_tensor(e.fqn), rb.read_tensor(e.fqn), o); d.differing > 0)
      note(r, o.listed, std::move(d));
    else
      ++r.tensors_equal;
  }
  for (const auto& f : rb.metadata().entries)
    if (!ra.metadata().find(f.fqn)) {
      count(f);
      note(r, o.listed, {f.fqn, "", "only_in_b", (f.is_bytes ? "item in " : "tensor in ") + b + " only"});
    }
}

// Pairs of folders compared as saved, without the universal form, by folder kind name (the
// comparison asks this table, it names no format): both sides of one kind with a comparer registered.
using NativeCompare = void (*)(DiffResult&, const std::string&, const std::string&, const DiffOptions&);
NamedTable<NativeCompare>& native_comparers() {
  static NamedTable<NativeCompare> t;
  return t;
}
[[maybe_unused]] const bool kDiffRegistered = native_comparers().set(std::string(formats::kDcp), compare_dcp);

// A DCP source's bytes entries (manifest "items") by key: their bytes as stored (a torch.save
// stream each: equal bytes, equal value); one in one folder only is a difference.
void compare_items(DiffResult& r, const Side& a, const Side& b, const DiffOptions& o) {
  std::map<std::string, const formats::universal::UniversalItem*> in_b;
  for (const auto& x : b.manifest.items) in_b[x.key] = &x;
  for (const auto& x : a.manifest.items) {
    check_interrupted();
    ++r.tensors, ++r.items;
    const auto it = in_b.find(x.key);
    if (it == in_b.end()) {
      note(r, o.listed, {x.key, "item", "only_in_a", "non-tensor item in " + r.a.input + " only"});
      continue;
    }
    const auto& y = *it->second;
    in_b.erase(it);
    if (reshard::read_item(a.dir, x, a.verify) == reshard::read_item(b.dir, y, b.verify))
      ++r.tensors_equal;
    else
      note(r, o.listed, {x.key, "item", "item", "bytes differ"});
  }
  for (const auto& [key, y] : in_b) {
    ++r.tensors, ++r.items;
    note(r, o.listed, {key, "item", "only_in_b", "non-tensor item in " + r.b.input + " only"});
  }
}

}  // namespace

DiffResult diff_checkpoints(const std::string& a, const std::string& b, const DiffOptions& o) {
  if (!(o.rtol >= 0) || !(o.atol >= 0)) throw UsageError("--rtol and --atol must be numbers >= 0");
  DiffResult r;
  r.rtol = o.rtol;
  r.atol = o.atol;
  VerifyFiles verify(o.verify);
  const std::string kind = formats::detect(a).name();
  if (const NativeCompare compare = native_comparers().find(kind); compare && formats::detect(b).name() == kind) {
    // Nothing is converted, but what a SIGKILLed run left is still swept, as every run does.
    sweep_stale_pid_folders(temp_base(o), "ucp-diff-", [&](const std::string& m) { o.reporter.detail(m); });
    StagedPhase staged;  // SIGINT/SIGTERM end the comparison at its next entry
    compare(r, a, b, o);
    return r;
  }
  // The model files' client state (Megatron's args, iteration, LR scheduler) and a DCP's other items
  // are not in the universal form's comparison.
  r.skipped = {"model files' client state", "other non-tensor items"};
  // From here SIGINT/SIGTERM only set a flag: the conversion and the comparison stop at their next
  // check_interrupted(), the temporary folder is removed on the way out, and the tool dies by the signal.
  StagedPhase staged;
  std::optional<TempFolder> tmp;
  const std::string ua = universal_form(a, "a", tmp, o, r.a, in_transformers_names(b));
  check_interrupted();
  const std::string ub = universal_form(b, "b", tmp, o, r.b, in_transformers_names(a));
  check_interrupted();
  // Megatron-DeepSpeed names against Megatron-Core ones: the former renamed (either side).
  const std::string na = in_names_of(ua, ub, "a", tmp, o), nb = in_names_of(ub, ua, "b", tmp, o);
  check_interrupted();
  auto sa = open_side(na, o.verify);
  auto sb = open_side(nb, o.verify);
  compare_sides(r, *sa, *sb, o);
  compare_buffers(r, *sa, *sb, o);
  // Two frameworks' optimizer settings (DeepSpeed's groups and keys against Megatron-Core's) are not one another's.
  const bool renamed = na != ua || nb != ub;
  if (renamed) r.skipped.push_back("the optimizer's param_groups (Megatron-DeepSpeed's against Megatron-Core's)");
  compare_optimizer_items(r, *sa, *sb, o, !renamed);
  compare_items(r, *sa, *sb, o);
  return r;
}

nlohmann::json DiffResult::to_json() const {
  using nlohmann::json;
  json listed_json = json::array();
  for (const auto& d : listed) {
    json j = {{"param", d.param}, {"state", d.state.empty() ? json(nullptr) : json(d.state)}, {"kind", d.kind},
              {"detail", d.detail}};
    if (d.kind == "values") {
      j["elements"] = d.elements;
      j["differing"] = d.differing;
      j["max_abs_diff"] = std::isfinite(d.max_abs_diff) ? json(d.max_abs_diff) : json(nullptr);
    }
    listed_json.push_back(j);
  }
  return {{"equal", equal()},
          {"a", {{"input", a.input}, {"form", a.form}}},
          {"b", {{"input", b.input}, {"form", b.form}}},
          {"comparison", rtol == 0 && atol == 0 ? "exact" : "tolerance"},
          {"rtol", rtol},
          {"atol", atol},
          {"tensors", tensors},
          {"tensors_equal", tensors_equal},
          {"differences", differences},
          {"non_tensor_items", items},
          {"skipped", skipped},
          {"listed", listed_json}};
}

std::string DiffResult::text() const {
  std::ostringstream o;
  std::string how = rtol == 0 && atol == 0 ? "bit for bit" : "within the tolerance";
  const std::string what = items ? " entries (" + std::to_string(tensors - items) + " tensors, " + std::to_string(items) +
                                       " non-tensor items)"
                                 : " tensors";
  if (!skipped.empty()) {
    how += "; not compared:";
    for (size_t k = 0; k < skipped.size(); ++k) how += (k ? ", " : " ") + skipped[k];
  }
  if (equal()) {
    o << "equal: all " << tensors << what << " (" << how << ")\n";
    return o.str();
  }
  o << "differ: " << tensors_equal << " of " << tensors << what << " equal (" << how << ")\n";
  for (const auto& d : listed)
    o << "  " << d.param << (d.state.empty() ? "" : " " + d.state) << ": " << d.kind << ": " << d.detail << "\n";
  if (differences > listed.size()) o << "  ... " << differences - listed.size() << " more tensors differ\n";
  return o.str();
}

}  // namespace ucpkit::inspect
