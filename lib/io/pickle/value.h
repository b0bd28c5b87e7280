// The value tree a torch pickle decodes to: Python builtins, torch types (tensors, torch.Size,
// dtypes) and opaque objects for every class we do not know, kept so they can be written back.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/dtype.h"
#include "io/tensor.h"

namespace ucpkit::pickle {

enum class Kind : uint8_t {
  None, Bool, Int, BigInt, Float, Str, Bytes,
  List, Tuple, Dict, Set, FrozenSet,
  Shape,   // torch.Size
  Dtype,   // torch.float16 ...
  Tensor,  // torch tensor or nn.Parameter
  Global,  // a class or function reference (module + name), e.g. a storage class or a callable
  Object,  // an instance of a class we keep opaque
};

struct Value;
using ValuePtr = std::shared_ptr<Value>;
using Entry = std::pair<ValuePtr, ValuePtr>;

// An instance of a class we do not interpret: how it was built, so it can be re-emitted unchanged.
struct Object {
  enum class Build : uint8_t { Reduce, NewObj, NewObjEx };
  ValuePtr callable;            // Global: the class or reconstructor function
  ValuePtr args;                // Tuple of constructor arguments (class first for copyreg helpers)
  ValuePtr kwargs;              // Dict for NEWOBJ_EX, else null
  Build build = Build::Reduce;
  ValuePtr state;               // argument of BUILD (usually a Dict of attributes), or null
  std::vector<ValuePtr> list_items;  // APPEND/APPENDS applied to the object
  std::vector<Entry> dict_items;     // SETITEM/SETITEMS applied to the object
};

struct Value {
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                 // Str (UTF-8), Bytes (raw), BigInt (little-endian two's complement), Global module
  std::string name;              // Global name
  std::vector<ValuePtr> items;   // List, Tuple, Set, FrozenSet
  std::vector<Entry> entries;    // Dict (insertion order kept)
  bool ordered = false;          // Dict: collections.OrderedDict
  ValuePtr dict_state;           // Dict: argument of a BUILD on it (a state_dict's `_metadata` attribute), or null
  std::vector<int64_t> shape;    // Shape
  DType dtype = DType::Float32;  // Dtype
  std::shared_ptr<ucpkit::Tensor> tensor;
  // Tensor with Python state, as torch >= 2.0 pickles it (torch/_tensor.py Tensor.__reduce_ex__):
  //  * tensor_type set: torch._tensor._rebuild_from_type_v2(func, tensor_type, args, tensor_state), the
  //    tensor being func(*args) (a plain tensor carrying attributes, e.g. DeepSpeed's {'ds_id': '0_29'});
  //  * tensor_type null, tensor_state set, tensor->is_parameter: a Parameter with attributes,
  //    torch._utils._rebuild_parameter_with_state(data, requires_grad, hooks, tensor_state).
  // The writer re-emits the same record. Null for tensors without Python state.
  ValuePtr tensor_type;
  ValuePtr tensor_state;
  std::shared_ptr<Object> object;

  // --- constructors ---
  static ValuePtr none();
  static ValuePtr boolean(bool v);
  static ValuePtr integer(int64_t v);
  static ValuePtr real(double v);
  static ValuePtr str(std::string v);
  static ValuePtr bytes(std::string v);
  static ValuePtr list(std::vector<ValuePtr> items = {});
  static ValuePtr tuple(std::vector<ValuePtr> items = {});
  static ValuePtr dict(bool ordered = false);
  static ValuePtr set(std::vector<ValuePtr> items = {});
  static ValuePtr torch_size(std::vector<int64_t> dims);
  static ValuePtr torch_dtype(DType t);
  static ValuePtr of_tensor(ucpkit::Tensor t);
  static ValuePtr global(std::string module, std::string name);
  // An opaque object built like `module.name(*args)` plus BUILD(state) when state is non-null.
  static ValuePtr make_object(std::string module, std::string name, ValuePtr args, ValuePtr state,
                              Object::Build build = Object::Build::Reduce);

  // --- queries ---
  bool is(Kind k) const { return kind == k; }
  bool is_none() const { return kind == Kind::None; }
  bool is_sequence() const { return kind == Kind::List || kind == Kind::Tuple; }
  // "module.name" of a Global, or of an Object's class (for copyreg.__newobj__/_reconstructor the
  // class in args[0]).
  std::string class_path() const;
  // Dict lookup by string key: nullptr when absent (or not a dict).
  ValuePtr get(std::string_view key) const;
  // Dict lookup by string key; throws Error naming the key when absent.
  const ValuePtr& at(std::string_view key) const;
  bool contains(std::string_view key) const { return get(key) != nullptr; }
  // Inserts or replaces a string-keyed entry (keeps the position of an existing key).
  void set_item(std::string_view key, ValuePtr v);
  bool erase(std::string_view key);
  // Attribute of an opaque object (from its state dict; e.g. Namespace fields, dataclass fields).
  ValuePtr attr(std::string_view name) const;
  void set_attr(std::string_view name, ValuePtr v);

  // Conversions; throw Error when the value has another kind.
  int64_t as_int() const;       // Int, Bool, BigInt that fits, int-enum objects (ZeroStageEnum)
  double as_float() const;      // Float or Int
  bool as_bool() const;
  const std::string& as_str() const;
  std::vector<int64_t> as_shape() const;  // Shape, or Tuple/List of ints
  ucpkit::Tensor& as_tensor() const;
  // deepspeed fragment_address -> (numel, start)
  std::pair<int64_t, int64_t> as_fragment_address() const;

  // A short Python-like rendering for messages and debugging (depth- and length-limited).
  std::string repr(int max_depth = 3) const;
};

std::string_view kind_name(Kind k);
// A deep copy of containers (tensors and storages stay shared).
ValuePtr deep_copy(const ValuePtr& v);
// `v->get(key)` for a `v` that may be null: the entry, or null (no value, not a dict, no such key).
inline ValuePtr entry_of(const ValuePtr& v, std::string_view key) { return v ? v->get(key) : nullptr; }
// Releases a tree without recursion (safe for very deep or cyclic trees).
void release_tree(ValuePtr root);

}  // namespace ucpkit::pickle
