// DCP `.metadata` -> Metadata in one pass (metadata_direct.h says when; metadata.cpp's Parser is the field-
// by-field reference this mirrors: the same classes, fields and checks, an Abandon where it would fail).
// Why nodes need no cycle check: a list, dict or object is never fetched from the memo here, so each is
// placed once, straight from the stack, after its last change; a node's nesting is final when it is placed.
#include "formats/dcp/metadata_direct.h"

#include <sys/mman.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <exception>
#include <memory>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_invoke.h>

#include "core/error.h"
#include "io/pickle/class_paths.h"
#include "io/pickle/opcodes.h"
#include "io/pickle/unpickler.h"
#include "io/pickle/value.h"

namespace ucpkit::formats::dcp {
namespace metadata_direct {

using pickle::Op;

static_assert(std::endian::native == std::endian::little, "the opcodes' integers are read in place");

struct Abandon {};  // not of the shape read here: the general unpickler reads the file

// Gone: a memo entry whose node was taken over by another (a torch.Size's tuples, below); fetching it abandons.
enum class K : uint8_t { None, False, True, Int, Str, Global, Dtype, Leaf, Tuple, Size, List, Dict, Object, Gone };

constexpr uint32_t kNo = UINT32_MAX;
constexpr uint16_t kMaxDepth = 900;  // under the general unpickler's 1,000 (UnpickleOptions::max_depth)
constexpr uint32_t kEmptyTuple = 3, kSmallInts = 4;  // premade: None, False, True, (), then the ints 0..255,
constexpr uint32_t kEmptySize = kSmallInts + 256;    // then torch.Size([])

struct Node {
  K kind = K::None;
  uint16_t depth = 0;  // nesting below it
  uint32_t n = 0;      // Tuple / Size: kids; List / Dict: items (a dict's: key, value, key, ...)
  uint32_t a = 0;      // Str: offset in the file; Global: module Str; Tuple / Size: first kid; List / Dict: its first
                       // item in items_ (those of its first fill lie in a row); Object: its class (a Global); Int:
                       // the value's low 32 bits; Dtype: the DType
  uint32_t b = 0;      // Str: length; Global: name Str; List / Dict: its first Run (kNo: none); Object: BUILD's state
                       // (kNo: none); Int: the value's high 32 bits
  int64_t i() const { return static_cast<int64_t>((uint64_t{b} << 32) | a); }  // Int: the value; Dtype: the DType
};
// 16 bytes: the nodes of a 100,000-tensor `.metadata` are 2.6 million, each a fresh page's share that this VM kind
// faults in at a high price (24 bytes with the value apart: 21 MB more).
static_assert(sizeof(Node) == 16);

Node int_node(K kind, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  return {kind, 0, 0, static_cast<uint32_t>(u), static_cast<uint32_t>(u >> 32)};
}

// A stack or memo entry: a node with its kind and depth, so the machine's checks of what it holds need no trip to the
// node array (a memo fetch is of a node made far back: filling planner_data's dict missed the cache on each fqn key).
// The depth of a list, dict or object is its node's (it grows while the node is filled); theirs is read there.
struct Slot {
  uint32_t node;
  K kind;
  uint16_t depth;
};
static_assert(sizeof(Slot) == 8);

// A list's or dict's items past those of its first APPEND(S) / SETITEM(S) (each batch's items lie in a row in the
// machine's items): most containers are filled once and keep theirs in the node (24 MB of links with a next each, 11
// MB more to fault in, at 100,000 tensors).
struct Run {
  uint32_t first = 0, count = 0;
  uint32_t next = kNo;  // the container's next run
  uint32_t last = kNo;  // in the container's first run: its last one
};

// Transparent huge pages for a large array filled front to back: one fault per 2 MiB instead of per 4 KiB.
void huge_pages(void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
}

// Faults in the pages of [p, p + bytes) for writing, whole pages inside it (nothing where the kernel cannot).
void populate(void* p, size_t bytes) {
  constexpr uintptr_t kPage = 4096;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kPage - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
}

// The pickle machine over nodes: only what a DCP save's pickle does.
class Machine {
 public:
  explicit Machine(std::span<const uint8_t> d) : d_(d) {
    if (d.size() >= kNo) throw Abandon{};  // a Str keeps its offset in 32 bits
    // Room for what a DCP save's pickle makes per byte (100,000 tensors: 0.11 nodes, 0.12 items, 0.07 kids and 0.10
    // memo entries), reserved (not touched) in huge pages: grown by doubling, these arrays were a fifth of a reshard's
    // page faults and copies.
    nodes_.reserve(d.size() / 6);
    items_.reserve(d.size() / 6);
    kids_.reserve(d.size() / 8);
    memo_.reserve(d.size() / 8);
    huge_pages(nodes_.data(), nodes_.capacity() * sizeof(Node));
    huge_pages(items_.data(), items_.capacity() * sizeof(uint32_t));
    huge_pages(kids_.data(), kids_.capacity() * sizeof(uint32_t));
    huge_pages(memo_.data(), memo_.capacity() * sizeof(Slot));
    for (K k : {K::None, K::False, K::True, K::Tuple}) nodes_.push_back({k});
    for (int64_t v = 0; v < 256; ++v) nodes_.push_back(int_node(K::Int, v));
    nodes_.push_back({K::Size});
    // The pages the machine will fill, faulted in on another core meanwhile (the parse is the one thread running
    // then; a fresh page costs this VM's kernel about as much as the machine's work on it). That thread is given the
    // arrays' places, taken here before it starts, and never touches the arrays; one that outgrows its room moves,
    // and the pages faulted in then are of memory it left (faulted in, not written). A little over what torch's saves
    // make per byte (0.104-0.117 nodes, 0.096-0.120 items, 0.051-0.071 kids, 0.085-0.103 memo entries from 4 to 100,000
    // tensors, each Size's two tuples then nodes and kids of their own: 0.078-0.084 nodes and 0.054-0.055 kids without
    // them): pages faulted in and never used cost as much as used ones (7 MB more at 100,000 tensors with
    // 0.125 / 0.143 / 0.083 / 0.111); the machine faults in any it needs past them.
    const size_t n = d.size();
    const std::array<std::pair<void*, size_t>, 4> areas = {
        {{nodes_.data(), std::min(nodes_.capacity(), n * 9 / 100) * sizeof(Node)},
         {items_.data(), std::min(items_.capacity(), n / 8) * sizeof(uint32_t)},
         {kids_.data(), std::min(kids_.capacity(), n * 3 / 50) * sizeof(uint32_t)},
         {memo_.data(), std::min(memo_.capacity(), n * 21 / 200) * sizeof(Slot)}}};
    if (n >= (size_t{4} << 20))
      prefault_ = std::thread([this, areas] {
        constexpr size_t kStep = size_t{2} << 20;
        for (size_t done = 0; !stop_prefault_.load(std::memory_order_relaxed); done += kStep) {
          bool more = false;
          for (const auto& [p, bytes] : areas)
            if (done < bytes) {
              populate(static_cast<char*>(p) + done, std::min(kStep, bytes - done));
              more = true;
            }
          if (!more) break;
        }
      });
  }
  ~Machine() {
    stop_prefault_ = true;
    if (prefault_.joinable()) prefault_.join();
  }
  uint32_t run();

