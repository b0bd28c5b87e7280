// DefaultSavePlanner's planner_data held flat (planner_paths.h).
#include "formats/dcp/planner_paths.h"

#include <limits>

#include "core/error.h"

namespace ucpkit::formats::dcp {

uint64_t PlannerPaths::keep(std::string_view s) {
  if (s.size() > std::numeric_limits<uint32_t>::max())
    throw Error("DCP planner_data: a key of " + std::to_string(s.size()) + " bytes");
  const uint64_t at = text_.size();
  text_.append(s);
  return at;
}

void PlannerPaths::reserve(size_t paths) {
  paths_.reserve(paths);
  index_.reserve(paths);
  // About what a state dict's paths take (a flat fqn and 2-4 keys): grown by doubling, the text and parts of 100,000
  // paths were copied about twice over.
  parts_.reserve(4 * paths);
  text_.reserve(96 * paths);
}

bool PlannerPaths::add(std::string_view flat, std::span<const Part> parts, bool list) {
  if (paths_.size() >= std::numeric_limits<uint32_t>::max() - 1) throw Error("DCP planner_data: too many paths");
  Path p;
  p.flat_at = keep(flat);
  p.flat_size = static_cast<uint32_t>(flat.size());
  p.parts = static_cast<uint32_t>(parts.size());
  p.first_part = parts_.size();
  p.list = list;
  for (const Part& part : parts)
    parts_.push_back(part.is_index ? StoredPart{part.index, 0, true}
                                   : StoredPart{static_cast<int64_t>(keep(part.key)),
                                                static_cast<uint32_t>(part.key.size()), false});
  paths_.push_back(p);
  // Added, then indexed: one probe, which finds a repeat (then the path is taken back).
  if (index_.add(this->flat(paths_.size() - 1), static_cast<uint32_t>(paths_.size() - 1),
                 [this](uint32_t k) { return this->flat(k); })) {
    paths_.pop_back();
    parts_.resize(p.first_part);
    text_.resize(p.flat_at);
    return false;
  }
  return true;
}

void PlannerPaths::add_all(const PlannerPaths& other) {
  std::vector<Part> parts;
  for (size_t k = 0; k < other.size(); ++k) {
    parts.clear();
    for (size_t j = 0; j < other.part_count(k); ++j) parts.push_back(other.part(k, j));
    add(other.flat(k), parts, other.is_list(k));
  }
}

PlannerPaths::Part PlannerPaths::part(size_t k, size_t j) const {
  const StoredPart& s = parts_[paths_[k].first_part + j];
  if (s.is_index) return {{}, s.value, true};
  return {text(static_cast<uint64_t>(s.value), s.size), 0, false};
}

std::optional<size_t> PlannerPaths::find(std::string_view flat) const {
  const auto at = index_.find(flat, [this](uint32_t k) { return this->flat(k); });
  return at ? std::optional<size_t>(*at) : std::nullopt;
}

std::vector<std::string> PlannerPaths::strings(std::string_view flat) const {
  std::vector<std::string> out;
  const auto k = find(flat);
  if (!k) return out;
  for (size_t j = 0; j < part_count(*k); ++j) {
    const Part p = part(*k, j);
    out.push_back(p.is_index ? std::to_string(p.index) : std::string(p.key));
  }
  return out;
}

pickle::ValuePtr PlannerPaths::value() const {
  using pickle::Value;
  pickle::ValuePtr d = Value::dict();
  d->entries.reserve(size());
  for (size_t k = 0; k < size(); ++k) {
    std::vector<pickle::ValuePtr> items;
    for (size_t j = 0; j < part_count(k); ++j) {
      const Part p = part(k, j);
      items.push_back(p.is_index ? Value::integer(p.index) : Value::str(std::string(p.key)));
    }
    d->entries.emplace_back(Value::str(std::string(flat(k))),
                            is_list(k) ? Value::list(std::move(items)) : Value::tuple(std::move(items)));
  }
  return d;
}

PlannerPaths PlannerPaths::of(const pickle::Value& planner_data, bool* all) {
  using pickle::Kind;
  PlannerPaths out;
  bool every = planner_data.kind == Kind::Dict;
  if (every) out.reserve(planner_data.entries.size());
  std::vector<Part> parts;
  for (const auto& [k, path] : planner_data.entries) {
    bool ok = k && k->kind == Kind::Str && path && path->is_sequence();
    parts.clear();
    for (size_t j = 0; ok && j < path->items.size(); ++j) {
      const pickle::ValuePtr& p = path->items[j];
      if (p && p->kind == Kind::Str) parts.push_back({p->s, 0, false});
      else if (p && p->kind == Kind::Int) parts.push_back({{}, p->i, true});
      else ok = false;
    }
    ok = ok && out.add(k->s, parts, path->kind == Kind::List);
    every = every && ok;
  }
  if (all) *all = every;
  return out;
}

bool PlannerPaths::operator==(const PlannerPaths& o) const {
  if (size() != o.size()) return false;
  for (size_t k = 0; k < size(); ++k) {
    if (flat(k) != o.flat(k) || is_list(k) != o.is_list(k) || part_count(k) != o.part_count(k)) return false;
    for (size_t j = 0; j < part_count(k); ++j) {
      const Part a = part(k, j), b = o.part(k, j);
      if (a.is_index != b.is_index || a.index != b.index || a.key != b.key) return false;
    }
  }
  return true;
}

}  // namespace ucpkit::formats::dcp
