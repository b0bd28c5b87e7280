// Direct mode: a native checkpoint read as a virtual universal checkpoint (see direct_source.h).
#include "reshard/direct_source.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <tbb/parallel_for.h>

#include "core/crc32.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/registry.h"
#include "core/staging.h"
#include "io/shape.h"
#include "io/torch/torch_file.h"
#include "formats/looked_for.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/storage_tags.h"
#include "formats/universal/join.h"
#include "formats/universal/manifest.h"
#include "reshard/ucp_info.h"
#include "parallel/threads.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

using patterns::JoinKind;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

NamedTable<DirectReader>& direct_readers() {
  static NamedTable<DirectReader> t;
  return t;
}

// DeepSpeed shards: global_stepN (through `latest`), planned as ucp-union plans them.
const bool kDeepSpeedDirect = register_direct_reader(
    formats::kDeepSpeed,
    {[](const std::string& input) {
       const std::string dir = formats::deepspeed::resolve_checkpoint_dir(input);
       if (formats::deepspeed::holds_shards(dir)) return dir;
       throw Error(formats::not_a_checkpoint(input, dir != input ? dir : std::string()));
     },
     [](const std::string& input, const TorchLoadOptions& open) { return to_universal::plan_native_checkpoint(input, open); }});

// A ucp-extract work folder: its plan.json.
const bool kWorkFolderDirect =
    register_direct_reader(formats::kWorkFolder, {[](const std::string& input) { return input; },
                                                  [](const std::string& input, const TorchLoadOptions&) {
                                                    return to_universal::plan_of_work_folder(input);
                                                  }});

}  // namespace

bool register_direct_reader(std::string_view kind, DirectReader reader) {
  return direct_readers().set(std::string(kind), std::move(reader));
}

DirectReader direct_reader(const formats::FolderKind& kind) { return direct_readers().find(kind.format); }

bool is_direct_input(const formats::FolderKind& kind) { return static_cast<bool>(direct_reader(kind)); }

bool is_transformers_named_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(path) / "config.json", ec) && is_direct_input(formats::detect(path));
}

std::string native_checkpoint_dir(const std::string& input, const formats::FolderKind& kind) {
  const DirectReader reader = direct_reader(kind);
  if (!reader) throw Error(input + ": a " + kind.name() + " folder, not a DeepSpeed checkpoint or ucp-extract work folder");
  return reader.data_dir(input);
}

to_universal::ExtractPlan direct_plan(const std::string& input, const formats::FolderKind& kind,
                                      const TorchLoadOptions& open) {
  (void)native_checkpoint_dir(input, kind);
  to_universal::ExtractPlan plan = direct_reader(kind).plan(input, open);
  // As ucp-union refuses them without --allow-unused-patterns (the two paths must agree).
  if (!plan.unused_patterns.empty())
    throw Error("unused pattern '" + plan.unused_patterns[0] + "' (" + plan.patterns_origin +
                ") matches no parameter (convert with ucp-union --allow-unused-patterns, then ucp-load)");
  return plan;
}

namespace {

using formats::universal::split_dim;  // the join table's split dimension


// The shape ucp-union gives the joined tensor (vocabulary rows cut to original_vocab_size).
std::vector<int64_t> universal_shape(const to_universal::ParamPlan& p, const patterns::ParamRule& rule,
                                     const patterns::PatternSet& set) {
  if (p.tp_shapes.empty()) throw Error("parameter " + p.name + " has no fragments");
  std::vector<int64_t> shape = p.tp_shapes[0];
  const int d = split_dim(rule, set);
  if (p.tp_shapes.size() > 1 && d >= 0 && d < static_cast<int>(shape.size()))
    for (size_t t = 1; t < p.tp_shapes.size(); ++t) {
      if (p.tp_shapes[t].size() != shape.size())
        throw Error("parameter " + p.name + ": shape mismatch between fragments");
      shape[d] += p.tp_shapes[t][d];
    }
  if (rule.vocab) {
    if (!set.original_vocab_size)
      throw Error("parameter " + p.name + " matches a vocabulary pattern but the patterns give no original_vocab_size");
    if (shape.empty() || *set.original_vocab_size > shape[0])
      throw Error("parameter " + p.name + ": original_vocab_size " + std::to_string(*set.original_vocab_size) +
                  " exceeds its rows");
    shape[0] = *set.original_vocab_size;
  }
  return shape;
}

}  // namespace

