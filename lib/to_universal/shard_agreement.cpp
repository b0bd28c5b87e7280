// Cross-file and per-shard consistency checks of a checkpoint being planned.
#include "to_universal/shard_agreement.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"
#include "formats/deepspeed/save_identity.h"

namespace ucpkit::to_universal {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

std::string cut(const std::string& s) { return s.size() <= 120 ? s : s.substr(0, 117) + "..."; }

std::string group_label(int g) { return "param group " + std::to_string(g); }

// ZeRO-1/2 and BF16_Optimizer: the fragments of group g, sorted by start, must tile [0, end) of the
// partition; returns end.
int64_t covered_end(const ShardView& shard, int g, const std::string& path) {
  auto frs = shard.fragments(g);
  std::stable_sort(frs.begin(), frs.end(), [](const auto& a, const auto& b) { return std::get<1>(a) < std::get<1>(b); });
  int64_t end = 0;
  std::string last;
  for (const auto& [name, start, numel] : frs) {
    if (start < 0 || numel < 0)
      fail(path, group_label(g) + ": param_slice_mappings gives " + name + " a negative start or length");
    if (numel == 0) continue;  // a zero-sized parameter owns no elements
    if (start < end)
      fail(path, group_label(g) + ": param_slice_mappings fragments of " + last + " and " + name +
                     " overlap (elements [" + std::to_string(start) + ", " + std::to_string(std::min(end, start + numel)) +
                     ") of the flat partition)");
    if (start > end)
      fail(path, group_label(g) + ": elements [" + std::to_string(end) + ", " + std::to_string(start) +
                     ") of the flat partition belong to no parameter (a hole in param_slice_mappings before " + name + ")");
    end = start + numel;
    last = name;
  }
  return end;
}

}  // namespace

void ShardAgreement::note(const std::string& field, std::string value, const std::string& path) {
  auto [it, fresh] = fields_.try_emplace(field);
  if (fresh) order_.push_back(field);
  it->second.push_back({std::move(value), path});
}

void ShardAgreement::model_file(const ValuePtr& root, const std::string& path) {
  for (auto& [field, value] : formats::deepspeed::model_file_identity(root)) note(field, std::move(value), path);
}

void ShardAgreement::optim_shard(const ShardView& shard, const ValuePtr& root, const std::string& path) {
  for (auto& [field, value] : formats::deepspeed::optim_file_identity(root)) note(field, std::move(value), path);
  // The state is keyed by param group, group_paddings are counts: read_optimizer_shard checked both.
  const int groups = shard.groups();
  const auto& hyper = shard.shard().param_groups;
  for (int g = 0; g < groups; ++g) {
    const int64_t fp32 = shard.state_tensor(g, "fp32").numel();
    int64_t end = fp32, padding = 0;
    if (!shard.zero3()) {  // ZeRO-3 partitions are laid out from param_shapes by the planner itself
      end = covered_end(shard, g, path);
      padding = shard.shard().groups[g].padding;
      const bool fits = padding >= 0 ? (fp32 == end || fp32 == end + padding) : fp32 >= end;
      if (!fits)
        fail(path, group_label(g) + ": param_slice_mappings cover " + std::to_string(end) +
                       " elements of the flat partition but its fp32 partition holds " + std::to_string(fp32) +
                       (padding >= 0 ? " (recorded padding " + std::to_string(padding) + ")" : std::string()));
    }
    const auto names = shard.states(g);  // "fp32" first
    for (size_t i = 1; i < names.size(); ++i) {
      const int64_t n = shard.state_tensor(g, names[i]).numel();
      const bool fits = padding >= 0 ? (n == end || n == end + padding) : n >= end;
      if (!fits)
        fail(path, group_label(g) + ": optimizer state " + names[i] + " holds " + std::to_string(n) +
                       " elements but the flat partition has " + std::to_string(end) +
                       (padding > 0 ? " (+ " + std::to_string(padding) + " padding)" : std::string()) +
                       " (state of another group or shard?)");
    }
    std::string listed = "[";
    for (size_t i = 1; i < names.size(); ++i) listed += (i > 1 ? ", " : "") + names[i];
    if (shard.has_step(g)) listed += std::string(names.size() > 1 ? ", " : "") + "step";
    note("optimizer state list of " + group_label(g), listed + "]", path);
    if (shard.has_step(g)) note("optimizer step", formats::deepspeed::identity_text(shard.step(g)), path);
    if (g < static_cast<int>(hyper.size()) && hyper[g] && hyper[g]->kind == Kind::Dict) {
      std::string h;
      for (const auto& [k, v] : hyper[g]->entries) {
        if (!k || k->kind != Kind::Str || k->s == "params") continue;
        h += (h.empty() ? "" : ", ") + k->s + "=" + formats::deepspeed::identity_text(v);
      }
      note("hyper-parameter set of " + group_label(g), h, path);
    }
  }
}