  const Node& at(uint32_t k) const { return nodes_[k]; }
  size_t nodes() const { return nodes_.size(); }
  std::string_view str(uint32_t k) const {
    const Node& s = nodes_[k];
    if (s.kind != K::Str) throw Abandon{};
    return {reinterpret_cast<const char*>(d_.data()) + s.a, s.b};
  }
  uint32_t kid(uint32_t tuple, uint32_t j) const { return kids_[nodes_[tuple].a + j]; }
  // A Tuple's or Size's kids, a List's items or a Dict's keys and values in order.
  template <typename F> void each(uint32_t k, F&& f) const {
    const Node& c = nodes_[k];
    if (c.kind == K::Tuple || c.kind == K::Size) {
      for (uint32_t j = 0; j < c.n; ++j) f(kids_[c.a + j]);
    } else if (c.kind == K::List || c.kind == K::Dict) {
      uint32_t later = 0;  // the items of its runs after the first fill's
      for (uint32_t r = c.b; r != kNo; r = runs_[r].next) later += runs_[r].count;
      for (uint32_t j = c.a; j < c.a + (c.n - later); ++j) f(items_[j]);
      for (uint32_t r = c.b; r != kNo; r = runs_[r].next)
        for (uint32_t j = runs_[r].first; j < runs_[r].first + runs_[r].count; ++j) f(items_[j]);
    } else {
      throw Abandon{};
    }
  }