UniversalMeta direct_meta(const to_universal::ExtractPlan& plan, const TorchLoadOptions& open) {
  UniversalMeta meta;
  meta.manifest_path = "the extract plan of " + (plan.files.empty() ? std::string("the source") : plan.files[0]);
  const auto set = plan.pattern_set();
  const bool flat = plan.source.flat();
  formats::universal::UniversalManifest& m = meta.manifest;
  m.source = plan.source;
  m.patterns_origin = plan.patterns_origin;
  m.patterns_set = plan.patterns_json;
  for (const auto& p : plan.params) {
    const auto rule = patterns::classify(set, p.name);
    formats::universal::UniversalParam e;
    e.name = p.name;
    for (const auto& s : p.states) e.states[s].file = "zero/" + to_universal::param_folder(p.name) + "/" + s + ".pt";
    // AutoEP expert weights are never in the flat form: ucp-union joins their EP ranks' fragments
    // into [E, ...] (convert.cpp, `flat && autoep_experts == 0`).
    const bool flat_param = flat && p.autoep_experts == 0;
    e.shape = flat_param ? p.tp_shapes.at(0) : universal_shape(p, rule, set);
    to_universal::describe_manifest_entry(e, p, rule, flat_param);
    m.params.push_back(std::move(e));
  }
  meta.model_files = plan.model_files;
  meta.optimizer_state_path = plan.optimizer_state_file;
  meta.open = open;
  auto root = load_torch(plan.optimizer_state_file, open);
  meta.optimizer_state =
      plan.optimizer_state_prepared ? root : to_universal::universal_optimizer_state(root, plan.optimizer_state_file);
  return meta;
}

