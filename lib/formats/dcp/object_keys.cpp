// An opcode walker just precise enough to find one dict's SETITEMS (argument lengths from CPython's
// Lib/pickle.py / pickletools.py opcode table; stack effects only through MARK depth).
#include "formats/dcp/object_keys.h"

#include <cstring>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "io/pickle/opcodes.h"

namespace ucpkit::formats::dcp {

using pickle::Op;

namespace {

struct Walker {
  const std::vector<uint8_t>& d;
  const std::string& name;
  size_t pos = 0;

  [[noreturn]] void bad(const std::string& what) const {
    fail(name, "DCP metadata: " + what + " (at byte " + std::to_string(pos) + ")");
  }
  uint64_t le(size_t at, size_t n) const {
    if (at + n > d.size()) bad("truncated pickle");
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(d[at + k]) << (8 * k);
    return v;
  }
  size_t line_end(size_t at) const {
    const void* nl = at < d.size() ? std::memchr(d.data() + at, '\n', d.size() - at) : nullptr;
    if (!nl) bad("truncated pickle");
    return static_cast<size_t>(static_cast<const uint8_t*>(nl) - d.data()) + 1;
  }
  // Position after the opcode at `pos`; `str` gets the text a string push pushes.
  size_t next(std::optional<std::string>& str) const;
};

size_t Walker::next(std::optional<std::string>& str) const {
  const size_t a = pos + 1;
  auto counted = [&](size_t width, bool text) {
    const uint64_t n = le(a, width);
    if (n > d.size() - a - width) bad("truncated pickle");
    if (text) str = std::string(reinterpret_cast<const char*>(d.data() + a + width), static_cast<size_t>(n));
    return a + width + static_cast<size_t>(n);
  };
  switch (static_cast<Op>(d[pos])) {
    case Op::MARK: case Op::STOP: case Op::POP: case Op::POP_MARK: case Op::DUP: case Op::NONE:
    case Op::BINPERSID: case Op::REDUCE: case Op::APPEND: case Op::BUILD: case Op::DICT: case Op::EMPTY_DICT:
    case Op::APPENDS: case Op::LIST: case Op::EMPTY_LIST: case Op::OBJ: case Op::SETITEM: case Op::TUPLE:
    case Op::EMPTY_TUPLE: case Op::SETITEMS: case Op::NEWOBJ: case Op::TUPLE1: case Op::TUPLE2: case Op::TUPLE3:
    case Op::NEWTRUE: case Op::NEWFALSE: case Op::EMPTY_SET: case Op::ADDITEMS: case Op::FROZENSET:
    case Op::NEWOBJ_EX: case Op::STACK_GLOBAL: case Op::MEMOIZE: case Op::NEXT_BUFFER: case Op::READONLY_BUFFER:
      return a;
    case Op::BININT1: case Op::BINGET: case Op::BINPUT: case Op::EXT1: case Op::PROTO: return a + 1;
    case Op::BININT2: case Op::EXT2: return a + 2;
    case Op::BININT: case Op::LONG_BINGET: case Op::LONG_BINPUT: case Op::EXT4: return a + 4;
    case Op::BINFLOAT: case Op::FRAME: return a + 8;
    case Op::SHORT_BINUNICODE: return counted(1, true);
    case Op::SHORT_BINSTRING: case Op::SHORT_BINBYTES: case Op::LONG1: return counted(1, false);
    case Op::BINUNICODE: return counted(4, true);
    case Op::BINSTRING: case Op::BINBYTES: case Op::LONG4: return counted(4, false);
    case Op::BINUNICODE8: return counted(8, true);
    case Op::BINBYTES8: case Op::BYTEARRAY8: return counted(8, false);
    case Op::INT: case Op::LONG: case Op::FLOAT: case Op::STRING: case Op::UNICODE: case Op::PERSID:
    case Op::GET: case Op::PUT:
      return line_end(a);
    case Op::GLOBAL: case Op::INST: return line_end(line_end(a));
  }
  bad("unknown pickle opcode " + std::to_string(d[pos]));
}

bool closes_mark(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::SETITEMS: case Op::APPENDS: case Op::TUPLE: case Op::LIST: case Op::DICT: case Op::POP_MARK:
    case Op::FROZENSET: case Op::ADDITEMS: case Op::OBJ: case Op::INST:
      return true;
    default:
      return false;
  }
}

bool is_memo_store(uint8_t op) {
  return op == pickle::op_byte(Op::MEMOIZE) || op == pickle::op_byte(Op::BINPUT) ||
         op == pickle::op_byte(Op::LONG_BINPUT) || op == pickle::op_byte(Op::PUT);
}

}  // namespace

