// Protocol-2 pickler for Value trees.
#include "io/pickle/pickler.h"

#include <bit>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "core/name_table.h"
#include "io/pickle/opcodes.h"

namespace ucpkit::pickle {
namespace detail {

class Pickler {
 public:
  explicit Pickler(const PickleOptions& options) : opt_(options) {}

  std::string run(const ValuePtr& root) {
    begin();
    save(root);
    return end();
  }
  void begin() {
    op(Op::PROTO);
    emit(static_cast<char>(2));  // the protocol
  }
  std::string end() {
    op(Op::STOP);
    flush();
    return std::move(out_);
  }
  void op(Op o) { emit(op_char(o)); }
  void reserve(size_t bytes, size_t texts) {
    out_.reserve(bytes);
    texts_.reserve(texts);
    strs_.reserve(texts);
  }
  std::string_view so_far() {
    flush();
    return out_;
  }
  // PickleStream: containers and objects saved meanwhile are not memoized (see pickler.h).
  bool transient = false;
  void boolean(bool b) { op(b ? Op::NEWTRUE : Op::NEWFALSE); }
  void u32(uint32_t v) {
    const char b[4] = {static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff),
                       static_cast<char>((v >> 16) & 0xff), static_cast<char>((v >> 24) & 0xff)};
    emit(b, 4);
  }
  // An opcode and its one-byte or four-byte argument, emitted at once (most of a DCP `.metadata` is memo puts and
  // gets).
  void op1(Op o, uint8_t arg) {
    const char b[2] = {op_char(o), static_cast<char>(arg)};
    emit(b, 2);
  }
  void op4(Op o, uint32_t arg) {
    const char b[5] = {op_char(o), static_cast<char>(arg & 0xff), static_cast<char>((arg >> 8) & 0xff),
                       static_cast<char>((arg >> 16) & 0xff), static_cast<char>((arg >> 24) & 0xff)};
    emit(b, 5);
  }
  // Memoized values are kept alive: a freed temporary's address must never match a later value.
  void memoize(const ValuePtr& p) {
    if (transient && p.use_count() == 1) return;  // only its container holds it: never met again
    keep_.push_back(p);
    memo_[p.get()] = put();
  }
  // Stores the top of the stack under the next memo index, which it returns.
  uint64_t put() {
    const uint64_t idx = next_memo_++;
    if (idx < 256) op1(Op::BINPUT, static_cast<uint8_t>(idx));
    else op4(Op::LONG_BINPUT, static_cast<uint32_t>(idx));
    return idx;
  }
  void get(uint64_t idx) {
    if (idx < 256) op1(Op::BINGET, static_cast<uint8_t>(idx));
    else op4(Op::LONG_BINGET, static_cast<uint32_t>(idx));
  }
  // Kinds save() never memoizes: no memo lookup for them (most values of a DCP `.metadata` are ints).
  static bool memoizable(Kind k) {
    return k != Kind::None && k != Kind::Bool && k != Kind::Int && k != Kind::BigInt && k != Kind::Float &&
           k != Kind::Dtype;
  }
  bool get_memo(const Value* v) {
    auto it = memo_.find(v);
    if (it == memo_.end()) return false;
    get(it->second);
    return true;
  }
  void global(std::string_view module, std::string_view name) {
    std::string key;
    if (opt_.memoize_repeats) {
      key = std::string(module) + '\n' + std::string(name);
      if (auto it = globals_.find(key); it != globals_.end()) return get(it->second);
    }
    op(Op::GLOBAL);
    emit(module);
    emit('\n');
    emit(name);
    emit('\n');
    if (opt_.memoize_repeats) globals_.emplace(std::move(key), put());
  }
  static constexpr size_t kUnicodeHead = 5;  // BINUNICODE and its 4-byte length, before the text
  void unicode(std::string_view s) {
    op4(Op::BINUNICODE, static_cast<uint32_t>(s.size()));
    emit(s);
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op1(Op::BININT1, static_cast<uint8_t>(v));
    } else if (v >= 0 && v < 65536) {
      const char b[3] = {op_char(Op::BININT2), static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
      emit(b, 3);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op4(Op::BININT, static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {
      std::string bytes;
      uint64_t u = static_cast<uint64_t>(v);
      for (int k = 0; k < 8; ++k) bytes += static_cast<char>((u >> (8 * k)) & 0xff);
      while (bytes.size() > 1) {
        uint8_t last = static_cast<uint8_t>(bytes.back()), prev = static_cast<uint8_t>(bytes[bytes.size() - 2]);
        if ((last == 0 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80)))
          bytes.pop_back();
        else
          break;
      }
      long_bytes(bytes);
    }
  }
  void long_bytes(const std::string& bytes) {
    if (bytes.size() < 256) {
      op(Op::LONG1);
      emit(static_cast<char>(bytes.size()));
    } else {
      op(Op::LONG4);
      u32(static_cast<uint32_t>(bytes.size()));
    }
    emit(bytes);
  }
  void empty_ordered_dict() {
    global("collections", "OrderedDict");
    op(Op::EMPTY_TUPLE);
    op(Op::REDUCE);
  }
  // A tuple of n items, each written by item(k) between tuple_begin and tuple_end: EMPTY_TUPLE, TUPLE1-3, or
  // MARK ... TUPLE.
  void tuple_begin(size_t n) {
    if (n > 3) op(Op::MARK);
  }
  void tuple_end(size_t n) {
    static constexpr Op kTupleN[] = {Op::EMPTY_TUPLE, Op::TUPLE1, Op::TUPLE2, Op::TUPLE3};
    op(n > 3 ? Op::TUPLE : kTupleN[n]);
  }
  template <class Item>
  void tuple_n(size_t n, const Item& item) {
    tuple_begin(n);
    for (size_t k = 0; k < n; ++k) item(k);
    tuple_end(n);
  }
  void tuple_of(const std::vector<ValuePtr>& items) {
    tuple_n(items.size(), [&](size_t k) { save(items[k]); });
  }
  // Without a value per int (a shape is in every tensor's record, three in each chunk of a DCP `.metadata`).
  void int_tuple(std::span<const int64_t> v) {
    tuple_n(v.size(), [&](size_t k) { integer(v[k]); });
  }
  void appends(const std::vector<ValuePtr>& items) {
    for (size_t start = 0; start < items.size(); start += 1000) {
      size_t end = std::min(items.size(), start + 1000);
      if (end - start == 1) {
        save(items[start]);
        op(Op::APPEND);
        continue;
      }
      op(Op::MARK);
      for (size_t k = start; k < end; ++k) save(items[k]);
      op(Op::APPENDS);
    }
  }
  void setitems(const std::vector<Entry>& entries) {
    for (size_t start = 0; start < entries.size(); start += 1000) {
      size_t end = std::min(entries.size(), start + 1000);
      if (end - start == 1) {
        save(entries[start].first);
        save(entries[start].second);
        op(Op::SETITEM);
        continue;
      }
      op(Op::MARK);
      for (size_t k = start; k < end; ++k) {
        save(entries[k].first);
        save(entries[k].second);
      }
      op(Op::SETITEMS);
    }
  }
  // A tensor as torch.save writes it: _rebuild_tensor_v2(storage, offset, size, stride,
  // requires_grad, OrderedDict()), inside _rebuild_parameter(data, requires_grad, OrderedDict()) for
  // a Parameter. With Python state (torch >= 2.0, torch/_tensor.py Tensor.__reduce_ex__ and
  // torch/nn/parameter.py Parameter.__reduce_ex__) the record read is re-emitted:
  // _rebuild_from_type_v2(_rebuild_tensor_v2, type, args, state) or
  // _rebuild_parameter_with_state(data, requires_grad, OrderedDict(), state).
  void tensor(const Value& v) {
    const Tensor& t = *v.tensor;
    if (!opt_.storage_id) throw Error("pickler: tensors need a storage writer");
    const bool from_type = v.tensor_type != nullptr;
    const bool param_state = !from_type && t.is_parameter && v.tensor_state;
    if (from_type) {
      global("torch._tensor", "_rebuild_from_type_v2");
      op(Op::MARK);
      global("torch._utils", "_rebuild_tensor_v2");
      save(v.tensor_type);
    } else if (t.is_parameter) {
      global("torch._utils", param_state ? "_rebuild_parameter_with_state" : "_rebuild_parameter");
      op(Op::MARK);
      global("torch._utils", "_rebuild_tensor_v2");
    } else {
      global("torch._utils", "_rebuild_tensor_v2");
    }
    op(Op::MARK);
    save(opt_.storage_id(t.storage()));
    op(Op::BINPERSID);
    integer(t.storage_offset());
    int_tuple(t.shape());
    int_tuple(t.strides());
    boolean(t.requires_grad && !t.is_parameter);
    empty_ordered_dict();
    op(Op::TUPLE);
    if (from_type) {  // args stay a tuple: func(*args) is called by _rebuild_from_type_v2
      save(v.tensor_state ? v.tensor_state : Value::dict());
      op(Op::TUPLE);
      op(Op::REDUCE);
      return;
    }
    op(Op::REDUCE);
    if (t.is_parameter) {
      boolean(t.requires_grad);
      empty_ordered_dict();
      if (param_state) save(v.tensor_state);
      op(Op::TUPLE);
      op(Op::REDUCE);
    }
  }
  void object(const ValuePtr& p) {
    const Value& v = *p;
    const Object& o = *v.object;
    switch (o.build) {
      case Object::Build::Reduce:
        save(o.callable);
        save(o.args ? o.args : Value::tuple());
        op(Op::REDUCE);
        break;
      case Object::Build::NewObj:
        save(o.callable);
        save(o.args ? o.args : Value::tuple());
        op(Op::NEWOBJ);
        break;
      case Object::Build::NewObjEx:  // protocol 2 has no NEWOBJ_EX: copyreg.__newobj_ex__(cls, args, kwargs)
        global("copyreg", "__newobj_ex__");
        save(o.callable);
        save(o.args ? o.args : Value::tuple());
        save(o.kwargs ? o.kwargs : Value::dict());
        op(Op::TUPLE3);
        op(Op::REDUCE);
        break;
    }
    memoize(p);
    if (!o.list_items.empty()) appends(o.list_items);
    if (!o.dict_items.empty()) setitems(o.dict_items);
    if (o.state) {
      save(o.state);
      op(Op::BUILD);
    }
  }

  // torch.Size(dims) without its memo entry.
  void size(std::span<const int64_t> dims) {
    if (size_memo_) {
      get(*size_memo_);  // most values of a DCP `.metadata` are torch.Size: its memo looked up once
    } else {
      global("torch", "Size");
      if (opt_.memoize_repeats) size_memo_ = globals_.at("torch\nSize");
    }
    int_tuple(dims);
    op(Op::TUPLE1);
    op(Op::REDUCE);
  }
  // PickleStream::str: a Str value the caller shares (always memoized), keyed by its text.
  uint64_t shared_str(std::string_view s) {
    auto text_of = [this](uint32_t k) { return written(texts_[k].at, texts_[k].size); };
    if (s.size() > UINT32_MAX || texts_.size() >= UINT32_MAX - 1)
      throw Error("pickler: too many or too long shared texts");
    // Added where unicode() is about to write it (after its head) under the memo index put() is about to give: one
    // probe of the table, which finds a text written before (then the entry is taken back).
    texts_.push_back({out_.size() + pending_ + kUnicodeHead, static_cast<uint32_t>(s.size()), next_memo_});
    if (const auto k = strs_.add(s, static_cast<uint32_t>(texts_.size() - 1), text_of)) {
      texts_.pop_back();
      get(texts_[*k].memo);
      return texts_[*k].memo;
    }
    unicode(s);
    return put();
  }
  // PickleStream::global_value: what save() writes for a Global value the caller shares.
  uint64_t global_value(std::string_view module, std::string_view name) {
    std::string key = std::string(module) + '\n' + std::string(name);
    if (auto it = global_values_.find(key); it != global_values_.end()) {
      get(it->second);
      return it->second;
    }
    global(module, name);
    const uint64_t idx = put();
    global_values_.emplace(std::move(key), idx);
    return idx;
  }
  // PickleStream::save_shared: save() of a value kept by the caller; its memo index.
  uint64_t save_shared(const ValuePtr& p) {
    save(p);
    const auto it = memo_.find(p.get());
    if (it == memo_.end()) throw Error("pickler: a shared value of a kind never memoized");
    return it->second;
  }

  void save(const ValuePtr& p) {
    if (!p) throw Error("pickler: null value");
    const Value& v = *p;
    if (memoizable(v.kind) && get_memo(&v)) return;
    if (++depth_ > 2000) throw Error("pickler: structure nested too deeply");
    switch (v.kind) {
      case Kind::None: op(Op::NONE); break;
      case Kind::Bool: boolean(v.b); break;
      case Kind::Int: integer(v.i); break;
      case Kind::BigInt: long_bytes(v.s); break;
      case Kind::Float: {
        op(Op::BINFLOAT);
        uint64_t bits = std::bit_cast<uint64_t>(v.f);
        for (int k = 7; k >= 0; --k) emit(static_cast<char>((bits >> (8 * k)) & 0xff));
        break;
      }
      case Kind::Str:
        unicode(v.s);
        if (opt_.memoize_repeats) memoize(p);
        break;
      case Kind::Bytes: {
        // Python 3 pickles bytes at protocol 2 as _codecs.encode(<latin-1 text>, 'latin1').
        global("_codecs", "encode");
        std::string text;
        for (unsigned char c : v.s) {
          if (c < 0x80) {
            text += static_cast<char>(c);
          } else {
            text += static_cast<char>(0xC0 | (c >> 6));
            text += static_cast<char>(0x80 | (c & 0x3F));
          }
        }
        unicode(text);
        unicode("latin1");
        op(Op::TUPLE2);
        op(Op::REDUCE);
        memoize(p);
        break;
      }
      case Kind::Tuple:
        tuple_of(v.items);
        memoize(p);
        break;
      case Kind::List:
        op(Op::EMPTY_LIST);
        memoize(p);
        appends(v.items);
        break;
      case Kind::Dict:
        if (v.ordered)
          empty_ordered_dict();
        else
          op(Op::EMPTY_DICT);
        memoize(p);
        setitems(v.entries);
        if (v.dict_state) {  // OrderedDict attributes (a state_dict's _metadata) via BUILD
          save(v.dict_state);
          op(Op::BUILD);
        }
        break;
      case Kind::Set:
      case Kind::FrozenSet:
        global("builtins", v.kind == Kind::Set ? "set" : "frozenset");
        op(Op::EMPTY_LIST);
        appends(v.items);
        op(Op::TUPLE1);
        op(Op::REDUCE);
        memoize(p);
        break;
      case Kind::Shape:
        size(v.shape);
        memoize(p);
        break;
      case Kind::Dtype: global("torch", dtype_name(v.dtype)); break;
      case Kind::Tensor:
        tensor(v);
        memoize(p);
        break;
      case Kind::Global:
        global(v.s, v.name);
        memoize(p);
        break;
      case Kind::Object: object(p); break;
    }
    --depth_;
  }


 private:
  const PickleOptions& opt_;
  std::string out_;
  // Bytes on their way to out_, copied in inline and appended 512 at a time (a std::string::append call for each
  // opcode and argument: 28% more instructions pickling a 100,000-tensor `.metadata`).
  void emit(const char* p, size_t n) {
    if (pending_ + n > sizeof(next_)) {
      flush();
      if (n > sizeof(next_)) return void(out_.append(p, n));
    }
    std::memcpy(next_ + pending_, p, n);
    pending_ += n;
  }
  void emit(std::string_view s) { emit(s.data(), s.size()); }
  void emit(char c) {
    if (pending_ == sizeof(next_)) flush();
    next_[pending_++] = c;
  }
  void flush() {
    out_.append(next_, pending_);
    pending_ = 0;
  }
  // Bytes [at, at + n) of the pickle so far, in out_ or still in next_ (emit never splits a piece between them).
  std::string_view written(uint64_t at, size_t n) const {
    if (at + n <= out_.size()) return {out_.data() + at, n};
    return {next_ + (at - out_.size()), n};
  }
  char next_[512];
  size_t pending_ = 0;
  std::unordered_map<const Value*, uint64_t> memo_;
  std::unordered_map<std::string, uint64_t> globals_;  // memoize_repeats: "module\nname" -> memo index
  std::optional<uint64_t> size_memo_;                  // memoize_repeats: torch.Size's memo index once written
  // shared_str: each text found by its bytes where it was written into out_ (10^5 fqns of a DCP `.metadata` were as
  // many copies and hash nodes), with its memo index.
  struct Text {
    uint64_t at;
    uint32_t size;
    uint64_t memo;
  };
  std::vector<Text> texts_;
  NameTable strs_;
  std::unordered_map<std::string, uint64_t> global_values_;  // global_value: "module\nname" -> the value's memo index
  uint64_t next_memo_ = 0;
  std::vector<ValuePtr> keep_;
  int depth_ = 0;
};

}  // namespace detail

std::string pickle(const ValuePtr& root, const PickleOptions& options) {
  detail::Pickler p(options);
  return p.run(root);
}

PickleStream::PickleStream(const PickleOptions& options) : p_(std::make_unique<detail::Pickler>(options)) { p_->begin(); }
PickleStream::~PickleStream() = default;
void PickleStream::save(const ValuePtr& value, bool transient) {
  p_->transient = transient;
  p_->save(value);
  p_->transient = false;
}
void PickleStream::op(Op o) { p_->op(o); }
void PickleStream::str(std::string_view s) { p_->shared_str(s); }
void PickleStream::str(std::string_view s, MemoRef& ref) {
  if (ref.index != UINT64_MAX) return p_->get(ref.index);
  ref.index = p_->shared_str(s);
}
void PickleStream::global_value(std::string_view module, std::string_view name, MemoRef& ref) {
  if (ref.index != UINT64_MAX) return p_->get(ref.index);
  ref.index = p_->global_value(module, name);
}
void PickleStream::save_shared(const ValuePtr& value, MemoRef& ref) {
  if (ref.index != UINT64_MAX) return p_->get(ref.index);
  ref.index = p_->save_shared(value);
}
void PickleStream::tuple_begin(size_t n) { p_->tuple_begin(n); }
void PickleStream::tuple_end(size_t n) { p_->tuple_end(n); }
void PickleStream::integer(int64_t v) { p_->integer(v); }
void PickleStream::size(std::span<const int64_t> dims) { p_->size(dims); }
std::string PickleStream::finish() { return p_->end(); }
void PickleStream::reserve(size_t bytes, size_t texts) { p_->reserve(bytes, texts); }
std::string_view PickleStream::so_far() { return p_->so_far(); }

}  // namespace ucpkit::pickle
