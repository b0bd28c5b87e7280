// Pickle interpreter producing Value trees.
#include "io/pickle/unpickler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cctype>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "core/node_pool.h"
#include "io/pickle/class_paths.h"
#include "io/pickle/opcodes.h"

namespace ucpkit::pickle {
namespace {

// Decimal text (optionally signed) -> little-endian two's complement bytes (Python int pickling).
std::string decimal_to_twos_complement(std::string_view text, bool& ok) {
  ok = false;
  if (text.size() > 10000) return {};  // quadratic conversion: refuse absurd literals
  bool neg = false;
  size_t p = 0;
  if (p < text.size() && (text[p] == '-' || text[p] == '+')) neg = text[p++] == '-';
  if (p == text.size()) return {};
  std::vector<uint8_t> mag;  // little-endian magnitude
  for (; p < text.size(); ++p) {
    if (text[p] < '0' || text[p] > '9') return {};
    unsigned carry = static_cast<unsigned>(text[p] - '0');
    for (auto& byte : mag) {
      unsigned v = byte * 10u + carry;
      byte = static_cast<uint8_t>(v & 0xff);
      carry = v >> 8;
    }
    while (carry) {
      mag.push_back(static_cast<uint8_t>(carry & 0xff));
      carry >>= 8;
    }
  }
  while (!mag.empty() && mag.back() == 0) mag.pop_back();
  if (mag.empty()) {
    ok = true;
    return {};
  }
  mag.push_back(0);  // room for the sign bit
  if (neg) {
    unsigned carry = 1;
    for (auto& byte : mag) {
      unsigned v = static_cast<uint8_t>(~byte) + carry;
      byte = static_cast<uint8_t>(v & 0xff);
      carry = v >> 8;
    }
  }
  // Minimal length: drop redundant sign bytes.
  while (mag.size() > 1) {
    uint8_t last = mag.back(), prev = mag[mag.size() - 2];
    if ((last == 0 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80)))
      mag.pop_back();
    else
      break;
  }
  ok = true;
  return std::string(mag.begin(), mag.end());
}

// Two's complement bytes -> Int when they fit in 64 bits, BigInt otherwise.
ValuePtr make_long(std::string bytes) {
  if (bytes.size() <= 8) {
    auto v = Value::integer(0);
    v->kind = Kind::BigInt;
    v->s = bytes;
    int64_t x = bytes.empty() ? 0 : v->as_int();
    return Value::integer(x);
  }
  auto v = Value::integer(0);
  v->kind = Kind::BigInt;
  v->s = std::move(bytes);
  return v;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Offset of the first byte that Python's UTF-8 decoder refuses, or npos when `s` decodes. Python
// rejects overlong forms, code points above U+10FFFF and truncated sequences; surrogates (ED A0..BF)
// only with errors='surrogatepass', which CPython's _pickle.c load_binunicode / load_short_binunicode
// use; STRING/BINSTRING/SHORT_BINSTRING and GLOBAL decode strictly (torch.load passes encoding='utf-8').
size_t invalid_utf8_at(std::string_view s, bool surrogatepass) {
  auto cont = [&](size_t k) { return k < s.size() && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80; };
  for (size_t k = 0; k < s.size();) {
    const uint8_t c = static_cast<uint8_t>(s[k]);
    if (c < 0x80) {
      ++k;
      continue;
    }
    int n;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED && !surrogatepass) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return k;
    }
    if (k + 1 >= s.size() || static_cast<uint8_t>(s[k + 1]) < lo || static_cast<uint8_t>(s[k + 1]) > hi) return k;
    for (int j = 2; j <= n; ++j)
      if (!cont(k + static_cast<size_t>(j))) return k;
    k += static_cast<size_t>(n) + 1;
  }
  return std::string_view::npos;
}

// UTF-8 -> code points (lenient: invalid bytes map to themselves).
std::vector<uint32_t> utf8_code_points(std::string_view s) {
  std::vector<uint32_t> cps;
  for (size_t k = 0; k < s.size();) {
    uint8_t c = static_cast<uint8_t>(s[k]);
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || k + n >= s.size() + (n == 0 ? 1 : 0)) {
      if (n <= 0) {
        cps.push_back(c);
        ++k;
        continue;
      }
    }
    if (k + static_cast<size_t>(n) >= s.size() && n > 0) {
      cps.push_back(c);
      ++k;
      continue;
    }
    uint32_t cp = n == 0 ? c : n == 1 ? (c & 0x1F) : n == 2 ? (c & 0x0F) : (c & 0x07);
    for (int j = 1; j <= n; ++j) cp = (cp << 6) | (static_cast<uint8_t>(s[k + j]) & 0x3F);
    cps.push_back(cp);
    k += static_cast<size_t>(n) + 1;
  }
  return cps;
}

// Tensor reconstructors torch emits for tensors ucpkit cannot represent (torch/_tensor.py
// _reduce_ex_internal; torch/_utils.py): a clear error naming the construct, never an opaque object.
const char* unsupported_tensor_construct(const std::string& m, const std::string& n) {
  static const std::pair<std::string_view, const char*> utils[] = {
      {"_rebuild_sparse_tensor", "sparse tensor"},
      {"_rebuild_sparse_csr_tensor", "sparse CSR tensor"},
      {"_rebuild_qtensor", "quantized tensor"},
      {"_rebuild_nested_tensor", "nested tensor"},
      {"_rebuild_wrapper_subclass", "tensor wrapper subclass"},
      {"_rebuild_device_tensor_from_numpy", "device tensor from numpy (xla/mtia)"},
      {"_rebuild_xla_tensor", "xla tensor"},
      {"_rebuild_device_tensor_from_cpu_tensor", "device tensor from a cpu tensor (xla/maia/mtia)"},
      {"_rebuild_mps_tensor", "mps tensor"},
  };
  if (m == "torch._utils")
    for (const auto& [name, what] : utils)
      if (name == n) return what;
  return nullptr;
}

std::string supported_dtype_names() {
  return "float32, float16, bfloat16, float64, int8, int16, int32, int64, uint8, bool";
}

}  // namespace

bool is_torch_dtype_name(std::string_view name, DType& out) {
  static const std::pair<std::string_view, DType> names[] = {
      {"float32", DType::Float32}, {"float", DType::Float32},   {"float16", DType::Float16},
      {"half", DType::Float16},    {"bfloat16", DType::BFloat16}, {"float64", DType::Float64},
      {"double", DType::Float64},  {"int8", DType::Int8},       {"int16", DType::Int16},
      {"short", DType::Int16},     {"int32", DType::Int32},     {"int", DType::Int32},
      {"int64", DType::Int64},     {"long", DType::Int64},      {"uint8", DType::UInt8},
      {"bool", DType::Bool},
  };
  for (const auto& [n, t] : names)
    if (n == name) {
      out = t;
      return true;
    }
  return false;
}

