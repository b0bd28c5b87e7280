// A protocol-2 pickler for Value trees, emitting what Python's torch.save would: tensors through
// torch._utils._rebuild_tensor_v2 with persistent storage ids, OrderedDict, torch.Size, dtypes and
// opaque objects with their original class paths. Shared values are memoized (written once).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "io/pickle/opcodes.h"
#include "io/pickle/value.h"

namespace ucpkit::pickle {

struct PickleOptions {
  // Returns the persistent id tuple for a storage (the torch writer assigns keys here).
  std::function<ValuePtr(const std::shared_ptr<Storage>&)> storage_id;
  // Strings and class references written once and fetched from the memo after, as Python's pickler
  // does for the same objects (a str shared by several places of the tree, a class named again): DCP
  // metadata repeats field names, fqns and classes 100,000 times. Off: the bytes as before.
  bool memoize_repeats = false;
};

std::string pickle(const ValuePtr& root, const PickleOptions& options);

namespace detail {
class Pickler;
}

// A pickle written piece by piece (DCP metadata of 100,000 tensors): the caller writes the
// opcodes of the outer containers and saves the values inside them one at a time, so that no tree of
// the whole is ever built. In a value saved as `transient`, what only its container holds (use count
// 1) is not memoized, so the value may be freed once saved; what is shared (the strings and classes
// a caller keeps to have them written once) is memoized as usual.
class PickleStream {
 public:
  explicit PickleStream(const PickleOptions& options);  // writes PROTO
  ~PickleStream();
  PickleStream(const PickleStream&) = delete;
  PickleStream& operator=(const PickleStream&) = delete;
  void save(const ValuePtr& value, bool transient = false);
  // One opcode (a container or object the caller builds by hand: EMPTY_DICT, MARK, ... SETITEMS, BUILD).
  void op(Op o);
  // Pieces of many small objects of one known shape (the 10^5 entries of a DCP `.metadata`), written without
  // a Value each: the same opcodes and memo entries that save(..., true) writes for the values they stand for.
  // Where a piece below was memoized, kept by the caller for a piece written again and again (a field name, a
  // class): fetched from the memo without looking its text up. Empty until the piece is first written.
  struct MemoRef {
    uint64_t index = UINT64_MAX;
  };
  // A Str shared by the caller (a pool's string): memoized on first use, fetched after; by content, so the
  // same text is one memo entry however often it is passed (and whichever MemoRef it is passed with).
  void str(std::string_view s);
  void str(std::string_view s, MemoRef& ref);
  // The class `module.name` as a Global value shared by the caller: GLOBAL and its two memo entries (the
  // global's, the value's) the first time, fetched after. A class written here must not also be saved as a Value.
  void global_value(std::string_view module, std::string_view name, MemoRef& ref);
  // save(value) of a value the caller shares (memoized whether transient or not), fetched by `ref` after.
  void save_shared(const ValuePtr& value, MemoRef& ref);
  // A tuple of `n` items the caller writes between the two, as save() writes one (not memoized, as a transient one).
  void tuple_begin(size_t n);
  void tuple_end(size_t n);
  void integer(int64_t v);
  void size(std::span<const int64_t> dims);  // torch.Size(dims), not shared
  std::string finish();                      // STOP; the bytes
  // The bytes pickled so far (a view until the next call that writes): the front of what finish() returns.
  std::string_view so_far();
  // Room for `bytes` of pickle, taken at once (a 30 MB `.metadata` grown by doubling was copied about twice).
  // And room for `texts` shared texts (str()): a table grown by doubling hashed each text again, read back from
  // wherever it lies in the output (100,000 fqns of a DCP `.metadata`: cache misses on the pickling thread).
  void reserve(size_t bytes, size_t texts = 0);

 private:
  std::unique_ptr<detail::Pickler> p_;
};

}  // namespace ucpkit::pickle