DirectSource::DirectSource(const to_universal::ExtractPlan& plan, const ModelInfo& model, bool check_image,
                           const TorchLoadOptions& open)
    : plan_(plan), model_(model), cache_(std::make_unique<to_universal::FragmentReader>(plan.files, open)) {
  image_ = std::make_unique<to_universal::MasterImage>(plan, check_image, open);
  for (size_t si = 0; si < model.states.size(); ++si)
    if (model.states[si] == "fp32") fp32_state_ = static_cast<int>(si);
  for (size_t f = 0; f < plan.files.size(); ++f) pieces_.push_back(std::make_unique<FilePieces>());
  std::map<std::string, const to_universal::ParamPlan*> by_name;
  for (const auto& p : plan.params) by_name[p.name] = &p;
  const bool flat = plan.source.flat();
  params_.resize(model.params.size());
  const size_t S = model.states.size();
  joined_.resize(model.params.size() * S);
  for (size_t i = 0; i < joined_.size(); ++i) joined_once_.push_back(std::make_unique<std::once_flag>());
  image_once_.resize(params_.size());
  for (size_t i = 0; i < model.params.size(); ++i) {
    const auto& mp = model.params[i];
    auto it = by_name.find(mp.name);
    if (it == by_name.end()) throw Error("internal error: parameter " + mp.name + " not in the extract plan");
    const to_universal::ParamPlan& pp = *it->second;
    Param& q = params_[i];
    q.plan = &pp;
    const int tp = static_cast<int>(pp.tp_shapes.size());
    image_once_[i] = std::make_unique<std::once_flag[]>(static_cast<size_t>(tp));
    q.prefix.resize(tp);
    q.files.resize(tp);
    for (int t = 0; t < tp; ++t) {
      int64_t at = 0;
      for (const auto& f : pp.fragments[t]) {
        q.prefix[t].push_back(at);
        q.files[t].push_back(f.file);
        at += f.numel;
      }
      q.prefix[t].push_back(at);
      if (at != numel_of(pp.tp_shapes[t]))
        throw Error("parameter " + mp.name + ": TP rank " + std::to_string(t) + "'s fragments hold " + std::to_string(at) +
                    " elements, its shape " + nlohmann::json(pp.tp_shapes[t]).dump() + " " +
                    std::to_string(numel_of(pp.tp_shapes[t])));
    }
    if ((flat && pp.autoep_experts == 0) || tp == 1) {  // AutoEP (TP = 1 only): EP ranks' fragments in part order
      q.kind = Param::Identity;
      if (q.prefix[0].back() < mp.stored_numel)
        throw Error("parameter " + mp.name + ": fragments hold fewer elements than its shape");
    } else if (mp.shape.empty() || mp.rule.kind == JoinKind::Replicate || mp.rule.kind == JoinKind::Average) {
      q.kind = Param::Joined;
    } else {
      q.kind = Param::Mapped;
      int64_t padded = -1;
      if (mp.rule.vocab) {
        if (split_dim(mp.rule, model.patterns) != 0)
          throw Error("vocabulary parameter " + mp.name + " is not split along dim 0");
        padded = 0;
        for (const auto& s : pp.tp_shapes) padded += s.at(0);
      }
      q.slice_rows.resize(tp);
      for (int t = 0; t < tp; ++t) {
        const TpSlice s = tp_slice(mp.name, mp.shape, mp.rule, model.patterns, tp, t, padded);
        if (s.shape != pp.tp_shapes[t])
          throw Error("parameter " + mp.name + ": source TP rank " + std::to_string(t) + " holds shape " +
                      nlohmann::json(pp.tp_shapes[t]).dump() + " but its join rule (" + patterns::describe(mp.rule) +
                      ") gives " + nlohmann::json(s.shape).dump());
        q.dim = s.dim;
        q.slice_rows[t] = s.shape[s.dim];
        int64_t off = 0;
        for (const auto& [start, len] : s.pieces) {
          q.pieces.push_back({start, len, t, off});
          off += len;
        }
      }
      std::sort(q.pieces.begin(), q.pieces.end(), [](const Piece& a, const Piece& b) { return a.start < b.start; });
      q.rows = padded >= 0 ? padded : mp.shape[q.dim];
      for (size_t d = q.dim + 1; d < mp.shape.size(); ++d) q.inner *= mp.shape[d];
    }
  }
  // The fragments' views (loads every source shard's pickle once, all threads).
  tbb::parallel_for(size_t{0}, params_.size(), [&](size_t i) {
    Param& q = params_[i];
    if (q.kind == Param::Joined) return;
    q.frags.resize(S);
    for (size_t si = 0; si < S; ++si) {
      q.frags[si].resize(q.plan->fragments.size());
      for (size_t t = 0; t < q.plan->fragments.size(); ++t)
        for (const auto& f : q.plan->fragments[t]) {
          Tensor x = cache_->fragment(f, model_.states[si]);
          if (x.dtype() != DType::Float32)
            fail(cache_->path(f.file), "parameter " + q.plan->name + " " + model_.states[si] + ": fragment is " +
                                           std::string(dtype_name(x.dtype())) + ", not float32");
          q.frags[si][t].push_back(std::move(x));
        }
    }
  });
}

DirectSource::~DirectSource() = default;

void DirectSource::copy_slice(const Param& p, int state, int t, int64_t pos, int64_t n, float* dst) {
  // The module weights must be the rounded fp32 master: a model file or an optimizer shard of another
  // run saved at the same step is refused here, as ucp-union refuses it (master_image.h). Once per TP
  // slice, on its first read: the writers read an fp32 run several times (the model file's weights,
  // the optimizer shards), and checking every read made the check cost 4x the conversion.
  if (state == fp32_state_ && !image_->empty()) {
    const size_t i = static_cast<size_t>(&p - params_.data());
    std::call_once(image_once_[i][static_cast<size_t>(t)], [&] { check_image(p, t); });
  }
  copy_run(p, state, t, pos, n, dst);
}