namespace {

// A dict key as Python's "same key replaces" compares it: a class (0: unhashable) and its content, without
// building text for the common kinds (a checkpoint's metadata has dicts of 10^5 str keys: a string built,
// hashed and stored per key was most of SETITEMS). A tuple is compared by its items' signatures in order.
struct KeyView {
  char cls = 0;
  int64_t i = 0;
  std::string_view s;
  std::string tuple_sig;  // a tuple's signature (class 't')
};

KeyView key_view(const Value& k, int depth = 0);

// A key's signature as text (how a tuple's items are compared); empty if unhashable.
std::string key_signature(const Value& k, int depth) {
  const KeyView v = key_view(k, depth);
  switch (v.cls) {
    case 0: return {};
    case 't': return v.tuple_sig;
    case 's': case 'b': case 'I': return v.cls + std::string(v.s);
    case 'N': return "N";
    default: return v.cls + std::to_string(v.i);
  }
}

KeyView key_view(const Value& k, int depth) {
  KeyView v;
  switch (k.kind) {
    case Kind::Str: v.cls = 's', v.s = k.s; break;
    case Kind::Bytes: v.cls = 'b', v.s = k.s; break;
    case Kind::BigInt: v.cls = 'I', v.s = k.s; break;
    case Kind::Int: v.cls = 'i', v.i = k.i; break;
    case Kind::Bool: v.cls = 'i', v.i = k.b ? 1 : 0; break;
    case Kind::None: v.cls = 'N'; break;
    case Kind::Dtype: v.cls = 'd', v.i = static_cast<int64_t>(k.dtype); break;  // torch dtypes are singletons
    case Kind::Float:
      if (std::floor(k.f) == k.f && std::fabs(k.f) < 9e18) v.cls = 'i', v.i = static_cast<int64_t>(k.f);
      else v.cls = 'f', v.i = static_cast<int64_t>(std::bit_cast<uint64_t>(k.f));
      break;
    // An instance or a class as a key: Python hashes it (object.__hash__, or a frozen dataclass's
    // fields, e.g. DCP's MetadataIndex keying Metadata.storage_data); keys of one pickled dict are
    // distinct objects, so identity keeps every entry.
    case Kind::Object:
    case Kind::Global: v.cls = 'o', v.i = static_cast<int64_t>(reinterpret_cast<uintptr_t>(&k)); break;
    case Kind::Tuple:
      // Deep or long tuple keys are compared by identity only (bounded work per key).
      if (depth > 8 || k.items.size() > 256) {
        v.tuple_sig = "p" + std::to_string(reinterpret_cast<uintptr_t>(&k));
      } else {
        v.tuple_sig = "t(";
        for (const auto& it : k.items) {
          const std::string item = key_signature(*it, depth + 1);
          if (item.empty()) return {};
          v.tuple_sig += std::to_string(item.size()) + ":" + item;
        }
        v.tuple_sig += ")";
      }
      v.cls = 't';
      break;
    default: break;
  }
  return v;
}

bool same_key(const KeyView& a, const KeyView& b) {
  if (a.cls != b.cls) return false;
  switch (a.cls) {
    case 't': return a.tuple_sig == b.tuple_sig;
    case 's': case 'b': case 'I': return a.s == b.s;
    case 'N': return true;
    default: return a.i == b.i;
  }
}

uint64_t key_hash(const KeyView& v) {
  uint64_t h = v.cls == 't'                                    ? std::hash<std::string>{}(v.tuple_sig)
               : v.cls == 's' || v.cls == 'b' || v.cls == 'I' ? std::hash<std::string_view>{}(v.s)
                                                              : static_cast<uint64_t>(v.i);
  h ^= static_cast<uint64_t>(static_cast<unsigned char>(v.cls)) << 56;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;  // splitmix64's finaliser: integer keys spread over the table
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

// An index of a large dict's entries by key: open addressing over (hash, entry + 1), no allocation per key.
class DictIndex {
 public:
  size_t size() const { return count_; }
  void clear() {
    at_.clear();
    hash_.clear();
    count_ = 0;
  }
  // The entry whose key `same(entry)` confirms among those of hash h, or npos.
  template <class Same>
  size_t find(uint64_t h, const Same& same) const {
    if (at_.empty()) return npos;
    for (size_t k = h & (at_.size() - 1);; k = (k + 1) & (at_.size() - 1)) {
      if (at_[k] == 0) return npos;
      if (hash_[k] == h && same(at_[k] - 1)) return at_[k] - 1;
    }
  }
  void insert(uint64_t h, size_t entry) {
    if ((count_ + 1) * 2 > at_.size()) grow();
    place(h, entry);
    ++count_;
  }
  static constexpr size_t npos = static_cast<size_t>(-1);

 private:
  void place(uint64_t h, size_t entry) {
    size_t k = h & (at_.size() - 1);
    while (at_[k] != 0) k = (k + 1) & (at_.size() - 1);
    at_[k] = entry + 1;
    hash_[k] = h;
  }
  void grow() {
    std::vector<size_t> at = std::move(at_);
    std::vector<uint64_t> hash = std::move(hash_);
    at_.assign(std::max<size_t>(64, at.size() * 2), 0);
    hash_.assign(at_.size(), 0);
    for (size_t k = 0; k < at.size(); ++k)
      if (at[k] != 0) place(hash[k], at[k] - 1);
  }
  std::vector<size_t> at_;
  std::vector<uint64_t> hash_;
  size_t count_ = 0;
};

// The unpickler's memo: a vector while the indices are dense (a pickler numbers them 0, 1, 2...), a map for
// an index far past the entries so far (only damage or a hand-made pickle does that), so memory follows the
// entries, not the largest index. A hash lookup per GET was 4-5% of a 100,000-tensor DCP's .metadata parse.
class Memo {
 public:
  size_t size() const { return size_; }
  void put(uint64_t idx, ValuePtr v) {
    if (idx >= dense_.size() && idx < 2 * (size_ + 1024)) grow(idx);
    if (idx < dense_.size()) {
      if (!dense_[idx]) ++size_;
      dense_[idx] = std::move(v);
      return;
    }
    auto [it, added] = sparse_.try_emplace(idx);
    if (added) ++size_;
    it->second = std::move(v);
  }
  const ValuePtr* get(uint64_t idx) const {
    if (idx < dense_.size()) return dense_[idx] ? &dense_[idx] : nullptr;
    auto it = sparse_.find(idx);
    return it == sparse_.end() ? nullptr : &it->second;
  }
  template <class F>
  void each(F&& f) {
    for (auto& v : dense_)
      if (v) f(v);
    for (auto& [k, v] : sparse_) f(v);
  }

 private:
  void grow(uint64_t idx) {
    dense_.resize(std::max<size_t>(idx + 1, dense_.size() * 2));
    for (auto it = sparse_.begin(); it != sparse_.end();)  // entries the vector now covers move into it
      if (it->first < dense_.size()) dense_[it->first] = std::move(it->second), it = sparse_.erase(it);
      else ++it;
  }
  std::vector<ValuePtr> dense_;
  std::unordered_map<uint64_t, ValuePtr> sparse_;
  size_t size_ = 0;
};

// The memo indices a pickle fetches (BINGET, LONG_BINGET), found by walking its opcodes up to STOP
// without building anything, so that a run may keep only those; nullopt when the walk meets what it
// does not size (text GET/PUT of protocol 0, an unknown opcode, a length past the end): the run then
// keeps every entry and reports any damage itself. MEMOIZE numbers as CPython does, by the memo's size.
std::optional<std::vector<bool>> fetched_memo(std::span<const uint8_t> d) {
  std::vector<bool> fetched(d.size() + 1, false), assigned(d.size() + 1, false);
  uint64_t size = 0, pos = 0;
  auto le = [&](int n) -> std::optional<uint64_t> {
    if (pos + static_cast<uint64_t>(n) > d.size()) return std::nullopt;
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= static_cast<uint64_t>(d[pos + k]) << (8 * k);
    pos += static_cast<uint64_t>(n);
    return v;
  };
  auto skip = [&](std::optional<uint64_t> n) { return n && *n <= d.size() - pos ? (pos += *n, true) : false; };
  auto line = [&] {
    const void* nl = std::memchr(d.data() + pos, '\n', d.size() - pos);
    if (!nl) return false;
    pos = static_cast<uint64_t>(static_cast<const uint8_t*>(nl) - d.data()) + 1;
    return true;
  };
  auto put = [&](std::optional<uint64_t> idx) {
    if (!idx || *idx > d.size()) return false;
    if (!assigned[*idx]) assigned[*idx] = true, ++size;
    return true;
  };
  while (pos < d.size()) {
    switch (static_cast<Op>(d[pos++])) {
      case Op::STOP: return fetched;
      case Op::MARK: case Op::POP: case Op::POP_MARK: case Op::DUP: case Op::NONE: case Op::REDUCE:
      case Op::APPEND: case Op::BUILD: case Op::DICT: case Op::EMPTY_DICT: case Op::APPENDS: case Op::LIST:
      case Op::EMPTY_LIST: case Op::OBJ: case Op::SETITEM: case Op::TUPLE: case Op::EMPTY_TUPLE:
      case Op::SETITEMS: case Op::BINPERSID: case Op::NEWOBJ: case Op::TUPLE1: case Op::TUPLE2: case Op::TUPLE3:
      case Op::NEWTRUE: case Op::NEWFALSE: case Op::EMPTY_SET: case Op::ADDITEMS: case Op::FROZENSET:
      case Op::NEWOBJ_EX: case Op::STACK_GLOBAL: break;
      case Op::MEMOIZE: put(size); break;
      case Op::BINPUT: if (!put(le(1))) return std::nullopt; break;
      case Op::LONG_BINPUT: if (!put(le(4))) return std::nullopt; break;
      case Op::BINGET:
      case Op::LONG_BINGET: {
        const auto idx = le(static_cast<Op>(d[pos - 1]) == Op::BINGET ? 1 : 4);
        if (!idx || *idx > d.size()) return std::nullopt;
        fetched[*idx] = true;
        break;
      }
      case Op::PROTO: case Op::BININT1: if (!le(1)) return std::nullopt; break;
      case Op::BININT2: if (!le(2)) return std::nullopt; break;
      case Op::BININT: if (!le(4)) return std::nullopt; break;
      case Op::BINFLOAT: case Op::FRAME: if (!le(8)) return std::nullopt; break;
      case Op::SHORT_BINSTRING: case Op::SHORT_BINUNICODE: case Op::SHORT_BINBYTES: case Op::LONG1:
        if (!skip(le(1))) return std::nullopt;
        break;
      case Op::BINSTRING: case Op::BINUNICODE: case Op::BINBYTES: case Op::LONG4:
        if (!skip(le(4))) return std::nullopt;
        break;
      case Op::BINUNICODE8: case Op::BINBYTES8: case Op::BYTEARRAY8:
        if (!skip(le(8))) return std::nullopt;
        break;
      case Op::INT: case Op::LONG: case Op::FLOAT: case Op::STRING: case Op::UNICODE: case Op::PERSID:
        if (!line()) return std::nullopt;
        break;
      case Op::GLOBAL: case Op::INST:
        if (!line() || !line()) return std::nullopt;
        break;
      default: return std::nullopt;  // GET / PUT (text), EXT*, out-of-band buffers, unknown
    }
  }
  return std::nullopt;
}

// The values only `v` holds (use count 1 as seen from its holder), and their strings: what freeing it
// gives back, as push() counted it (a shared value, held by the memo or another container, counts 0).
uint64_t exclusive_memory(const ValuePtr& v, uint64_t per_value) {
  uint64_t total = 0;
  std::vector<const Value*> todo;
  auto visit = [&](const ValuePtr& c) {
    if (c && c.use_count() == 1) todo.push_back(c.get());
  };
  visit(v);
  while (!todo.empty()) {
    const Value* x = todo.back();
    todo.pop_back();
    total += per_value + x->s.capacity() + x->name.capacity();
    for (const auto& c : x->items) visit(c);
    for (const auto& [k, val] : x->entries) visit(k), visit(val);
    visit(x->dict_state);
    visit(x->tensor_type);
    visit(x->tensor_state);
    if (x->object && x->object.use_count() == 1) {
      const Object& o = *x->object;
      visit(o.callable), visit(o.args), visit(o.kwargs), visit(o.state);
      for (const auto& c : o.list_items) visit(c);
      for (const auto& [k, val] : o.dict_items) visit(k), visit(val);
    }
  }
  return total;
}

class Unpickler {
 public:
  Unpickler(std::span<const uint8_t> data, const std::string& name, const UnpickleOptions& options)
      : d_(data), name_(name), opt_(options) {
    if (opt_.on_dict_items) {
      fetched_ = fetched_memo(d_);
      if (fetched_) assigned_.assign(d_.size() + 1, false);
    }
  }

  // After a failure nothing escapes, so the partial trees are torn down without recursion (they may
  // be very deep or cyclic); after success they are shared with the result and only dropped.
  ~Unpickler() {
    if (succeeded_) return;
    for (auto& v : stack_) release_tree(std::move(v));
    memo_.each([](ValuePtr& v) { release_tree(std::move(v)); });
    for (auto& frame : mark_stack_)
      for (auto& v : frame) release_tree(std::move(v));
  }

  ValuePtr run(size_t* consumed);

 private:
  // One opcode each (run()'s switch; Python's pickle.py load_* of the same names).
  void op_proto();
  void op_long4();
  void op_binfloat();
  void op_binstring();
  void op_tuple1();
  void op_tuple2();
  void op_tuple3();
  void op_dict();
  void op_frozenset();
  void op_append();
  void op_appends();
  void op_setitem();
  void op_setitems();
  void op_additems();
  void op_global();
  void op_stack_global();
  void op_reduce();
  void op_newobj();
  void op_newobj_ex();
  void op_build();
  void op_inst();
  void op_obj();
  void op_put();
  void op_get();
  void op_int();
  void op_long();
  void op_float();

  [[noreturn]] void error(const std::string& what) const {
    fail(name_, "pickle: " + what + " (at byte " + std::to_string(op_pos_) + ")");
  }
  void need(uint64_t n) const {
    if (n > d_.size() - pos_) error("truncated: needs " + std::to_string(n) + " more bytes, " +
                                    std::to_string(d_.size() - pos_) + " left");
  }
  uint8_t u8() {
    need(1);
    return d_[pos_++];
  }
  uint64_t le(int n) {
    need(static_cast<uint64_t>(n));
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= static_cast<uint64_t>(d_[pos_ + k]) << (8 * k);
    pos_ += static_cast<size_t>(n);
    return v;
  }
  std::string take(uint64_t n) {
    need(n);
    std::string s(reinterpret_cast<const char*>(d_.data() + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  // A string as Python decodes it: refused (offset named, bytes not echoed) where Python raises
  // UnicodeDecodeError.
  std::string text(std::string s, const char* opcode, bool surrogatepass) const {
    const size_t bad = invalid_utf8_at(s, surrogatepass);
    if (bad != std::string_view::npos)
      error(std::string("invalid UTF-8 in ") + opcode + " string (byte " + std::to_string(bad) + " of " +
            std::to_string(s.size()) + ")");
    return s;
  }
  std::string line() {
    const uint8_t* start = d_.data() + pos_;
    const void* nl = std::memchr(start, '\n', d_.size() - pos_);
    if (!nl) error("truncated: missing end of line");
    size_t n = static_cast<size_t>(static_cast<const uint8_t*>(nl) - start);
    std::string s(reinterpret_cast<const char*>(start), n);
    pos_ += n + 1;
    if (!s.empty() && s.back() == '\r') s.pop_back();
    return s;
  }

  ValuePtr pop() {
    if (stack_.empty()) error("stack underflow");
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  ValuePtr& top() {
    if (stack_.empty()) error("stack underflow");
    return stack_.back();
  }
  // Memory is counted as values are pushed (20 MB of `}a` pairs, each a dict appended to a
  // list, took 3.3 GB): a new value costs its struct, its control block, its strings and the slot it
  // will take in a container; a shared one (memo, DUP) its slot. Past the budget the pickle is refused.
  static constexpr uint64_t kNewValue = sizeof(Value) + 16 + 2 * sizeof(ValuePtr);
  void push(ValuePtr v) {
    counted_ += v.use_count() == 1 ? kNewValue + v->s.capacity() + v->name.capacity() : 2 * sizeof(ValuePtr);
    if (counted_ > budget()) {
      error("the values it builds take more than " + std::to_string(budget() >> 20) + " MiB (64 MiB + " +
            std::to_string(kMemoryPerByte) + " x its " + std::to_string(d_.size()) +
            " bytes; real checkpoints' pickles take under 30 x): a memory bomb, or damage");
    }
    stack_.push_back(std::move(v));
  }
  static constexpr uint64_t kMemoryPerByte = 48;
  uint64_t budget() const {
    return opt_.max_memory ? opt_.max_memory : (uint64_t{64} << 20) + kMemoryPerByte * static_cast<uint64_t>(d_.size());
  }
  void mark() {
    // Every open MARK becomes a container (or is dropped by POP_MARK): more of them than the nesting
    // limit is refused here, before millions of them (a few bytes of input each) take memory.
    if (mark_stack_.size() >= opt_.max_depth)
      error("more than " + std::to_string(opt_.max_depth) + " MARKs open at once (nesting too deep)");
    mark_stack_.push_back(std::move(stack_));
    stack_.clear();
  }
  std::vector<ValuePtr> pop_mark() {
    if (mark_stack_.empty()) error("MARK expected but not found");
    std::vector<ValuePtr> items = std::move(stack_);
    stack_ = std::move(mark_stack_.back());
    mark_stack_.pop_back();
    return items;
  }
  void memo_put(uint64_t idx) {
    // A pickler numbers memo entries from 0, one per PUT (2+ bytes each): an index beyond the pickle's
    // length comes from damage, and CPython's unpickler (an array sized to the index) fails on it
    // with MemoryError, so torch.load refuses such a file.
    if (idx > d_.size())
      error("memo index " + std::to_string(idx) + " beyond the pickle's " + std::to_string(d_.size()) +
            " bytes (damaged; torch.load fails on it with MemoryError)");
    if (!fetched_) {
      memo_.put(idx, top());
      return;
    }
    // Sparse: only what a later GET fetches is kept; the numbering (MEMOIZE) counts every entry.
    if (!assigned_[idx]) assigned_[idx] = true, ++memo_count_;
    if ((*fetched_)[idx]) memo_.put(idx, top());
  }
  ValuePtr memo_get(uint64_t idx) {
    const ValuePtr* v = memo_.get(idx);
    if (!v) error("memo key " + std::to_string(idx) + " not found");
    return *v;
  }

  ValuePtr global(std::string module, std::string name);
  void check_callable(const ValuePtr& callable, const char* op);
  ValuePtr reduce(ValuePtr callable, ValuePtr args);
  ValuePtr ordered_dict(const std::vector<ValuePtr>& a);
  ValuePtr rebuild_torch_utils(const std::string& n, const std::vector<ValuePtr>& a);
  ValuePtr rebuild_from_type_v2(const ValuePtr& callable, const ValuePtr& args);
  ValuePtr reduce_builtin(const std::string& m, const std::string& n, const std::vector<ValuePtr>& a);
  ValuePtr new_object(ValuePtr cls, ValuePtr args, ValuePtr kwargs, Object::Build how);
  void set_items(Value& target, std::vector<ValuePtr>& kv);
  void append_items(Value& target, std::vector<ValuePtr>& items);
  ValuePtr persistent(ValuePtr pid);
  ValuePtr parse_string_literal(const std::string& text);
  ValuePtr parse_raw_unicode_escape(const std::string& text);
  void validate(const ValuePtr& root);

  std::span<const uint8_t> d_;
  size_t pos_ = 0, op_pos_ = 0;
  bool succeeded_ = false;
  const std::string& name_;
  const UnpickleOptions& opt_;
  std::vector<ValuePtr> stack_;
  std::vector<std::vector<ValuePtr>> mark_stack_;
  Memo memo_;
  std::unordered_map<const Value*, DictIndex> dict_index_;
  uint64_t counted_ = 0;  // memory of the values pushed so far (estimate; push())
  std::optional<std::vector<bool>> fetched_;  // with on_dict_items: the memo indices fetched (sparse memo)
  std::vector<bool> assigned_;               // sparse memo: the indices put so far
  uint64_t memo_count_ = 0;                  // sparse memo: how many (what MEMOIZE numbers by)
};

ValuePtr Unpickler::global(std::string module, std::string name) {
  if (std::string problem = class_path_problem(module, name); !problem.empty())
    error("class " + escaped_brief(module + "." + name) + ": " + problem);
  DType t;
  if (module == "torch" && is_torch_dtype_name(name, t)) return Value::torch_dtype(t);
  return Value::global(std::move(module), std::move(name));
}

ValuePtr Unpickler::persistent(ValuePtr pid) {
  if (!opt_.persistent_load) error("persistent id found but no persistent loader given");
  try {
    return opt_.persistent_load(pid);
  } catch (const Error& e) {
    std::string msg = e.what();
    // Errors from the loader may already name the file.
    if (msg.rfind(name_, 0) == 0) throw;
    error(msg);
  }
}

// Python calls what REDUCE / NEWOBJ name: only a class or function reference (or an object we keep
// opaque, which may be callable) can be one; a list, tuple, number, string, tensor... cannot, and
// torch.load fails on it ("'tuple' object is not callable").
void Unpickler::check_callable(const ValuePtr& callable, const char* op) {
  if (!callable || (callable->kind != Kind::Global && callable->kind != Kind::Object))
    error(std::string(op) + " of a value that cannot be called (not a class or function)");
}

// An object kept as it was built: callable(*args).
ValuePtr opaque_call(ValuePtr callable, ValuePtr args) {
  auto v = make_node<Value>();
  v->kind = Kind::Object;
  v->object = make_node<Object>();
  v->object->callable = std::move(callable);
  v->object->args = std::move(args);
  v->object->build = Object::Build::Reduce;
  return v;
}

ValuePtr Unpickler::reduce(ValuePtr callable, ValuePtr args) {
  check_callable(callable, "REDUCE");
  if (args->kind != Kind::Tuple) error("REDUCE arguments are not a tuple");
  if (callable->kind == Kind::Global) {
    const std::string& m = callable->s;
    const std::string& n = callable->name;
    if (m == "collections" && n == "OrderedDict") return ordered_dict(args->items);
    if (m == "torch._utils")
      if (ValuePtr v = rebuild_torch_utils(n, args->items)) return v;
    if (m == "torch._tensor" && n == "_rebuild_from_type_v2") return rebuild_from_type_v2(callable, args);
    if (const char* what = unsupported_tensor_construct(m, n)) error("unsupported " + std::string(what) + " (" + m + "." + n + ")");
    if (ValuePtr v = reduce_builtin(m, n, args->items)) return v;
  }
  return opaque_call(std::move(callable), std::move(args));
}

// collections.OrderedDict([(key, value), ...]).
ValuePtr Unpickler::ordered_dict(const std::vector<ValuePtr>& a) {
  auto d = Value::dict(true);
  if (!a.empty() && a[0]->is_sequence()) {
    std::vector<ValuePtr> kv;
    for (auto& pair : a[0]->items) {
      if (!pair->is_sequence() || pair->items.size() != 2) error("OrderedDict argument is not a list of pairs");
      kv.push_back(pair->items[0]);
      kv.push_back(pair->items[1]);
    }
    set_items(*d, kv);
  }
  return d;
}

// torch._utils' tensor and parameter rebuilders; nullptr for its other functions.
ValuePtr Unpickler::rebuild_torch_utils(const std::string& n, const std::vector<ValuePtr>& a) {
  if (n == "_rebuild_tensor_v2" || n == "_rebuild_tensor") {
    if (a.size() < 4) error(n + " expects at least 4 arguments");
    if (a[0]->kind != Kind::Tensor) error(n + ": first argument is not a storage");
    // torch sets tensor.requires_grad from it, which refuses anything but a bool.
    if (n == "_rebuild_tensor_v2" && a.size() > 4 && a[4]->kind != Kind::Bool)
      error(n + ": requires_grad is a " + std::string(kind_name(a[4]->kind)) + ", not a bool");
    try {
      Tensor t(a[0]->tensor->storage(), a[1]->as_int(), a[2]->as_shape(), a[3]->as_shape());
      if (a.size() > 4 && a[4]->kind == Kind::Bool) t.requires_grad = a[4]->b;
      return Value::of_tensor(std::move(t));
    } catch (const Error& e) {
      error(std::string("bad tensor: ") + e.what());
    }
  }
  if (n == "_rebuild_tensor_v3") {
    // torch >= 2.1 for the dtypes TypedStorage cannot name (torch/_tensor.py _reduce_ex_internal:
    // storage.UntypedStorage + dtype as the 7th argument; torch/_utils.py _rebuild_tensor_v3).
    if (a.size() < 7) error(n + " expects at least 7 arguments");
    if (a[0]->kind != Kind::Tensor) error(n + ": first argument is not a storage");
    if (a[6]->kind != Kind::Dtype)
      error(n + ": unsupported dtype " + a[6]->repr(1) + " (ucpkit handles " + supported_dtype_names() + ")");
    if (a[4]->kind != Kind::Bool)
      error(n + ": requires_grad is a " + std::string(kind_name(a[4]->kind)) + ", not a bool");
    try {
      auto storage = a[0]->tensor->storage()->reinterpret(a[6]->dtype);
      Tensor t(std::move(storage), a[1]->as_int(), a[2]->as_shape(), a[3]->as_shape());
      t.requires_grad = a[4]->b;
      return Value::of_tensor(std::move(t));
    } catch (const Error& e) {
      error(std::string("bad tensor (") + n + "): " + e.what());
    }
  }
  if (n == "_rebuild_parameter" || n == "_rebuild_parameter_with_state") {
    if (a.size() < 2 || a[0]->kind != Kind::Tensor) error(n + ": first argument is not a tensor");
    if (n == "_rebuild_parameter_with_state" && a.size() < 4) error(n + " expects 4 arguments");
    auto v = Value::of_tensor(*a[0]->tensor);
    v->tensor->is_parameter = true;
    if (a[1]->kind != Kind::Bool)  // torch.Tensor._make_subclass takes a bool
      error(n + ": requires_grad is a " + std::string(kind_name(a[1]->kind)) + ", not a bool");
    v->tensor->requires_grad = a[1]->b;
    // torch/_utils.py _rebuild_parameter_with_state: the 4th argument is the Parameter's Python
    // state (torch/nn/parameter.py Parameter.__reduce_ex__ emits it only when non-empty).
    if (n == "_rebuild_parameter_with_state") v->tensor_state = a[3];
    return v;
  }
  return nullptr;
}

// torch >= 2.0 for a tensor with Python state (torch/_tensor.py Tensor.__reduce_ex__): (func, type,
// args, state); the tensor is func(*args), the state its __dict__ (or a (dict, slots) tuple). func
// is a reference only: it is called here, not by the pickle.
ValuePtr Unpickler::rebuild_from_type_v2(const ValuePtr& callable, const ValuePtr& args) {
  const std::string& n = callable->name;
  const auto& a = args->items;
  if (a.size() != 4) error(n + " expects 4 arguments");
  if (a[0]->kind != Kind::Global) error(n + ": first argument is not a function: " + a[0]->repr(1));
  if (a[1]->kind != Kind::Global) error(n + ": second argument is not a class: " + a[1]->repr(1));
  if (a[2]->kind != Kind::Tuple) error(n + ": third argument is not a tuple");
  // torch never nests it (func comes from _reduce_ex_internal); refusing keeps the recursion below
  // one level however the input is built
  if (a[0]->s == callable->s && a[0]->name == n) error(n + " nested in itself");
  ValuePtr inner = reduce(a[0], a[2]);
  // e.g. a meta tensor (_rebuild_meta_tensor_no_storage) with attributes: kept as it was built
  if (inner->kind != Kind::Tensor) return opaque_call(callable, args);
  auto v = Value::of_tensor(*inner->tensor);
  v->tensor_type = a[1];
  v->tensor_state = a[3];
  return v;
}

// torch.Size, set / frozenset, _codecs.encode (protocol-2 bytes), bytes / bytearray; nullptr for
// anything else.
ValuePtr Unpickler::reduce_builtin(const std::string& m, const std::string& n, const std::vector<ValuePtr>& a) {
  const bool builtins = m == "builtins" || m == "__builtin__";
  if (m == "torch" && n == "Size") {
    if (a.size() != 1 || !a[0]->is_sequence()) error("torch.Size expects one tuple");
    try {
      return Value::torch_size(a[0]->as_shape());
    } catch (const Error& e) {
      error(std::string("bad torch.Size: ") + e.what());
    }
  }
  if (builtins && (n == "set" || n == "frozenset")) {
    auto v = Value::set();
    if (n == "frozenset") v->kind = Kind::FrozenSet;
    if (!a.empty()) {
      if (!a[0]->is_sequence() && a[0]->kind != Kind::Set && a[0]->kind != Kind::FrozenSet)
        error(n + " expects a sequence");
      v->items = a[0]->items;
    }
    return v;
  }
  if (m == "_codecs" && n == "encode" && !a.empty() && a[0]->kind == Kind::Str) {
    std::string out;
    for (uint32_t cp : utf8_code_points(a[0]->s)) {
      if (cp > 0xff) error("_codecs.encode: character outside latin-1");
      out += static_cast<char>(cp);
    }
    return Value::bytes(std::move(out));
  }
  if (builtins && (n == "bytearray" || n == "bytes")) {
    // Python 2-compatible pickles write b'' as __builtin__.bytes() (REDUCE with no arguments).
    if (a.empty()) return Value::bytes({});
    if (a[0]->kind == Kind::Bytes) return Value::bytes(a[0]->s);
  }
  return nullptr;
}

ValuePtr Unpickler::new_object(ValuePtr cls, ValuePtr args, ValuePtr kwargs, Object::Build how) {
  check_callable(cls, "NEWOBJ");
  if (args->kind != Kind::Tuple) error("NEWOBJ arguments are not a tuple");
  if (cls->kind == Kind::Global && cls->s == "collections" && cls->name == "OrderedDict" && args->items.empty())
    return Value::dict(true);
  ValuePtr v = opaque_call(std::move(cls), std::move(args));
  v->object->kwargs = std::move(kwargs);
  v->object->build = how;
  return v;
}

// Up to this many entries a dict's keys are compared in order instead of through an index.
constexpr size_t kSmallDict = 16;

void Unpickler::set_items(Value& target, std::vector<ValuePtr>& kv) {
  if (kv.size() % 2) error("SETITEMS with an odd number of items");
  if (target.kind == Kind::Object) {
    for (size_t k = 0; k < kv.size(); k += 2) target.object->dict_items.emplace_back(kv[k], kv[k + 1]);
    return;
  }
  if (target.kind != Kind::Dict) error("SETITEM on a " + std::string(kind_name(target.kind)));
  if (opt_.on_dict_items) {
    std::vector<ValuePtr> dropped;
    opt_.on_dict_items(kv, dropped);
    for (ValuePtr& v : dropped) {
      counted_ -= std::min(counted_, exclusive_memory(v, kNewValue));
      v.reset();
    }
  }
  // A small dict (a checkpoint's metadata holds one or more per tensor) compares its keys in order, without
  // an index of its own (an index per dict was most of the parse's allocations on 10^5 tensors); a larger one
  // keeps its index across SETITEMS batches.
  const bool small = target.entries.size() + kv.size() / 2 <= kSmallDict && !dict_index_.contains(&target);
  DictIndex* index = small ? nullptr : &dict_index_[&target];
  if (!small && index->size() != target.entries.size()) {
    index->clear();
    for (size_t k = 0; k < target.entries.size(); ++k) index->insert(key_hash(key_view(*target.entries[k].first)), k);
  }
  for (size_t k = 0; k < kv.size(); k += 2) {
    const KeyView key = key_view(*kv[k]);
    if (!key.cls) error("unhashable dict key of type " + std::string(kind_name(kv[k]->kind)));
    auto same = [&](size_t e) { return same_key(key_view(*target.entries[e].first), key); };
    size_t at = DictIndex::npos;
    uint64_t h = 0;
    if (small) {
      for (size_t e = 0; e < target.entries.size() && at == DictIndex::npos; ++e)
        if (same(e)) at = e;
    } else {
      h = key_hash(key);
      at = index->find(h, same);
    }
    if (at != DictIndex::npos) {
      target.entries[at].second = kv[k + 1];
      continue;
    }
    if (!small) index->insert(h, target.entries.size());
    target.entries.emplace_back(kv[k], kv[k + 1]);
  }
}

void Unpickler::append_items(Value& target, std::vector<ValuePtr>& items) {
  if (target.kind == Kind::List) {
    target.items.insert(target.items.end(), items.begin(), items.end());
  } else if (target.kind == Kind::Object) {
    target.object->list_items.insert(target.object->list_items.end(), items.begin(), items.end());
  } else {
    error("APPEND on a " + std::string(kind_name(target.kind)));
  }
}

ValuePtr Unpickler::parse_string_literal(const std::string& text) {
  if (text.size() < 2 || (text.front() != '\'' && text.front() != '"') || text.back() != text.front())
    error("STRING argument is not a quoted string");
  std::string out;
  for (size_t k = 1; k + 1 < text.size(); ++k) {
    char c = text[k];
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++k + 1 > text.size() - 1) error("bad escape in STRING");
    char e = text[k];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'x': {
        if (k + 2 >= text.size() || !std::isxdigit(static_cast<unsigned char>(text[k + 1])) ||
            !std::isxdigit(static_cast<unsigned char>(text[k + 2])))
          error("bad \\x escape in STRING");
        out += static_cast<char>(std::strtol(text.substr(k + 1, 2).c_str(), nullptr, 16));
        k += 2;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = 0, n = 0;
          while (n < 3 && k < text.size() - 1 && text[k] >= '0' && text[k] <= '7') v = v * 8 + (text[k++] - '0'), ++n;
          --k;
          out += static_cast<char>(v & 0xff);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return Value::str(std::move(out));
}

ValuePtr Unpickler::parse_raw_unicode_escape(const std::string& text) {
  std::string out;
  for (size_t k = 0; k < text.size(); ++k) {
    uint8_t c = static_cast<uint8_t>(text[k]);
    if (c == '\\' && k + 1 < text.size() && (text[k + 1] == 'u' || text[k + 1] == 'U')) {
      size_t n = text[k + 1] == 'u' ? 4 : 8;
      if (k + 2 + n > text.size()) error("bad \\u escape in UNICODE");
      uint32_t cp = 0;
      for (size_t j = 0; j < n; ++j) {
        char h = text[k + 2 + j];
        int v = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (v < 0) error("bad hex digit in UNICODE escape");
        cp = cp * 16 + static_cast<uint32_t>(v);
      }
      if (cp > 0x10FFFF) error("code point out of range in UNICODE");
      append_utf8(out, cp);
      k += 1 + n;
    } else {
      append_utf8(out, c);
    }
  }
  return Value::str(std::move(out));
}

ValuePtr Unpickler::run(size_t* consumed) {
  while (true) {
    op_pos_ = pos_;
    const uint8_t byte = u8();
    switch (static_cast<Op>(byte)) {
      case Op::PROTO: op_proto(); break;
      case Op::FRAME: le(8); break;  // a length hint only
      case Op::STOP: {
        ValuePtr result = top();  // stays on the stack while validated: a failed tree is freed safely
        if (consumed) *consumed = pos_;
        validate(result);
        stack_.pop_back();
        succeeded_ = true;
        return result;
      }
      case Op::MARK: mark(); break;
      case Op::EMPTY_TUPLE: push(Value::tuple()); break;
      case Op::EMPTY_LIST: push(Value::list()); break;
      case Op::EMPTY_DICT: push(Value::dict()); break;
      case Op::EMPTY_SET: push(Value::set()); break;
      case Op::NONE: push(Value::none()); break;
      case Op::NEWTRUE: push(Value::boolean(true)); break;
      case Op::NEWFALSE: push(Value::boolean(false)); break;
      case Op::BININT: push(Value::integer(static_cast<int32_t>(le(4)))); break;
      case Op::BININT1: push(Value::integer(u8())); break;
      case Op::BININT2: push(Value::integer(static_cast<int64_t>(le(2)))); break;
      case Op::LONG1: push(make_long(take(u8()))); break;
      case Op::LONG4: op_long4(); break;
      case Op::BINFLOAT: op_binfloat(); break;
      case Op::BINUNICODE: push(Value::str(text(take(le(4)), "BINUNICODE", true))); break;
      case Op::SHORT_BINUNICODE: push(Value::str(text(take(u8()), "SHORT_BINUNICODE", true))); break;
      case Op::BINUNICODE8: push(Value::str(text(take(le(8)), "BINUNICODE8", true))); break;
      case Op::BINSTRING: op_binstring(); break;
      case Op::SHORT_BINSTRING: push(Value::str(text(take(u8()), "SHORT_BINSTRING", false))); break;
      case Op::BINBYTES: push(Value::bytes(take(le(4)))); break;
      case Op::SHORT_BINBYTES: push(Value::bytes(take(u8()))); break;
      case Op::BINBYTES8: push(Value::bytes(take(le(8)))); break;
      case Op::BYTEARRAY8: push(Value::bytes(take(le(8)))); break;
      case Op::TUPLE1: op_tuple1(); break;
      case Op::TUPLE2: op_tuple2(); break;
      case Op::TUPLE3: op_tuple3(); break;
      case Op::TUPLE: push(Value::tuple(pop_mark())); break;
      case Op::LIST: push(Value::list(pop_mark())); break;
      case Op::DICT: op_dict(); break;
      case Op::FROZENSET: op_frozenset(); break;
      case Op::APPEND: op_append(); break;
      case Op::APPENDS: op_appends(); break;
      case Op::SETITEM: op_setitem(); break;
      case Op::SETITEMS: op_setitems(); break;
      case Op::ADDITEMS: op_additems(); break;
      case Op::GLOBAL: op_global(); break;
      case Op::STACK_GLOBAL: op_stack_global(); break;
      case Op::REDUCE: op_reduce(); break;
      case Op::NEWOBJ: op_newobj(); break;
      case Op::NEWOBJ_EX: op_newobj_ex(); break;
      case Op::BUILD: op_build(); break;
      case Op::INST: op_inst(); break;
      case Op::OBJ: op_obj(); break;
      case Op::BINPUT: memo_put(u8()); break;
      case Op::LONG_BINPUT: memo_put(le(4)); break;
      case Op::PUT: op_put(); break;
      case Op::MEMOIZE: memo_put(fetched_ ? memo_count_ : memo_.size()); break;
      case Op::BINGET: push(memo_get(u8())); break;
      case Op::LONG_BINGET: push(memo_get(le(4))); break;
      case Op::GET: op_get(); break;
      case Op::BINPERSID: push(persistent(pop())); break;
      case Op::PERSID: push(persistent(Value::str(line()))); break;
      case Op::POP: pop(); break;
      case Op::POP_MARK: pop_mark(); break;
      case Op::DUP: push(top()); break;
      case Op::INT: op_int(); break;
      case Op::LONG: op_long(); break;
      case Op::FLOAT: op_float(); break;
      case Op::STRING: push(parse_string_literal(line())); break;
      case Op::UNICODE: push(parse_raw_unicode_escape(line())); break;
      case Op::EXT1:
      case Op::EXT2:
      case Op::EXT4: error("extension registry opcodes (EXT1/2/4) are not supported");
      case Op::NEXT_BUFFER:
      case Op::READONLY_BUFFER: error("out-of-band buffers (protocol 5) are not supported");
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", byte);
        error(std::string("unknown opcode ") + hex);
      }
    }
  }
}

// The opcodes whose handling takes more than a line (run() dispatches).
void Unpickler::op_proto() {
  uint8_t proto = u8();
  if (proto > 5) error("unsupported pickle protocol " + std::to_string(proto));
}

void Unpickler::op_long4() {
  int64_t n = static_cast<int32_t>(le(4));
  if (n < 0) error("negative LONG4 length");
  push(make_long(take(static_cast<uint64_t>(n))));
}

void Unpickler::op_binfloat() {
  uint64_t bits = 0;
  need(8);
  for (int k = 0; k < 8; ++k) bits = (bits << 8) | d_[pos_ + k];
  pos_ += 8;
  push(Value::real(std::bit_cast<double>(bits)));
}

void Unpickler::op_binstring() {
  int64_t n = static_cast<int32_t>(le(4));
  if (n < 0) error("negative BINSTRING length");
  push(Value::str(text(take(static_cast<uint64_t>(n)), "BINSTRING", false)));
}

void Unpickler::op_tuple1() {
  auto a = pop();
  push(Value::tuple({a}));
}

void Unpickler::op_tuple2() {
  auto b = pop();
  auto a = pop();
  push(Value::tuple({a, b}));
}

void Unpickler::op_tuple3() {
  auto c = pop();
  auto b = pop();
  auto a = pop();
  push(Value::tuple({a, b, c}));
}

void Unpickler::op_dict() {
  auto kv = pop_mark();
  auto dct = Value::dict();
  set_items(*dct, kv);
  push(dct);
}

void Unpickler::op_frozenset() {
  auto v = Value::set(pop_mark());
  v->kind = Kind::FrozenSet;
  push(v);
}

void Unpickler::op_append() {
  auto item = pop();
  std::vector<ValuePtr> items{item};
  append_items(*top(), items);
}

void Unpickler::op_appends() {
  auto items = pop_mark();
  append_items(*top(), items);
}

void Unpickler::op_setitem() {
  auto v = pop();
  auto k = pop();
  std::vector<ValuePtr> kv{k, v};
  set_items(*top(), kv);
}

void Unpickler::op_setitems() {
  auto kv = pop_mark();
  set_items(*top(), kv);
}

void Unpickler::op_additems() {
  auto items = pop_mark();
  Value& s = *top();
  if (s.kind != Kind::Set) error("ADDITEMS on a " + std::string(kind_name(s.kind)));
  s.items.insert(s.items.end(), items.begin(), items.end());
}

void Unpickler::op_global() {
  std::string module = text(line(), "GLOBAL", false);
  std::string name = text(line(), "GLOBAL", false);
  push(global(std::move(module), std::move(name)));
}

void Unpickler::op_stack_global() {
  auto name = pop();
  auto module = pop();
  if (module->kind != Kind::Str || name->kind != Kind::Str) error("STACK_GLOBAL expects two strings");
  push(global(module->s, name->s));
}

void Unpickler::op_reduce() {
  auto args = pop();
  auto callable = pop();
  push(reduce(std::move(callable), std::move(args)));
}

void Unpickler::op_newobj() {
  auto args = pop();
  auto cls = pop();
  push(new_object(std::move(cls), std::move(args), nullptr, Object::Build::NewObj));
}

void Unpickler::op_newobj_ex() {
  auto kwargs = pop();
  auto args = pop();
  auto cls = pop();
  push(new_object(std::move(cls), std::move(args), std::move(kwargs), Object::Build::NewObjEx));
}

void Unpickler::op_build() {
  auto state = pop();
  Value& obj = *top();
  if (obj.kind == Kind::Object) {
    obj.object->state = std::move(state);
  } else if (obj.kind == Kind::Dict && !state->is_none()) {
    obj.dict_state = std::move(state);  // e.g. OrderedDict._metadata of a state_dict
  } else if (!state->is_none() && obj.kind != Kind::Tensor && obj.kind != Kind::Dict) {
    error("BUILD on a " + std::string(kind_name(obj.kind)));
  }
}

void Unpickler::op_inst() {
  std::string module = line();
  std::string name = line();
  auto args = Value::tuple(pop_mark());
  push(reduce(global(std::move(module), std::move(name)), std::move(args)));
}

void Unpickler::op_obj() {
  auto items = pop_mark();
  if (items.empty()) error("OBJ without a class");
  auto cls = items.front();
  auto args = Value::tuple(std::vector<ValuePtr>(items.begin() + 1, items.end()));
  push(reduce(std::move(cls), std::move(args)));
}

void Unpickler::op_put() {
  std::string l = line();
  char* end = nullptr;
  uint64_t idx = std::strtoull(l.c_str(), &end, 10);
  if (l.empty() || *end) error("bad PUT index");
  memo_put(idx);
}

void Unpickler::op_get() {
  std::string l = line();
  char* end = nullptr;
  uint64_t idx = std::strtoull(l.c_str(), &end, 10);
  if (l.empty() || *end) error("bad GET index");
  push(memo_get(idx));
}

void Unpickler::op_int() {
  std::string l = line();
  if (l == "00") {
    push(Value::boolean(false));
  } else if (l == "01") {
    push(Value::boolean(true));
  } else {
    bool ok;
    std::string b = decimal_to_twos_complement(l, ok);
    if (!ok) error("bad INT literal");
    push(make_long(std::move(b)));
  }
}

void Unpickler::op_long() {
  std::string l = line();
  if (!l.empty() && l.back() == 'L') l.pop_back();
  bool ok;
  std::string b = decimal_to_twos_complement(l, ok);
  if (!ok) error("bad LONG literal");
  push(make_long(std::move(b)));
}

void Unpickler::op_float() {
  std::string l = line();
  char* end = nullptr;
  double v = std::strtod(l.c_str(), &end);
  if (l.empty() || *end) error("bad FLOAT literal");
  push(Value::real(v));
}

// Rejects reference cycles and trees nested deeper than the limit (iterative: no recursion).
void Unpickler::validate(const ValuePtr& root) {
  std::unordered_map<const Value*, uint32_t> state;  // 1 = on path, 2 + depth = done
  struct Frame {
    const Value* v;
    std::vector<const Value*> children;
    size_t next = 0;
    uint32_t depth = 0;
  };
  auto children_of = [](const Value* v) {
    std::vector<const Value*> c;
    for (auto& it : v->items) c.push_back(it.get());
    for (auto& [k, val] : v->entries) {
      c.push_back(k.get());
      c.push_back(val.get());
    }
    if (v->dict_state) c.push_back(v->dict_state.get());
    if (v->tensor_type) c.push_back(v->tensor_type.get());
    if (v->tensor_state) c.push_back(v->tensor_state.get());
    if (v->object) {
      for (auto* p : {v->object->callable.get(), v->object->args.get(), v->object->kwargs.get(), v->object->state.get()})
        if (p) c.push_back(p);
      for (auto& it : v->object->list_items) c.push_back(it.get());
      for (auto& [k, val] : v->object->dict_items) {
        c.push_back(k.get());
        c.push_back(val.get());
      }
    }
    return c;
  };
  std::vector<Frame> path;
  path.push_back({root.get(), children_of(root.get())});
  state[root.get()] = 1;
  while (!path.empty()) {
    Frame& f = path.back();
    if (f.next < f.children.size()) {
      const Value* c = f.children[f.next++];
      auto it = state.find(c);
      if (it == state.end()) {
        if (path.size() >= opt_.max_depth) error("nesting deeper than " + std::to_string(opt_.max_depth) + " levels");
        state[c] = 1;
        path.push_back({c, children_of(c)});
      } else if (it->second == 1) {
        error("reference cycle in the pickled data (not supported)");
      } else {
        f.depth = std::max(f.depth, it->second - 2 + 1);
      }
      continue;
    }
    uint32_t depth = f.depth;
    state[f.v] = 2 + depth;
    path.pop_back();
    if (!path.empty()) path.back().depth = std::max(path.back().depth, depth + 1);
    if (depth >= opt_.max_depth) error("nesting deeper than " + std::to_string(opt_.max_depth) + " levels");
  }
}

}  // namespace

ValuePtr unpickle(std::span<const uint8_t> data, const std::string& name, const UnpickleOptions& options,
                  size_t* consumed) {
  Unpickler u(data, name, options);
  return u.run(consumed);
}

}  // namespace ucpkit::pickle