std::vector<uint8_t> storage_data_as_list(std::vector<uint8_t> p, const std::string& name) {
  Walker w{p, name};
  std::unordered_map<uint64_t, std::string> memo_strs;  // memo index -> string stored there
  uint64_t memo_size = 0;
  std::optional<std::string> top;  // the string the last value-pushing opcode pushed
  int depth = 0;
  size_t dict_pos = 0;
  enum { Searching, AfterDict, InBatch, Single, Done } state = Searching;
  while (w.pos < p.size() && state != Done) {
    const uint8_t op = p[w.pos];
    std::optional<std::string> pushed;
    const size_t after = w.next(pushed);
    if (op == pickle::op_byte(Op::STOP)) break;
    if (state == AfterDict && !is_memo_store(op) && op != pickle::op_byte(Op::FRAME)) {
      if (op == pickle::op_byte(Op::MARK) && depth == 1) state = InBatch;
      else if (op == pickle::op_byte(Op::SETITEMS)) state = Done;  // the Metadata state ends
      else state = Single;  // a lone key (or, for an empty storage_data, the next state key)
    }
    if (state == Single && op == pickle::op_byte(Op::SETITEM) && depth == 1) {
      // EMPTY_DICT MEMOIZE key value SETITEM -> NONE MEMOIZE key value TUPLE3: (None, key, value), the
      // memo numbering unchanged.
      p[dict_pos] = pickle::op_byte(Op::NONE);
      p[w.pos] = pickle::op_byte(Op::TUPLE3);
      state = Done;
    }
    if (state == Single && op == pickle::op_byte(Op::SETITEMS) && depth == 1) state = Done;
    if (op == pickle::op_byte(Op::MARK)) ++depth;
    if (closes_mark(op)) {
      if (--depth < 0) w.bad("unbalanced MARK");
      if (state == InBatch && depth == 1) {
        p[w.pos] = pickle::op_byte(Op::APPENDS);
        state = AfterDict;
      }
    }
    if (state == Searching && op == pickle::op_byte(Op::EMPTY_DICT) && depth == 1 && top == "storage_data") {
      p[w.pos] = pickle::op_byte(Op::EMPTY_LIST);
      dict_pos = w.pos;
      state = AfterDict;
    }
    if (is_memo_store(op)) {
      uint64_t idx = memo_size;
      if (op == pickle::op_byte(Op::BINPUT)) idx = w.le(w.pos + 1, 1);
      if (op == pickle::op_byte(Op::LONG_BINPUT)) idx = w.le(w.pos + 1, 4);
      if (op == pickle::op_byte(Op::MEMOIZE) || idx >= memo_size) memo_size = idx + 1;
      if (top) memo_strs[idx] = *top;
      else memo_strs.erase(idx);
    } else if (op == pickle::op_byte(Op::BINGET) || op == pickle::op_byte(Op::LONG_BINGET)) {
      auto it = memo_strs.find(w.le(w.pos + 1, op == pickle::op_byte(Op::BINGET) ? 1 : 4));
      top = it == memo_strs.end() ? std::nullopt : std::optional<std::string>(it->second);
    } else if (op != pickle::op_byte(Op::FRAME)) {
      top = pushed;
    }
    w.pos = after;
  }
  return p;
}

}  // namespace ucpkit::formats::dcp