void DirectSource::check_image(const Param& p, int t) {
  constexpr int64_t kChunk = int64_t{1} << 18;  // elements read at a time (1 MiB)
  const int64_t total = p.prefix[t].back();
  const std::unique_ptr<float[]> buf(new float[static_cast<size_t>(std::min(total, kChunk))]);  // not zeroed
  for (int64_t pos = 0; pos < total; pos += kChunk) {
    const int64_t n = std::min(kChunk, total - pos);
    copy_run(p, fp32_state_, t, pos, n, buf.get(), /*keep_crcs=*/false);
    image_->check_run(*p.plan, static_cast<size_t>(t), pos, buf.get(), n, plan_.files);
  }
}

void DirectSource::copy_run(const Param& p, int state, int t, int64_t pos, int64_t n, float* dst, bool keep_crcs) {
  const auto& pre = p.prefix[t];
  size_t k = static_cast<size_t>(std::upper_bound(pre.begin(), pre.end(), pos) - pre.begin()) - 1;
  while (n > 0) {
    if (k + 1 >= pre.size()) throw Error("internal error: read past the fragments of " + p.plan->name);
    const int64_t m = std::min(n, pre[k + 1] - pos);
    const Tensor v = p.frags[state][t][k].narrow(0, pos - pre[k], m);
    if (!cache_->read_into(p.files[t][k], v, reinterpret_cast<uint8_t*>(dst))) v.copy_to(dst);
    if (keep_crcs && keep_crcs_ && v.storage() && v.storage()->is_mapped()) {
      const auto bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(dst), static_cast<size_t>(m) * 4);
      const KnownCrc c{file_offset(p, state, t, k) + static_cast<uint64_t>(pos - pre[k]) * 4, bytes.size(),
                       crc32_update(0, bytes)};
      FilePieces& fp = *pieces_[static_cast<size_t>(p.files[t][k])];
      std::lock_guard lock(fp.mu);
      fp.list.push_back(c);
    }
    pos += m, dst += m, n -= m, ++k;
  }
}

const float* DirectSource::joined(int param, int state) {
  const size_t key = static_cast<size_t>(param) * model_.states.size() + static_cast<size_t>(state);
  std::call_once(*joined_once_[key], [&] {
    const auto& mp = model_.params[param];
    const auto& pp = *params_[param].plan;
    const std::string& sname = model_.states[state];
    std::vector<Tensor> slices;
    uint64_t bytes = 0;
    for (size_t t = 0; t < pp.fragments.size(); ++t) {
      slices.push_back(cache_->slice(pp.fragments[t], sname, pp.tp_shapes[t], &bytes));
      if (state == fp32_state_ && slices.back().dtype() == DType::Float32) {
        const Tensor s = slices.back().contiguous();
        image_->check_run(pp, t, 0, reinterpret_cast<const float*>(s.contiguous_bytes().data()), s.numel(), plan_.files);
      }
    }
    Tensor j = formats::universal::join(mp.name, slices, mp.rule, model_.patterns);
    if (mp.rule.vocab && model_.patterns.original_vocab_size)
      j = to_universal::strip_vocab_padding(mp.name, j, *model_.patterns.original_vocab_size);
    if (j.dtype() != DType::Float32) throw Error("parameter " + mp.name + " " + sname + ": not float32");
    if (j.numel() != mp.stored_numel) throw Error("parameter " + mp.name + ": joined tensor has an unexpected size");
    auto& out = joined_[key];
    out.resize(static_cast<size_t>(j.numel()));
    j.contiguous().copy_to(out.data());
  });
  return joined_[key].data();
}