 private:
  // An opcode's argument of N bytes: a fixed-size load (le(n) for a length read from the file).
  template <size_t N>
  uint64_t le() {
    if (d_.size() - pos_ < N) throw Abandon{};
    uint64_t v = 0;
    std::memcpy(&v, d_.data() + pos_, N);
    pos_ += N;
    return v;
  }
  uint64_t le(size_t n) {
    if (d_.size() - pos_ < n) throw Abandon{};
    uint64_t v = 0;
    std::memcpy(&v, d_.data() + pos_, n);
    pos_ += n;
    return v;
  }
  uint32_t add(Node node) {
    if (node.depth > kMaxDepth) throw Abandon{};
    nodes_.push_back(node);
    return static_cast<uint32_t>(nodes_.size() - 1);
  }
  void push(uint32_t k) { stack_.push_back({k, nodes_[k].kind, nodes_[k].depth}); }
  // Where the stack of the innermost mark starts (Python's unpickler keeps each mark's stack apart).
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The position of the top `n` items, which must be above the innermost mark.
  size_t above(size_t n) const {
    if (stack_.size() < floor() + n) throw Abandon{};
    return stack_.size() - n;
  }
  uint32_t pop() { return pop_slot().node; }
  Slot pop_slot() {
    const Slot k = stack_[above(1)];
    stack_.pop_back();
    return k;
  }
  uint32_t top() const { return stack_[above(1)].node; }
  size_t mark_start() {
    if (marks_.empty()) throw Abandon{};
    const size_t at = marks_.back();
    marks_.pop_back();
    return at;
  }
  static bool is_mutable(K k) { return k == K::List || k == K::Dict || k == K::Object; }
  uint16_t deeper(uint16_t depth, uint32_t k) const {
    return std::max<uint16_t>(depth, static_cast<uint16_t>(nodes_[k].depth + 1));
  }
  uint16_t deeper(uint16_t depth, const Slot& k) const {
    return std::max<uint16_t>(depth, static_cast<uint16_t>((is_mutable(k.kind) ? nodes_[k.node].depth : k.depth) + 1));
  }
  void text(uint64_t length);
  void integer(int64_t v) {
    push(v >= 0 && v < 256 ? kSmallInts + static_cast<uint32_t>(v) : add(int_node(K::Int, v)));
  }
  void long1();
  void tuple(size_t from);
  void fill(K kind, size_t from);
  void stack_global();
  void reduce();
  void new_object();
  void build();
  void memo_get(uint64_t idx);

