// One-pass torch_dist -> DeepSpeed source (torch_dist_source.h).
#include "reshard/torch_dist_source.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/registry.h"
#include "formats/megatron_core/reader.h"
#include "formats/universal/manifest.h"
#include "io/torch/torch_file.h"

namespace ucpkit::reshard {

namespace fs = std::filesystem;

std::shared_ptr<TorchDistInput> open_torch_dist_input(const std::string& input, const std::string& template_dir,
                                                      const std::string& map_file) {
  auto in = std::make_shared<TorchDistInput>();
  in->input = input;
  in->states = std::make_unique<to_universal::TorchDistStates>(input);
  const auto& td = *in->states;
  // The Megatron-Core-named manifest ucp-union --input <torch_dist> would write, in memory (plan order).
  formats::universal::UniversalManifest mcore;
  mcore.source = td.plan().source;
  const auto states = td.states();
  const bool step = td.has_optimizer() && td.step();
  for (const auto& p : td.plan().params) mcore.params.push_back(to_universal::torch_dist_entry(p, states, step));
  in->view = to_universal::megatron_deepspeed_view(mcore, td.checkpoint().dcp().metadata().path, template_dir, map_file);
  return in;
}

namespace {
NamedTable<TemplateReader>& template_readers() {
  static NamedTable<TemplateReader> t;
  return t;
}
[[maybe_unused]] const bool kTorchDistSourceRegistered = register_template_reader(
    formats::kTorchDist, [](const std::string& input, const std::string& template_dir, const std::string& map_file) {
      return std::shared_ptr<const TorchDistInput>(open_torch_dist_input(input, template_dir, map_file));
    });
}  // namespace

bool register_template_reader(std::string_view kind, TemplateReader open) {
  return template_readers().set(std::string(kind), std::move(open));
}

TemplateReader template_reader(const formats::FolderKind& kind) { return template_readers().find(kind.format); }

bool takes_template_input(const formats::FolderKind& kind) { return static_cast<bool>(template_reader(kind)); }

UniversalMeta torch_dist_meta(const TorchDistInput& in) {
  UniversalMeta meta;
  meta.manifest = in.view.manifest;
  meta.manifest_path = in.input + " (torch_dist, Megatron-DeepSpeed names from --template " + in.view.template_dir + ")";
  meta.model_files = in.view.model_files;
  meta.optimizer_state_path = in.view.optimizer_state;
  return meta;
}

TorchDistSource::TorchDistSource(const TorchDistInput& in, const ModelInfo& model) : in_(in), model_(model) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < in.view.manifest.params.size(); ++i) by_name[in.view.manifest.params[i].name] = i;
  for (const auto& p : model.params) {
    const auto it = by_name.find(p.name);
    if (it == by_name.end()) throw Error(in.input + ": no value for parameter '" + escaped_brief(p.name) + "'");
    view_index_.push_back(it->second);
    auto& row = slots_.emplace_back();
    for (size_t s = 0; s < model.states.size(); ++s) row.push_back(std::make_unique<Slot>());
  }
}

