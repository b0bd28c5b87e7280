// A protocol-2 pickler for Value trees, emitting what Python's torch.save would: tensors through
// torch._utils._rebuild_tensor_v2 with persistent storage ids, OrderedDict, torch.Size, dtypes and
// opaque objects with their original class paths. Shared values are memoized (written once).
#pragma once
#include <functional>
#include <string>

#include "io/pickle/value.h"

namespace ucpkit::pickle {

struct PickleOptions {
  // Returns the persistent id tuple for a storage (the torch writer assigns keys here).
  std::function<ValuePtr(const std::shared_ptr<Storage>&)> storage_id;
  // Strings and class references written once and fetched from the memo after, as Python's pickler
  // does for the same objects (a str shared by several places of the tree, a class named again): DCP
  // metadata repeats field names, fqns and classes 100,000 times (issue 47). Off: the bytes as before.
  bool memoize_repeats = false;
};

std::string pickle(const ValuePtr& root, const PickleOptions& options);

}  // namespace ucpkit::pickle