  std::span<const uint8_t> d_;
  size_t pos_ = 0;
  std::vector<Node> nodes_;
  std::vector<uint32_t> kids_;
  std::vector<Slot> stack_, memo_;
  std::vector<uint32_t> items_;  // lists' and dicts' items, each fill's in a row
  std::vector<Run> runs_;
  std::vector<size_t> marks_;
  uint32_t size_class_ = kNo;  // the Global node of torch.Size, once met
  std::atomic<bool> stop_prefault_{false};
  std::thread prefault_;  // last: started once the arrays above are reserved
};

void Machine::text(uint64_t length) {
  if (length > d_.size() - pos_) throw Abandon{};
  const uint8_t* p = d_.data() + pos_;
  for (uint64_t k = 0; k < length; ++k)
    if (p[k] >= 0x80) throw Abandon{};  // UTF-8 beyond ASCII: the general reader's decoder decides
  push(add({K::Str, 0, 0, static_cast<uint32_t>(pos_), static_cast<uint32_t>(length)}));
  pos_ += length;
}

void Machine::long1() {
  const size_t n = le<1>();
  if (n > 8) throw Abandon{};
  uint64_t v = le(n);
  if (n && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // two's complement, sign-extended
  integer(static_cast<int64_t>(v));
}

void Machine::tuple(size_t from) {
  if (from == stack_.size()) return push(kEmptyTuple);
  Node t{K::Tuple, 0, static_cast<uint32_t>(stack_.size() - from), static_cast<uint32_t>(kids_.size())};
  for (size_t k = from; k < stack_.size(); ++k) {
    kids_.push_back(stack_[k].node);
    t.depth = deeper(t.depth, stack_[k]);
  }
  stack_.resize(from);
  push(add(t));
}

// APPENDS / SETITEMS: the items from `from` (a popped mark's position) go into the list or dict below them.
void Machine::fill(K kind, size_t from) {
  if (from <= floor() || from > stack_.size()) throw Abandon{};
  const uint32_t target = stack_[from - 1].node;
  if (nodes_[target].kind != kind || (kind == K::Dict && (stack_.size() - from) % 2)) throw Abandon{};
  if (from == stack_.size()) return;
  // The items put in a row, and the container's place and depth set once (item by item, the container was read and
  // written for each of a DCP `.metadata`'s 2.8 million items).
  if (items_.size() + (stack_.size() - from) >= kNo) throw Abandon{};
  const auto first = static_cast<uint32_t>(items_.size());
  uint16_t depth = nodes_[target].depth;
  for (size_t k = from; k < stack_.size(); ++k) {
    const Slot& item = stack_[k];
    if (kind == K::Dict && (k - from) % 2 == 0 && item.kind != K::Str && item.kind != K::Int && item.kind != K::Object)
      throw Abandon{};
    items_.push_back(item.node);
    depth = deeper(depth, item);
  }
  if (depth > kMaxDepth) throw Abandon{};
  const auto count = static_cast<uint32_t>(items_.size() - first);
  Node& c = nodes_[target];
  if (c.n == 0) {
    c.a = first;
  } else if (c.b == kNo && c.a + c.n == first) {  // right after its first fill's (no other between): the same row
  } else {
    const auto run = static_cast<uint32_t>(runs_.size());
    runs_.push_back({first, count, kNo, kNo});
    if (c.b == kNo) c.b = run;
    else runs_[runs_[c.b].last].next = run;
    runs_[c.b].last = run;
  }
  c.n += count;
  c.depth = depth;
  stack_.resize(from);
}

void Machine::stack_global() {
  const uint32_t name = pop(), module = pop();
  const std::string_view m = str(module), n = str(name);
  if (!pickle::class_path_problem(m, n).empty() || (m == "collections" && n == "OrderedDict")) throw Abandon{};
  DType t;
  if (m == "torch" && pickle::is_torch_dtype_name(n, t)) return push(add(int_node(K::Dtype, static_cast<int64_t>(t))));
  push(add({K::Global, 1, 0, module, name}));
}

// torch.Size(tuple of ints), or an enum member, a layout or a path of scalars (the general unpickler keeps
// those opaque): nothing else is called.
void Machine::reduce() {
  const uint32_t args = pop(), callable = pop();
  const Node& f = nodes_[callable];
  if (f.kind != K::Global || nodes_[args].kind != K::Tuple) throw Abandon{};
  const Node& a = nodes_[args];
  // torch.Size's class is one memoized node, fetched for each of the 100,000s of shapes: known by its number after
  // the first (comparing its module and name each time was 7% of the machine's instructions).
  const bool size = callable == size_class_ || (str(f.a) == "torch" && str(f.b) == "Size");
  if (size) {
    size_class_ = callable;
    const uint32_t inner = a.n == 1 ? kids_[a.a] : kNo;
    if (inner == kNo || nodes_[inner].kind != K::Tuple) throw Abandon{};
    const Node shape = nodes_[inner];
    for (uint32_t j = 0; j < shape.n; ++j)
      if (nodes_[kids_[shape.a + j]].kind != K::Int) throw Abandon{};
    // As torch pickles a Size, its shape and the arguments' tuple were made just before, for it alone (fresh Python
    // tuples): the shape's node becomes the Size and the arguments' is dropped, their memo entries Gone (800,000
    // nodes, 13 MB of fresh pages, at 100,000 tensors). Between the shape's TUPLE and this REDUCE only MEMOIZE can
    // have named them (any other opcode there makes a node or changes the arguments); a reference to the shape left on
    // the stack below reads as this Size, which only a shape (the same values) or an abandon takes.
    const bool last = args + 1 == nodes_.size() && a.a + 1 == kids_.size();
    const bool premade = inner == kEmptyTuple;  // Size([]): () is one shared node, never taken over
    if (last && (premade || inner + 2 == nodes_.size())) {
      for (size_t k = memo_.size(); k-- > 0 && (memo_[k].node == args || (!premade && memo_[k].node == inner));)
        memo_[k].kind = K::Gone;
      nodes_.pop_back();
      kids_.pop_back();
      if (premade) return push(kEmptySize);
      nodes_[inner].kind = K::Size;
      return push(inner);
    }
    Node made = shape;
    made.kind = K::Size;
    return push(add(made));
  }
  const std::string_view m = str(f.a), n = str(f.b);
  const bool opaque = m.starts_with("torch.distributed.") || (m == "torch.serialization" && n == "_get_layout") ||
                      m == "pathlib" || m.starts_with("pathlib.");  // StorageMeta.checkpoint_id of a Path
  if (!opaque) throw Abandon{};
  for (uint32_t j = 0; j < a.n; ++j)
    if (const K k = nodes_[kids_[a.a + j]].kind; k != K::Int && k != K::Str && k != K::None && k != K::False && k != K::True)
      throw Abandon{};
  push(add({K::Leaf, 1}));
}

void Machine::new_object() {
  const uint32_t args = pop(), cls = pop();
  if (nodes_[cls].kind != K::Global || nodes_[args].kind != K::Tuple || nodes_[args].n) throw Abandon{};
  push(add({K::Object, 2, 0, cls, kNo}));
}

void Machine::build() {
  const uint32_t state = pop();
  Node& o = nodes_[top()];
  if (o.kind != K::Object || o.b != kNo) throw Abandon{};
  o.b = state;
  o.depth = deeper(o.depth, state);
  if (o.depth > kMaxDepth) throw Abandon{};
}

void Machine::memo_get(uint64_t idx) {
  if (idx >= memo_.size() || is_mutable(memo_[idx].kind) || memo_[idx].kind == K::Gone) throw Abandon{};
  stack_.push_back(memo_[idx]);
}

uint32_t Machine::run() {
  while (pos_ < d_.size()) {
    switch (static_cast<Op>(d_[pos_++])) {
      case Op::PROTO: le<1>(); break;
      case Op::FRAME: le<8>(); break;
      case Op::STOP: return top();
      case Op::MARK: marks_.push_back(stack_.size()); break;
      case Op::MEMOIZE: memo_.push_back(stack_[above(1)]); break;
      case Op::BINGET: memo_get(le<1>()); break;
      case Op::LONG_BINGET: memo_get(le<4>()); break;
      case Op::SHORT_BINUNICODE: text(le<1>()); break;
      case Op::BINUNICODE: text(le<4>()); break;
      case Op::BINUNICODE8: text(le<8>()); break;
      case Op::BININT1: integer(static_cast<int64_t>(le<1>())); break;
      case Op::BININT2: integer(static_cast<int64_t>(le<2>())); break;
      case Op::BININT: integer(static_cast<int32_t>(le<4>())); break;
      case Op::LONG1: long1(); break;
      case Op::NONE: push(0); break;
      case Op::NEWFALSE: push(1); break;
      case Op::NEWTRUE: push(2); break;
      case Op::EMPTY_TUPLE: push(kEmptyTuple); break;
      case Op::TUPLE1: tuple(above(1)); break;
      case Op::TUPLE2: tuple(above(2)); break;
      case Op::TUPLE3: tuple(above(3)); break;
      case Op::TUPLE: tuple(mark_start()); break;
      case Op::EMPTY_LIST: push(add({K::List, 1, 0, 0, kNo})); break;
      case Op::EMPTY_DICT: push(add({K::Dict, 1, 0, 0, kNo})); break;
      case Op::APPEND: fill(K::List, above(2) + 1); break;  // one item above the list
      case Op::APPENDS: fill(K::List, mark_start()); break;
      case Op::SETITEM: fill(K::Dict, above(2)); break;  // key and value above the dict
      case Op::SETITEMS: fill(K::Dict, mark_start()); break;
      case Op::STACK_GLOBAL: stack_global(); break;
      case Op::REDUCE: reduce(); break;
      case Op::NEWOBJ: new_object(); break;
      case Op::BUILD: build(); break;
      default: throw Abandon{};  // BINPUT, POP, DUP, floats, bytes, older protocols...: the general reader's
    }
  }
  throw Abandon{};  // no STOP
}

// The Metadata of a machine's root: metadata.cpp's Parser over nodes.
class Convert {
 public:
  Convert(const Machine& m, const std::string& name) : m_(m), name_(name) {}
  Metadata metadata(uint32_t root);

 private:
  // An object's fields (BUILD's dict of str keys, none twice).
  struct Fields {
    std::array<std::pair<std::string_view, uint32_t>, 8> f{};
    size_t n = 0;
    uint32_t get(std::string_view name) const {
      for (size_t k = 0; k < n; ++k)
        if (f[k].first == name) return f[k].second;
      return kNo;
    }
    uint32_t need(std::string_view name) const {
      const uint32_t v = get(name);
      if (v == kNo) throw Abandon{};
      return v;
    }
  };
  bool is(uint32_t k, const std::string& path) const;
  Fields fields(uint32_t obj, const std::string& cls) const;
  std::vector<int64_t> shape(uint32_t k) const;
  uint64_t count(uint32_t k) const {
    if (m_.at(k).kind != K::Int || m_.at(k).i() < 0) throw Abandon{};
    return static_cast<uint64_t>(m_.at(k).i());
  }
  bool none(uint32_t k) const { return k == kNo || m_.at(k).kind == K::None; }
  Entry entry(uint32_t key, uint32_t value);
  Item item(uint32_t key, uint32_t value) const;
  std::shared_ptr<const PlannerPaths> planner(uint32_t k) const;
  void storage_meta(uint32_t k, Metadata& md) const;

  const Machine& m_;
  const std::string& name_;
  // This file's DCP classes, spelled once (each is checked for every entry or item).
  struct Classes {
    explicit Classes(std::string_view prefix)
        : bytes(std::string(prefix) + "metadata.BytesStorageMetadata"),
          tensor(std::string(prefix) + "metadata.TensorStorageMetadata"),
          properties(std::string(prefix) + "metadata.TensorProperties"),
          sharded_properties(kShardedPropsClass),
          chunk(std::string(prefix) + "metadata.ChunkStorageMetadata"),
          index(std::string(prefix) + "metadata.MetadataIndex"),
          info(std::string(prefix) + "filesystem._StorageInfo"),
          storage_meta(std::string(prefix) + "metadata.StorageMeta"),
          metadata(std::string(prefix) + "metadata.Metadata") {}
    std::string bytes, tensor, properties, sharded_properties, chunk, index, info, storage_meta, metadata;
  };
  Classes c_{kCurrentPrefix};
  ClassEra era_ = ClassEra::Current;
  std::atomic<bool> sharded_props_{false};  // an entry's properties of the sharded-properties era (on any core)
};

bool Convert::is(uint32_t k, const std::string& path) const {
  const Node& o = m_.at(k);
  if (o.kind != K::Object) return false;
  const Node& g = m_.at(o.a);
  const std::string_view module = m_.str(g.a), name = m_.str(g.b);
  return path.size() == module.size() + 1 + name.size() && path.starts_with(module) && path[module.size()] == '.' &&
         path.ends_with(name);
}

Convert::Fields Convert::fields(uint32_t obj, const std::string& cls) const {
  if (!is(obj, cls)) throw Abandon{};
  Fields out;
  const uint32_t state = m_.at(obj).b;
  if (state == kNo) return out;
  if (m_.at(state).kind != K::Dict || m_.at(state).n / 2 > out.f.size()) throw Abandon{};
  bool key = true;
  m_.each(state, [&](uint32_t k) {
    if (key) {
      const std::string_view s = m_.str(k);
      if (out.get(s) != kNo) throw Abandon{};
      out.f[out.n].first = s;
    } else {
      out.f[out.n++].second = k;
    }
    key = !key;
  });
  return out;
}

std::vector<int64_t> Convert::shape(uint32_t k) const {
  if (const K kind = m_.at(k).kind; kind != K::Size && kind != K::Tuple && kind != K::List) throw Abandon{};
  std::vector<int64_t> s;
  s.reserve(m_.at(k).n);
  m_.each(k, [&](uint32_t d) { s.push_back(static_cast<int64_t>(count(d))); });
  return s;
}

Entry Convert::entry(uint32_t key, uint32_t value) {
  Entry e;
  e.fqn = m_.str(key);
  if (is(value, c_.bytes)) {
    e.is_bytes = true;
    return e;
  }
  const Fields f = fields(value, c_.tensor);
  const uint32_t props = f.need("properties");
  if (is(props, c_.sharded_properties)) {
    sharded_props_.store(true, std::memory_order_relaxed);
  } else if (!is(props, c_.properties)) {
    throw Abandon{};
  }
  // (dtype, layout, requires_grad, memory-format encoding, pin_memory[, later fields...])
  const uint32_t st = m_.at(props).b;
  if (st == kNo || m_.at(st).kind != K::Tuple || !m_.at(st).n || m_.at(m_.kid(st, 0)).kind != K::Dtype) throw Abandon{};
  e.dtype = static_cast<DType>(m_.at(m_.kid(st, 0)).i());
  e.size = shape(f.need("size"));
  const uint32_t chunks = f.need("chunks");
  if (m_.at(chunks).kind != K::List && m_.at(chunks).kind != K::Tuple) throw Abandon{};
  m_.each(chunks, [&](uint32_t c) {
    const Fields cf = fields(c, c_.chunk);
    Chunk chunk{shape(cf.need("offsets")), shape(cf.need("sizes"))};
    if (chunk.offsets.size() != e.size.size() || chunk.sizes.size() != e.size.size()) throw Abandon{};
    e.chunks.push_back(std::move(chunk));
  });
  return e;
}

Item Convert::item(uint32_t key, uint32_t value) const {
  const Fields kf = fields(key, c_.index);
  Item it;
  it.fqn = m_.str(kf.need("fqn"));
  if (const uint32_t off = kf.get("offset"); !none(off)) it.offset = shape(off);
  const Fields f = fields(value, c_.info);
  it.storage.relative_path = m_.str(f.need("relative_path"));
  it.storage.offset = count(f.need("offset"));
  it.storage.length = count(f.need("length"));
  if (const uint32_t t = f.get("transform_descriptors"); !none(t)) {
    if (m_.at(t).kind != K::List && m_.at(t).kind != K::Tuple) throw Abandon{};
    m_.each(t, [&](uint32_t d) { it.storage.transform_descriptors.emplace_back(m_.str(d)); });
    it.storage.transforms = it.storage.transform_descriptors.size();
  }
  return it;
}

// DefaultSavePlanner's {flat fqn: tuple of the nested keys} (planner_paths.h).
std::shared_ptr<const PlannerPaths> Convert::planner(uint32_t k) const {
  if (none(k)) return nullptr;
  if (m_.at(k).kind != K::Dict) throw Abandon{};
  auto out = std::make_shared<PlannerPaths>();
  out->reserve(m_.at(k).n / 2);
  std::vector<PlannerPaths::Part> parts;
  uint32_t key = kNo;
  m_.each(k, [&](uint32_t v) {
    if (key == kNo) return void(key = v);
    const K kind = m_.at(v).kind;
    if (kind != K::Tuple && kind != K::List) throw Abandon{};
    parts.clear();
    m_.each(v, [&](uint32_t p) {
      const Node& part = m_.at(p);
      if (part.kind == K::Str) parts.push_back({m_.str(p), 0, false});
      else if (part.kind == K::Int) parts.push_back({{}, part.i(), true});
      else throw Abandon{};
    });
    if (!out->add(m_.str(key), parts, kind == K::List)) throw Abandon{};  // a key given twice
    key = kNo;
  });
  return out;
}

void Convert::storage_meta(uint32_t k, Metadata& md) const {
  if (none(k)) return;
  const Fields f = fields(k, c_.storage_meta);
  auto text = [&](std::string_view field) -> std::optional<std::string> {
    const uint32_t v = f.get(field);
    if (v == kNo || m_.at(v).kind != K::Str) return std::nullopt;
    return std::string(m_.str(v));
  };
  md.checkpoint_id = text("checkpoint_id");
  md.save_id = text("save_id");
}

Metadata Convert::metadata(uint32_t root) {
  if (const Classes prototype{kPrototypePrefix}; is(root, prototype.metadata)) {
    c_ = prototype;
    era_ = ClassEra::Prototype;
  }
  const Fields f = fields(root, c_.metadata);
  Metadata md;
  md.path = name_;
  const uint32_t sdm = f.need("state_dict_metadata"), sd = f.need("storage_data");
  if (m_.at(sdm).kind != K::Dict || m_.at(sd).kind != K::Dict) throw Abandon{};
  auto pairs = [&](uint32_t dict) {  // a dict's keys and values, in order
    std::vector<std::pair<uint32_t, uint32_t>> out;
    out.reserve(m_.at(dict).n / 2);
    uint32_t key = kNo;
    m_.each(dict, [&](uint32_t v) {
      if (key == kNo) return void(key = v);
      out.emplace_back(key, v);
      key = kNo;
    });
    return out;
  };
  const auto entries = pairs(sdm), items = pairs(sd);
  {
    std::vector<char> keyed(m_.nodes(), 0);  // MetadataIndex objects key the dict by identity (a hash set was a tenth)
    for (const auto& [key, value] : items)
      if (keyed[key]++) throw Abandon{};
  }
  // planner_data's paths (one sequence: each is added to one table) on one task, state_dict_metadata's entries and
  // storage_data's items on one each: a list's places made (their fresh pages: 25 MB for 100,000 tensors, 0.015 s of
  // one core's page faults when made before), filled in blocks the cores share (the nodes are only read; each block
  // fills its own places of md), then indexed. With planner_data on one thread and the rest on the other, one waited
  // a third of the conversion for the other. A fqn listed twice: the general reader's dict would have kept one.
  auto convert = [&](auto& out, const std::vector<std::pair<uint32_t, uint32_t>>& from, auto make,
                     void (*index)(Metadata&)) {
    constexpr size_t kBlock = 1024;
    out.resize(from.size());
    tbb::parallel_for(tbb::blocked_range<size_t>(0, from.size(), kBlock), [&](const tbb::blocked_range<size_t>& r) {
      for (size_t k = r.begin(); k != r.end(); ++k) out[k] = make(from[k].first, from[k].second);
    });
    try {
      index(md);
    } catch (const Error&) {
      throw Abandon{};
    }
  };
  tbb::parallel_invoke([&] { md.planner = planner(f.get("planner_data")); },
                       [&] {
                         convert(
                             md.entries, entries, [this](uint32_t k, uint32_t v) { return entry(k, v); },
                             index_entries);
                       },
                       [&] {
                         convert(
                             md.items, items, [this](uint32_t k, uint32_t v) { return item(k, v); }, index_items);
                       });
  if (era_ == ClassEra::Current && sharded_props_.load(std::memory_order_relaxed)) era_ = ClassEra::ShardedProps;
  storage_meta(f.get("storage_meta"), md);
  if (const uint32_t v = f.get("version"); v != kNo && m_.at(v).kind == K::Str) md.version = std::string(m_.str(v));
  md.era = era_;
  return md;
}

}  // namespace metadata_direct

std::optional<Metadata> parse_metadata_direct(std::span<const uint8_t> bytes, const std::string& name) {
  try {
    metadata_direct::Machine machine(bytes);
    const uint32_t root = machine.run();
    return metadata_direct::Convert(machine, name).metadata(root);
  } catch (const metadata_direct::Abandon&) {
    return std::nullopt;
  }
}

}  // namespace ucpkit::formats::dcp