void TorchDistSource::read(int param, int state, int64_t a, int64_t n, float* dst) {
  Slot& slot = *slots_.at(static_cast<size_t>(param)).at(static_cast<size_t>(state));
  const int64_t numel = model_.params[static_cast<size_t>(param)].stored_numel;
  std::shared_ptr<const Tensor> value;
  std::shared_ptr<formats::dcp::RangeReader> range;
  {
    std::lock_guard<std::mutex> lock(slot.mu);  // one read of the stored chunks per state, however many ask
    if (!slot.value && !slot.range) {
      const size_t v = view_index_[static_cast<size_t>(param)];
      const std::string& name = model_.states[static_cast<size_t>(state)];
      const auto& td = *in_.states;
      const size_t from = in_.view.from[v];
      const std::string where = td.checkpoint().dcp().metadata().path + ": " + td.plan().params[from].name + " " + name;
      slot.served = 0;
      slot.given.clear();
      if (auto r = td.range(from, name)) {  // ranges read straight from the save: no state in memory
        slot.rows = to_universal::deepspeed_value_rows(r->shape(), in_.view, v, where);
        slot.row_elems = 1;
        for (size_t d = 1; d < r->shape().size(); ++d) slot.row_elems *= r->shape()[d];
        slot.range = std::move(r);
      }
    }
    if (!slot.value && !slot.range) {
      const size_t v = view_index_[static_cast<size_t>(param)];
      const std::string& name = model_.states[static_cast<size_t>(state)];
      const auto& td = *in_.states;
      const size_t from = in_.view.from[v];
      Tensor t = td.read(from, name);
      t = to_universal::to_deepspeed_value(std::move(t), in_.view, v,
                                           td.checkpoint().dcp().metadata().path + ": " + td.plan().params[from].name +
                                               " " + name,
                                           /*own_storage=*/false);  // the leading rows of a padded vocabulary: no copy
      slot.value = std::make_shared<const Tensor>(t.contiguous());
      live_bytes_ += static_cast<int64_t>(slot.value->nbytes());
    }
    value = slot.value;
    range = slot.range;
    const int64_t have = range ? (slot.rows.empty() ? 0 : (slot.rows.back().out + slot.rows.back().rows) * slot.row_elems)
                               : value->numel();
    const auto& name = model_.params[static_cast<size_t>(param)].name;
    if (a < 0 || n < 0 || a + n > numel || have != numel)
      throw Error(in_.input + ": elements [" + std::to_string(a) + ", " + std::to_string(a + n) + ") of '" +
                  escaped_brief(name) + "' asked, it has " + std::to_string(numel));
    // Each element is handed out once (exchange mode asks so): its pages are released below.
    auto it = std::lower_bound(slot.given.begin(), slot.given.end(), std::make_pair(a, int64_t{0}));
    if ((it != slot.given.end() && it->first < a + n) || (it != slot.given.begin() && std::prev(it)->second > a))
      throw Error(in_.input + ": elements [" + std::to_string(a) + ", " + std::to_string(a + n) + ") of '" +
                  escaped_brief(name) + "' asked twice (internal: the one-pass source hands each element out once)");
    slot.given.insert(it, {a, a + n});
  }
  if (range) {
    copy_rows(slot, *range, a, n, dst);
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      if ((slot.served += n) >= numel && slot.range == range) {  // every element handed out
        slot.range.reset();
        done = true;
      }
    }
    if (done) range->finish();  // the items' CRC-32s (--verify)
    return;
  }
  const uint8_t* from = value->contiguous_bytes().data() + static_cast<size_t>(a) * 4;
  std::memcpy(dst, from, static_cast<size_t>(n) * 4);
  // While the states in flight hold more than kLiveBudget, the whole pages handed out go back to the
  // system now, not when the state is dropped (a 262 MB embedding state shrinks as its parts are read).
  // Not below it: released pages are faulted in again by the next allocation (a third more time when
  // every state does it; bench_torch_dist.sh, 13 GB input: docs/formats-megatron-core.md).
  if (live_bytes_.load() > kLiveBudget && !value->storage()->is_mapped()) {
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t p0 = (reinterpret_cast<uintptr_t>(from) + page - 1) / page * page;
    const uintptr_t p1 = (reinterpret_cast<uintptr_t>(from) + static_cast<uintptr_t>(n) * 4) / page * page;
    if (p1 > p0) (void)madvise(reinterpret_cast<void*>(p0), p1 - p0, MADV_DONTNEED);
  }
  std::lock_guard<std::mutex> lock(slot.mu);
  if ((slot.served += n) >= numel && slot.value == value) {  // every element handed out
    live_bytes_ -= static_cast<int64_t>(slot.value->nbytes());
    slot.value.reset();
  }
}

void TorchDistSource::copy_rows(const Slot& slot, formats::dcp::RangeReader& range, int64_t a, int64_t n, float* dst) {
  // The runs are in output order and tile the value; the rows they give are fixed once read.
  const int64_t e = slot.row_elems;
  auto it = std::upper_bound(slot.rows.begin(), slot.rows.end(), a / e,
                             [](int64_t row, const formats::megatron_core::RowRun& r) { return row < r.out; });
  if (it != slot.rows.begin()) --it;
  for (; it != slot.rows.end() && it->out * e < a + n; ++it) {
    const int64_t lo = std::max(a, it->out * e), hi = std::min(a + n, (it->out + it->rows) * e);
    if (lo >= hi) continue;
    range.copy(it->in * e + (lo - it->out * e), hi - lo, reinterpret_cast<uint8_t*>(dst + (lo - a)));
  }
}

pickle::ValuePtr TorchDistSource::step(int param) {
  const auto& p = model_.params[static_cast<size_t>(param)];
  if (!p.step) return nullptr;
  if (const auto& s = in_.states->step()) {  // the torch_dist save's step travels
    // A fresh value on every call, as loading each universal step.pt gives: a shared tensor would be
    // pickled once, and one step tensor shared by every parameter's optimizer state.
    pickle::ValuePtr v = pickle::deep_copy(s);
    if (v && v->kind == pickle::Kind::Tensor && v->tensor) v = pickle::Value::of_tensor(v->tensor->contiguous(true));
    return v;
  }
  // No optimizer step in the save: the template's step file of this parameter (as --to-names does).
  const auto& v = in_.view;
  const size_t i = view_index_[static_cast<size_t>(param)];
  const std::string folder = to_universal::param_folder(
      v.template_named_ds ? p.name : in_.states->plan().params[v.from[i]].name);
  const std::string path = (fs::path(v.template_dir) / "zero" / folder / "step.pt").string();
  if (!fs::exists(path)) throw Error(in_.input + ": parameter '" + escaped_brief(p.name) + "' has no step (neither the "
                                     "torch_dist save nor " + path + ")");
  return load_torch(path);
}

}  // namespace ucpkit::reshard
