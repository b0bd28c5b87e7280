// DefaultSavePlanner's planner_data: {flat fqn: the nested state-dict path it was flattened from}, each path a tuple
// (or a list) of dict keys (str) and list indices (int) (torch 2.6 checkpoint/_nested_dict.py:28-44, stored by
// default_planner.py:94, :103, :120-122; docs/formats-dcp.md), in the order pickled. Held as one
// block of text and two arrays: read as pickle Values, the 100,000 paths of a large save were a third of a reshard's
// memory and a fifth of its time. A writer keeping the source's nesting writes them back (writer.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/name_table.h"
#include "io/pickle/value.h"

namespace ucpkit::formats::dcp {

class PlannerPaths {
 public:
  struct Part {
    std::string_view key;  // a dict key, or
    int64_t index = 0;     // a list index (is_index)
    bool is_index = false;
  };

  // Adds `flat`'s path, pickled as a list when `list` (else a tuple). False, adding nothing, when `flat` has one.
  bool add(std::string_view flat, std::span<const Part> parts, bool list = false);
  // Adds the paths of `other` whose flat fqn has none here (the first wins).
  void add_all(const PlannerPaths& other);
  void reserve(size_t paths);

  size_t size() const { return paths_.size(); }
  std::string_view flat(size_t k) const { return text(paths_[k].flat_at, paths_[k].flat_size); }
  bool is_list(size_t k) const { return paths_[k].list; }
  size_t part_count(size_t k) const { return paths_[k].parts; }
  Part part(size_t k, size_t j) const;
  // The position of `flat`'s path.
  std::optional<size_t> find(std::string_view flat) const;
  // `flat`'s path with list indices in decimal (state_keys.h nested paths); empty when it has none.
  std::vector<std::string> strings(std::string_view flat) const;

  // As the unpickler gives it: a dict of str keys and tuples (or lists) of str and int.
  pickle::ValuePtr value() const;
  // The paths of an unpickled planner_data (a dict); `all`, when given, says whether every entry is of that shape
  // (str key, given once, a tuple or list of str and int): those that are not are left out.
  static PlannerPaths of(const pickle::Value& planner_data, bool* all = nullptr);

  bool operator==(const PlannerPaths& o) const;

 private:
  struct Path {
    uint64_t flat_at = 0;
    uint32_t flat_size = 0;
    uint32_t parts = 0;
    uint64_t first_part = 0;
    bool list = false;
  };
  struct StoredPart {
    int64_t value = 0;  // key: its offset in text_; index: the index
    uint32_t size = 0;  // key: its size
    bool is_index = false;
  };
  std::string_view text(uint64_t at, uint32_t size) const { return {text_.data() + at, size}; }
  uint64_t keep(std::string_view s);

  std::string text_;
  std::vector<Path> paths_;
  std::vector<StoredPart> parts_;
  NameTable index_;  // flat fqn -> its path
};

}  // namespace ucpkit::formats::dcp