template <typename F>
void DirectSource::for_each_slice_run(const Param& p, int64_t a, int64_t n, F&& emit) const {
  if (p.kind == Param::Identity) {
    emit(0, a, n, int64_t{0});
    return;
  }
  const int64_t block = p.rows * p.inner;
  for (int64_t done = 0; done < n;) {
    const int64_t u = a + done;
    const int64_t outer = u / block, rem = u % block, c = rem / p.inner, i = rem % p.inner;
    auto it = std::upper_bound(p.pieces.begin(), p.pieces.end(), c,
                               [](int64_t v, const Piece& x) { return v < x.start; });
    if (it == p.pieces.begin() || c >= (it - 1)->start + (it - 1)->len)
      throw Error("internal error: element " + std::to_string(u) + " of " + p.plan->name + " is in no TP slice");
    const Piece& pc = *(it - 1);
    const int64_t pos = outer * p.slice_rows[pc.t] * p.inner + (pc.at + c - pc.start) * p.inner + i;
    const int64_t m = std::min(n - done, (pc.start + pc.len - c) * p.inner - i);
    emit(pc.t, pos, m, done);
    done += m;
  }
}

void DirectSource::read(int param, int state, int64_t a, int64_t n, float* dst) {
  const Param& p = params_[param];
  if (a < 0 || n < 0 || a + n > model_.params[param].stored_numel)
    throw Error("internal error: elements [" + std::to_string(a) + ", +" + std::to_string(n) + ") of " + p.plan->name);
  if (p.kind == Param::Joined) {
    std::memcpy(dst, joined(param, state) + a, static_cast<size_t>(n) * 4);
    return;
  }
  for_each_slice_run(p, a, n, [&](int t, int64_t pos, int64_t m, int64_t at) { copy_slice(p, state, t, pos, m, dst + at); });
}

uint64_t DirectSource::file_offset(const Param& p, int state, int t, size_t k) const {
  return cache_->file_offset(p.files[t][k], p.frags[state][t][k]);
}

nlohmann::json DirectSource::source_json() const {
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t bytes = 0, runs = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    const int64_t n = model_.params[i].stored_numel;
    for (size_t si = 0; si < model_.states.size(); ++si) {
      nlohmann::json out = nlohmann::json::array();
      // [file, byte offset, bytes, first universal element]; a joined (replicated / averaged)
      // parameter is read whole from every TP rank and joined by ucp-union's rule.
      auto add = [&](int file, uint64_t off, uint64_t nb, int64_t u) {
        bytes += nb;
        if (!out.empty()) {
          auto& last = out.back();
          if (last[0].get<int>() == file && last[1].get<uint64_t>() + last[2].get<uint64_t>() == off &&
              (u < 0 || last[3].get<int64_t>() + static_cast<int64_t>(last[2].get<uint64_t>() / 4) == u)) {
            last[2] = last[2].get<uint64_t>() + nb;
            return;
          }
        }
        out.push_back({file, off, nb, u});
      };
      if (p.kind == Param::Joined) {
        for (size_t t = 0; t < p.plan->fragments.size(); ++t)
          for (const auto& f : p.plan->fragments[t]) {
            const Tensor x = cache_->fragment(f, model_.states[si]);
            const uint64_t off = cache_->file_offset(f.file, x);
            add(f.file, off, static_cast<uint64_t>(f.numel) * 4, -1);
          }
      } else {
        file_runs(static_cast<int>(i), static_cast<int>(si), 0, n,
                  [&](int file, uint64_t off, uint64_t nb, int64_t u) { add(file, off, nb, u); });
      }
      runs += out.size();
      tensors.push_back({{"param", model_.params[i].name},
                         {"state", model_.states[si]},
                         {"elements", n},
                         {"joined", p.kind == Param::Joined},
                         {"runs", std::move(out)}});
    }
  }
  return {{"source_files", plan_.files},
          {"tensors", std::move(tensors)},
          {"totals", {{"source_bytes_read", bytes}, {"source_runs", runs}, {"source_files", plan_.files.size()}}}};
}

