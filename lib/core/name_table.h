// Positions found by name, for names the caller keeps (the 10^5 fqns of a DCP `.metadata`): a table of hash tags
// and positions probed in place, 8 bytes a slot and at least two slots a name. A standard hash container costs a
// division, two cache misses and a node (with a copy of the name) per name: half of a 100,000-tensor plan's time.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace ucpkit {

class NameTable {
 public:
  // Room for `names` names without growing (before any is added).
  void reserve(size_t names) {
    if (size_ == 0 && slots_.size() < 2 * names) slots_.assign(capacity_for(names), Slot{});
  }
  // Adds position `at` under `name`: the position already under that name when there is one (nothing is added
  // then), else nullopt. `name_of(position)` gives the name of a position added before.
  template <class NameOf>
  std::optional<uint32_t> add(std::string_view name, uint32_t at, const NameOf& name_of) {
    if (2 * (size_ + 1) > slots_.size()) grow(name_of);
    const uint64_t h = hash(name);
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      Slot& s = slots_[i];
      if (s.at == kFree) {
        s = {tag(h), at};
        ++size_;
        return std::nullopt;
      }
      if (s.tag == tag(h) && name_of(s.at) == name) return s.at;
    }
  }
  template <class NameOf>
  std::optional<uint32_t> find(std::string_view name, const NameOf& name_of) const {
    if (slots_.empty()) return std::nullopt;
    const uint64_t h = hash(name);
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.at == kFree) return std::nullopt;
      if (s.tag == tag(h) && name_of(s.at) == name) return s.at;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint32_t kFree = UINT32_MAX;
  struct Slot {
    uint32_t tag = 0;  // the name's hash, high half
    uint32_t at = kFree;
  };
  static uint64_t hash(std::string_view name) { return std::hash<std::string_view>{}(name); }
  static uint32_t tag(uint64_t h) { return static_cast<uint32_t>(h >> 32); }
  static size_t capacity_for(size_t names) {
    size_t c = 16;
    while (c < 2 * names) c <<= 1;
    return c;
  }
  size_t mask() const { return slots_.size() - 1; }
  template <class NameOf>
  void grow(const NameOf& name_of) {
    std::vector<Slot> old(capacity_for(std::max<size_t>(size_ + 1, slots_.size())), Slot{});
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.at == kFree) continue;
      size_t i = hash(name_of(s.at)) & mask();
      while (slots_[i].at != kFree) i = (i + 1) & mask();
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace ucpkit