void ShardAgreement::partition(const std::string& buffer, int part, int count, int64_t partition_numel,
                               std::vector<std::tuple<std::string, int64_t, int64_t>> fragments,
                               const std::string& path) {
  auto& parts = buffers_[buffer];
  if (static_cast<int>(parts.size()) < count) parts.resize(count);
  if (part < 0 || part >= static_cast<int>(parts.size())) return;
  std::stable_sort(fragments.begin(), fragments.end(),
                   [](const auto& a, const auto& b) { return std::get<1>(a) < std::get<1>(b); });
  fragments.erase(std::remove_if(fragments.begin(), fragments.end(), [](const auto& f) { return std::get<2>(f) == 0; }),
                  fragments.end());
  parts[part] = Part{path, partition_numel, std::move(fragments)};
}

void ShardAgreement::check_walk(const std::string& buffer, const std::vector<Part>& parts) const {
  std::map<std::string, size_t> last_part;  // parameter -> the partition it was last seen in
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    if (p.path.empty()) continue;  // a partition not planned (not read): nothing to compare
    for (size_t k = 0; k < p.fragments.size(); ++k) {
      const auto& [name, start, numel] = p.fragments[k];
      auto seen = last_part.find(name);
      if (seen == last_part.end()) {
        last_part.emplace(name, i);
        continue;
      }
      // The parameter continues from an earlier partition: only from the one just before, as the
      // first fragment here (at 0) after the last fragment there (ending at that partition's end).
      const Part& prev = parts[seen->second];
      const bool from_previous = seen->second + 1 == i && k == 0 && start == 0 && !prev.fragments.empty() &&
                                 std::get<0>(prev.fragments.back()) == name &&
                                 std::get<1>(prev.fragments.back()) + std::get<2>(prev.fragments.back()) == prev.numel;
      if (!from_previous)
        fail(p.path, buffer + ": parameter " + name + " is also in " + prev.path +
                         ", but not as the continuation of that partition into this one (partition " +
                         std::to_string(seen->second) + " -> " + std::to_string(i) +
                         "): rank files exchanged or of different layouts");
      seen->second = i;
    }
  }
}

void ShardAgreement::finish() const {
  for (const auto& [buffer, parts] : buffers_) check_walk(buffer, parts);
  for (const auto& field : order_) {
    const auto& seen = fields_.at(field);
    std::map<std::string, size_t> count;
    for (const auto& s : seen) ++count[s.value];
    if (count.size() < 2) continue;
    // The value most files have (ties: the first file's); the first file with another value is named.
    const std::string* major = &seen[0].value;
    for (const auto& [v, n] : count)
      if (n > count.at(*major)) major = &v;
    const Seen* ref = nullptr;
    for (const auto& s : seen)
      if (s.value == *major) {
        ref = &s;
        break;
      }
    for (const auto& s : seen)
      if (s.value != *major) {
        const size_t n = count.at(*major);
        fail(s.path, field + " is " + cut(s.value) + " but " + ref->path +
                         (n > 1 ? " and " + std::to_string(n - 1) + " other file" + (n > 2 ? "s" : "") : std::string()) +
                         (n > 1 ? " say " : " says ") + cut(*major) +
                         ": files of different saves (another step or checkpoint) or a damaged shard are mixed");
      }
  }
}

}  // namespace ucpkit::to_universal