bool DirectSource::file_runs(int param, int state, int64_t a, int64_t n,
                             const std::function<void(int, uint64_t, uint64_t, int64_t)>& emit) const {
  const Param& p = params_[param];
  if (p.kind == Param::Joined || p.frags.empty()) return false;
  for_each_slice_run(p, a, n, [&](int t, int64_t pos, int64_t m, int64_t at) {
    const auto& pre = p.prefix[t];
    size_t k = static_cast<size_t>(std::upper_bound(pre.begin(), pre.end(), pos) - pre.begin()) - 1;
    while (m > 0) {
      const int64_t c = std::min(m, pre[k + 1] - pos);
      emit(p.files[t][k], file_offset(p, state, t, k) + static_cast<uint64_t>(pos - pre[k]) * 4,
           static_cast<uint64_t>(c) * 4, at);
      pos += c, m -= c, at += c, ++k;
    }
  });
  return true;
}

uint64_t DirectSource::check_source_crcs(const std::vector<std::string>& paths, int threads) {
  std::map<std::string, size_t> shard;
  for (size_t f = 0; f < plan_.files.size(); ++f) shard[fs::weakly_canonical(plan_.files[f]).string()] = f;
  std::vector<std::string> todo;  // each file once (the plan and a folder listing may spell it differently)
  for (const auto& p : paths) todo.push_back(fs::weakly_canonical(p).string());
  std::sort(todo.begin(), todo.end());
  todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
  std::atomic<uint64_t> read{0};
  parallel::in_arena(threads, [&] {
    tbb::parallel_for(size_t{0}, todo.size(), [&](size_t i) {
      check_interrupted();
      std::vector<KnownCrc> known;
      if (auto it = shard.find(todo[i]); it != shard.end()) {
        FilePieces& fp = *pieces_[it->second];
        std::lock_guard lock(fp.mu);
        known = std::move(fp.list);
        fp.list.clear();
      }
      read += check_zip_crcs(todo[i], std::move(known));
    });
  });
  return read.load();
}

pickle::ValuePtr DirectSource::step(int param) {
  const auto& pp = *params_[param].plan;
  if (pp.step_file < 0) return nullptr;
  // A fresh value on every call, as loading the universal step.pt gives (shared values would be
  // pickled once where the two-step path writes copies).
  ValuePtr v = pickle::deep_copy(cache_->step(pp.step_file, pp.step_group));
  if (v && v->kind == Kind::Tensor && v->tensor) v = Value::of_tensor(v->tensor->contiguous(true));
  formats::deepspeed::tag_storages_cpu(v);
  return v;
}

void DirectSource::whole_crc(int param, int state, uint32_t crc) {
  std::lock_guard lock(crc_mu_);
  crc_[{param, state}] = crc;
}

nlohmann::json DirectSource::checksums() const {
  std::lock_guard lock(crc_mu_);
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, c] : crc_) j[model_.params[k.first].name][model_.states[k.second]] = formats::universal::crc32_text(c);
  return j;
}

size_t DirectSource::compare_with(const std::string& manifest_path) const {
  fs::path path(manifest_path);
  if (fs::is_directory(path)) path /= formats::universal::kUniversalManifestName;
  const formats::universal::UniversalManifest m = formats::universal::read_universal_manifest(path.string());
  std::map<std::string, const formats::universal::UniversalParam*> entries;
  for (const auto& e : m.params) entries[e.name] = &e;
  if (entries.size() != model_.params.size())
    throw Error(path.string() + ": " + std::to_string(entries.size()) + " parameters, the source has " +
                std::to_string(model_.params.size()));
  std::lock_guard lock(crc_mu_);
  size_t compared = 0;
  for (const auto& [k, c] : crc_) {
    const std::string& name = model_.params[k.first].name;
    const std::string& state = model_.states[k.second];
    auto it = entries.find(name);
    if (it == entries.end()) throw Error(path.string() + ": no parameter " + name + " (the source has it)");
    auto st = it->second->states.find(state);
    if (st == it->second->states.end()) throw Error(path.string() + ": parameter " + name + " has no state " + state);
    if (st->second.crc32 != c)
      throw Error(path.string() + ": parameter " + name + " " + state + ": crc32 " + formats::universal::crc32_text(c) +
                  " computed from the source, the manifest says " +
                  (st->second.crc32 ? formats::universal::crc32_text(*st->second.crc32) : std::string("nothing")));
    ++compared;
  }
  return compared;
}

}  // namespace ucpkit::reshard
