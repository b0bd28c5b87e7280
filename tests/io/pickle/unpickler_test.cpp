// lib/io/pickle/unpickler: pickles written byte by byte here (opcode values from Python's pickle
// module, checked by tests/io/opcodes_test.cpp) and by /usr/bin/python3's pickle, decoded into Value
// trees whose expected contents are stated by hand. Covers scalars, text opcodes of protocol 0, the
// containers, the memo (binary, text and MEMOIZE), frames, persistent ids, torch rebuilders, opaque
// objects, the on_dict_items hook, several pickles in a row, and refusals of truncated or hostile input
// with the limits (depth, MARKs, memory, memo indices, cycles).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/pickle/unpickler.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace pickle_unpickler_test {

using namespace ucpkit;
using namespace std::string_literals;
using namespace std::string_view_literals;
using pickle::Kind;
using pickle::UnpickleOptions;
using pickle::Value;
using pickle::ValuePtr;
using ucpkit::testing::error_of;

namespace {

std::span<const uint8_t> span_of(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

ValuePtr load(std::string_view s, const UnpickleOptions& o = {}, size_t* consumed = nullptr) {
  return pickle::unpickle(span_of(s), "t.pkl", o, consumed);
}

std::string refusal(std::string_view s, const UnpickleOptions& o = {}) {
  return error_of([&] { load(s, o); }, "(accepted)");
}

#define EXPECT_REFUSED(bytes, words)                                               \
  do {                                                                             \
    const std::string msg_ = refusal(bytes);                                       \
    EXPECT_NE(msg_.find(words), std::string::npos) << msg_;                        \
    EXPECT_EQ(msg_.rfind("t.pkl: pickle: ", 0), 0u) << "names the file: " << msg_; \
  } while (0)

// A float32 storage of `n` elements as torch_file's loader gives it: a 1-d tensor over the storage.
ValuePtr storage_value(int64_t n) {
  auto s = Storage::zeros(DType::Float32, n);
  return Value::of_tensor(Tensor(std::move(s), 0, {n}, {1}));
}

UnpickleOptions with_storage(int64_t n) {
  UnpickleOptions o;
  o.persistent_load = [n](const ValuePtr&) { return storage_value(n); };
  return o;
}

// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, OrderedDict()) with the
// storage from BINPERSID and `tail` the bytes after the stride tuple (requires_grad onward, then REDUCE).
std::string rebuild_v2(std::string_view offset, std::string_view size, std::string_view stride, std::string_view tail) {
  std::string s =
      "\x80\x02"
      "ctorch._utils\n_rebuild_tensor_v2\n("
      "U\x07storage"
      "Q";
  s += offset;
  s += size;
  s += stride;
  s += tail;
  return s;
}

}  // namespace

TEST(Unpickler, BinaryIntegersKeepTheirSign) {
  EXPECT_EQ(load("\x80\x02K\x05."sv)->i, 5);
  EXPECT_EQ(load("K\xff."sv)->i, 255);  // BININT1 is unsigned
  EXPECT_EQ(load("M\x00\x01."sv)->i, 256);
  EXPECT_EQ(load("J\xff\xff\xff\xff."sv)->i, -1);
  EXPECT_EQ(load("J\x00\x00\x00\x80."sv)->i, INT32_MIN);
  EXPECT_EQ(load("\x8a\x01\xff."sv)->i, -1);
  EXPECT_EQ(load("\x8a\x00."sv)->i, 0);
  auto i64 = load("\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f."sv);
  EXPECT_TRUE(i64->is(Kind::Int));
  EXPECT_EQ(i64->i, INT64_MAX);
  // 2**64 needs 9 bytes: a BigInt holding them.
  auto big = load("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01."sv);
  EXPECT_TRUE(big->is(Kind::BigInt));
  EXPECT_EQ(big->s, "\x00\x00\x00\x00\x00\x00\x00\x00\x01"sv);
  EXPECT_EQ(load("\x8b\x02\x00\x00\x00\x00\x80."sv)->i, -32768);  // LONG4
}

TEST(Unpickler, FloatsBoolsAndNone) {
  EXPECT_EQ(load("G\x3f\xf8\x00\x00\x00\x00\x00\x00."sv)->f, 1.5);  // big-endian IEEE double
  EXPECT_EQ(load("G\xbf\xd0\x00\x00\x00\x00\x00\x00."sv)->f, -0.25);
  auto t = load("\x88."sv);
  EXPECT_TRUE(t->is(Kind::Bool));
  EXPECT_TRUE(t->b);
  EXPECT_FALSE(load("\x89."sv)->b);
  EXPECT_TRUE(load("N."sv)->is_none());
}

TEST(Unpickler, Protocol0TextOpcodes) {
  EXPECT_EQ(load("I42\n."sv)->i, 42);
  auto b = load("I01\n."sv);  // Python 2's True
  EXPECT_TRUE(b->is(Kind::Bool));
  EXPECT_TRUE(b->b);
  EXPECT_FALSE(load("I00\n."sv)->b);
  EXPECT_EQ(load("I-7\n."sv)->i, -7);
  auto big = load("L-12345678901234567890L\n."sv);
  ASSERT_TRUE(big->is(Kind::BigInt));
  EXPECT_EQ(big->s, "\x2e\xf5\xe0\x14\x73\x56\xab\x54\xff"sv);  // int.to_bytes(9, 'little', signed=True)
  EXPECT_EQ(load("F2.5\n."sv)->f, 2.5);
  EXPECT_EQ(load("S'a\\nb\\x41\\101'\n."sv)->s, "a\nbAA");
  EXPECT_EQ(load("Vcaf\\u00e9 \\U0001F600\n."sv)->s, "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_REFUSED("Iabc\n."sv, "bad INT literal");
  EXPECT_REFUSED("Fx\n."sv, "bad FLOAT literal");
  EXPECT_REFUSED("Sabc\n."sv, "not a quoted string");
  EXPECT_REFUSED("V\\u12\n."sv, "bad \\u escape");
  EXPECT_REFUSED("V\\U00110000\n."sv, "code point out of range");
  EXPECT_REFUSED("I42"sv, "missing end of line");
}

TEST(Unpickler, StringsAreCheckedAsPythonDecodesThem) {
  EXPECT_EQ(load("\x8c\x03"
                 "abc."sv)
                ->s,
            "abc");
  EXPECT_EQ(load("X\x02\x00\x00\x00"
                 "\xc3\xa9."sv)
                ->s,
            "\xc3\xa9");
  EXPECT_EQ(load("\x8d\x01\x00\x00\x00\x00\x00\x00\x00"
                 "z."sv)
                ->s,
            "z");
  EXPECT_EQ(load("U\x02"
                 "hi."sv)
                ->s,
            "hi");
  EXPECT_EQ(load("T\x01\x00\x00\x00"
                 "q."sv)
                ->s,
            "q");
  auto bytes = load("C\x03\x00\xff\x01."sv);
  EXPECT_TRUE(bytes->is(Kind::Bytes));
  EXPECT_EQ(bytes->s, "\x00\xff\x01"sv);
  EXPECT_EQ(load("B\x01\x00\x00\x00\x07."sv)->s, "\x07");
  EXPECT_EQ(load("\x96\x01\x00\x00\x00\x00\x00\x00\x00\x08."sv)->s, "\x08");
  // A surrogate passes BINUNICODE (errors='surrogatepass') but not SHORT_BINSTRING (strict).
  EXPECT_EQ(load("\x8c\x03\xed\xa0\x80."sv)->s, "\xed\xa0\x80");
  EXPECT_REFUSED("U\x03\xed\xa0\x80."sv, "invalid UTF-8 in SHORT_BINSTRING");
  EXPECT_REFUSED("\x8c\x02\xc0\x80."sv, "invalid UTF-8 in SHORT_BINUNICODE string (byte 0 of 2)");  // overlong
  EXPECT_REFUSED(
      "\x8c\x02"
      "a\xff."sv,
      "(byte 1 of 2)");
  EXPECT_REFUSED("T\xff\xff\xff\xff."sv, "negative BINSTRING length");
  EXPECT_REFUSED("\x8b\xff\xff\xff\xff."sv, "negative LONG4 length");
}

TEST(Unpickler, ContainersFromEmptyAndMarkedForms) {
  auto l = load(
      "](K\x01K\x02"
      "eK\x03"
      "a."sv);  // [] APPENDS(1, 2) APPEND(3)
  ASSERT_TRUE(l->is(Kind::List));
  ASSERT_EQ(l->items.size(), 3u);
  EXPECT_EQ(l->items[2]->i, 3);
  auto t = load("(K\x01K\x02K\x03t."sv);
  ASSERT_TRUE(t->is(Kind::Tuple));
  EXPECT_EQ(t->items.size(), 3u);
  EXPECT_EQ(load("K\x01\x85."sv)->items.size(), 1u);
  EXPECT_EQ(load("K\x01K\x02\x86."sv)->items.size(), 2u);
  EXPECT_EQ(load("K\x01K\x02K\x03\x87."sv)->items[2]->i, 3);
  EXPECT_EQ(load(")."sv)->items.size(), 0u);
  EXPECT_EQ(load("(K\x01l."sv)->items.size(), 1u);
  auto s = load("\x8f(K\x01K\x02\x90."sv);
  EXPECT_TRUE(s->is(Kind::Set));
  EXPECT_EQ(s->items.size(), 2u);
  EXPECT_TRUE(load("(K\x01\x91."sv)->is(Kind::FrozenSet));
}

TEST(Unpickler, DictKeysReplaceAsPythonsDoKeepingTheFirstPosition) {
  // {'a': 1, 'b': 2} then SETITEM 'a' = 3, and key 1 then key True (equal in Python) and 1.0.
  auto d = load(
      "}(\x8c\x01"
      "aK\x01\x8c\x01"
      "bK\x02u\x8c\x01"
      "aK\x03"
      "sK\x01K\x04s\x88K\x05sG\x3f\xf0\x00\x00\x00\x00\x00\x00K\x06s."sv);
  ASSERT_TRUE(d->is(Kind::Dict));
  ASSERT_EQ(d->entries.size(), 3u);
  EXPECT_EQ(d->entries[0].first->s, "a");
  EXPECT_EQ(d->at("a")->i, 3);
  EXPECT_EQ(d->at("b")->i, 2);
  EXPECT_EQ(d->entries[2].first->i, 1);  // the key object stays the first one, the value is the last
  EXPECT_EQ(d->entries[2].second->i, 6);
  auto marked = load(
      "(\x8c\x01xK\x01\x8c\x01yK\x02"
      "d."sv);
  EXPECT_EQ(marked->at("y")->i, 2);
  EXPECT_REFUSED("}(K\x01u."sv, "odd number of items");
  EXPECT_REFUSED("}]K\x01s."sv, "unhashable dict key of type list");
  EXPECT_REFUSED("]K\x01K\x02s."sv, "SETITEM on a list");
  EXPECT_REFUSED(
      "}K\x01"
      "a."sv,
      "APPEND on a dict");
  EXPECT_REFUSED("](K\x01\x90."sv, "ADDITEMS on a list");
}

// A dict above the small size goes through an index by key: the same keys replace as in a small one (Python's
// equality: 1 == True == 1.0, a tuple by its items, str and bytes apart), across SETITEMS batches, and the
// kinds Python cannot hash are refused.
TEST(Unpickler, LargeDictsReplaceEqualKeysAsSmallOnesDo) {
  auto str = [](const std::string& t) { return "\x8c"s + static_cast<char>(t.size()) + t; };
  auto small_int = [](int v) { return "K"s + static_cast<char>(v); };
  const std::string one_float = "G\x3f\xf0\x00\x00\x00\x00\x00\x00"s;
  std::string p = "}(";
  for (int k = 0; k < 40; ++k) p += str("k" + std::to_string(k)) + small_int(k);
  p += small_int(1) + small_int(41) + "u(";  // key 1 (int)
  p += str("k5") + small_int(100);           // replaces "k5"
  p += "\x88" + small_int(101);              // True: key 1
  p += one_float + small_int(102);           // 1.0: key 1
  p += "C\x02k5" + small_int(103);           // bytes b"k5": a key of its own
  p += "(" + str("a") + small_int(1) + "t" + small_int(104);  // ("a", 1)
  p += "(" + str("a") + one_float + "t" + small_int(105);     // ("a", 1.0): the same
  p += "(" + str("a") + small_int(2) + "t" + small_int(106);  // ("a", 2): another
  p += "Nq\x00"s + small_int(107) + "h\x00"s + small_int(108);  // None twice (memoized)
  p += "u.";
  auto d = load(p);
  ASSERT_TRUE(d->is(Kind::Dict));
  ASSERT_EQ(d->entries.size(), 45u);  // 40 names, 1, b"k5", two tuples, None
  EXPECT_EQ(d->at("k5")->i, 100);
  EXPECT_EQ(d->entries[5].first->s, "k5");
  EXPECT_EQ(d->at("k39")->i, 39);
  EXPECT_EQ(d->entries[40].first->kind, Kind::Int);  // the first spelling of key 1 stays
  EXPECT_EQ(d->entries[40].second->i, 102);
  EXPECT_EQ(d->entries[41].first->kind, Kind::Bytes);
  EXPECT_EQ(d->entries[41].second->i, 103);
  EXPECT_EQ(d->entries[42].second->i, 105);
  EXPECT_EQ(d->entries[43].second->i, 106);
  EXPECT_EQ(d->entries[44].second->i, 108);
  std::string unhashable = "}(";
  for (int k = 0; k < 20; ++k) unhashable += str("k" + std::to_string(k)) + small_int(k);
  EXPECT_REFUSED(unhashable + "]K\x01u."s, "unhashable dict key of type list");
}

TEST(Unpickler, MemoPutThenGetReturnsTheSameObject) {
  // [x, x] with x = [] memoized by BINPUT 0 and fetched by BINGET 0.
  auto v = load(
      "](]q\x00h\x00"
      "e."sv);
  ASSERT_EQ(v->items.size(), 2u);
  EXPECT_EQ(v->items[0].get(), v->items[1].get());
  // LONG_BINPUT / LONG_BINGET, text PUT / GET, MEMOIZE (numbers entries in order).
  auto l = load("(]r\x0c\x00\x00\x00j\x0c\x00\x00\x00t."sv);
  EXPECT_EQ(l->items[0].get(), l->items[1].get());
  auto p = load("(]p7\ng7\nt."sv);
  EXPECT_EQ(p->items[0].get(), p->items[1].get());
  auto m = load("\x80\x04(]\x94}\x94h\x01h\x00t."sv);  // memo 0 = [], memo 1 = {}
  ASSERT_EQ(m->items.size(), 4u);
  EXPECT_TRUE(m->items[2]->is(Kind::Dict));
  EXPECT_EQ(m->items[2].get(), m->items[1].get());
  EXPECT_EQ(m->items[3].get(), m->items[0].get());
  // DUP shares too; POP and POP_MARK drop.
  auto d = load("(]2t."sv);
  EXPECT_EQ(d->items[0].get(), d->items[1].get());
  EXPECT_EQ(load("K\x01K\x02"
                 "0."sv)
                ->i,
            1);
  EXPECT_EQ(load("K\x01(K\x02K\x03"
                 "1."sv)
                ->i,
            1);
}

TEST(Unpickler, MemoErrors) {
  EXPECT_REFUSED("h\x03."sv, "memo key 3 not found");
  EXPECT_REFUSED("K\x01r\xff\xff\x00\x00."sv, "memo index 65535 beyond the pickle's 8 bytes");
  EXPECT_REFUSED("K\x01px\n."sv, "bad PUT index");
  EXPECT_REFUSED("gx\n."sv, "bad GET index");
  EXPECT_REFUSED("q\x00."sv, "stack underflow");  // PUT of an empty stack
}

// Memo indices far past the entries so far are kept aside, and moved in with the dense ones once those reach
// them: every GET finds what its PUT stored.
TEST(Unpickler, SparseAndDenseMemoIndicesAreFoundAlike) {
  auto le32 = [](uint32_t v) {
    std::string b(4, '\0');
    for (int k = 0; k < 4; ++k) b[k] = static_cast<char>((v >> (8 * k)) & 0xff);
    return b;
  };
  std::string p = "(\x8c\x01Zr"s + le32(5000);  // far ahead of any entry: aside
  for (uint32_t i = 0; i < 2000; ++i) p += "K\x01r"s + le32(i) + "0";
  p += "K\x02r"s + le32(4500) + "0" + "K\x03r"s + le32(4600) + "0";  // the dense range passes 5000
  const std::string puts = p;
  p += "j"s + le32(5000) + "j" + le32(4600) + "j" + le32(4500) + "h\x00"s + "t.";
  auto v = load(p);
  ASSERT_EQ(v->items.size(), 5u);
  EXPECT_EQ(v->items[1]->s, "Z");
  EXPECT_EQ(v->items[1].get(), v->items[0].get());
  EXPECT_EQ(v->items[2]->i, 3);
  EXPECT_EQ(v->items[3]->i, 2);
  EXPECT_EQ(v->items[4]->i, 1);
  EXPECT_REFUSED(puts + "j"s + le32(4999) + "t.", "memo key 4999 not found");
}

TEST(Unpickler, FramesAreLengthHintsOnly) {
  auto v = load("\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x02hi\x94."sv);
  EXPECT_EQ(v->s, "hi");
  // Two frames in a row, the second after the first one's bytes.
  auto two = load(
      "\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00]\x94\x95\x03\x00\x00\x00\x00\x00\x00\x00K\x01"
      "a."sv);
  ASSERT_EQ(two->items.size(), 1u);
  EXPECT_REFUSED("\x80\x04\x95\x05\x00\x00"sv, "truncated: needs 8 more bytes, 3 left");
}

TEST(Unpickler, PersistentIdsGoToTheLoader) {
  UnpickleOptions o;
  std::vector<ValuePtr> seen;
  o.persistent_load = [&](const ValuePtr& pid) {
    seen.push_back(pid);
    return Value::str("loaded");
  };
  auto v = load(
      "(\x8c\x07storageK\x02\x86Q"
      "Pabc\nt."sv,
      o);
  ASSERT_EQ(seen.size(), 2u);
  ASSERT_TRUE(seen[0]->is(Kind::Tuple));
  EXPECT_EQ(seen[0]->items[0]->s, "storage");
  EXPECT_EQ(seen[0]->items[1]->i, 2);
  EXPECT_EQ(seen[1]->s, "abc");  // PERSID: the line as a string
  EXPECT_EQ(v->items[0]->s, "loaded");
  EXPECT_REFUSED("K\x01Q."sv, "persistent id found but no persistent loader given");
  // A loader's error gets the file's name and position; one already naming the file is kept as is.
  o.persistent_load = [](const ValuePtr&) -> ValuePtr { throw Error("no record 'data/9'"); };
  std::string msg = refusal("K\x01Q."sv, o);
  EXPECT_EQ(msg, "t.pkl: pickle: no record 'data/9' (at byte 2)");
  o.persistent_load = [](const ValuePtr&) -> ValuePtr { fail("t.pkl", "record data/9 is short"); };
  EXPECT_EQ(refusal("K\x01Q."sv, o), "t.pkl: record data/9 is short");
}

TEST(Unpickler, RebuildTensorV2MakesAViewOfTheStorage) {
  // offset 2, size (2, 3), stride (1, 2), requires_grad True, OrderedDict() as backward hooks.
  auto o = with_storage(10);
  auto v = load(rebuild_v2("K\x02"sv, "K\x02K\x03\x86"sv, "K\x01K\x02\x86"sv,
                           "\x88"
                           "ccollections\nOrderedDict\n)Rtq\x00R."sv),
                o);
  ASSERT_TRUE(v->is(Kind::Tensor));
  const Tensor& t = v->as_tensor();
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(t.storage_offset(), 2);
  EXPECT_EQ(t.storage()->numel(), 10);
  EXPECT_TRUE(t.requires_grad);
  EXPECT_FALSE(t.is_parameter);
  // Offset 5 + (2-1)*1 + (3-1)*2 = 10: one past the 10-element storage.
  std::string msg = refusal(rebuild_v2("K\x05"sv, "K\x02K\x03\x86"sv, "K\x01K\x02\x86"sv, "\x89)tR."), o);
  EXPECT_NE(msg.find("bad tensor"), std::string::npos) << msg;
  msg = refusal(rebuild_v2("K\x00"sv, "K\x02\x85"sv, "K\x01\x85"sv, "K\x01)tR."), o);
  EXPECT_NE(msg.find("requires_grad is a int, not a bool"), std::string::npos) << msg;
  msg = refusal("ctorch._utils\n_rebuild_tensor_v2\n(K\x01K\x02tR."sv, o);
  EXPECT_NE(msg.find("expects at least 4 arguments"), std::string::npos) << msg;
  msg = refusal("ctorch._utils\n_rebuild_tensor_v2\n(K\x01K\x00)K\x01\x85tR."sv, o);
  EXPECT_NE(msg.find("first argument is not a storage"), std::string::npos) << msg;
}

TEST(Unpickler, ParametersSizesAndDtypes) {
  auto o = with_storage(4);
  std::string p = "ctorch._utils\n_rebuild_parameter\n(";
  p += rebuild_v2("K\x00"sv, "K\x04\x85"sv, "K\x01\x85"sv, "\x89)tR").substr(2);  // the tensor, protocol header dropped
  p += "\x88"
       ")tR.";
  auto v = load(p, o);
  ASSERT_TRUE(v->is(Kind::Tensor));
  EXPECT_TRUE(v->as_tensor().is_parameter);
  EXPECT_TRUE(v->as_tensor().requires_grad);
  EXPECT_EQ(v->as_tensor().shape(), (std::vector<int64_t>{4}));

  auto size = load("ctorch\nSize\nK\x02K\x03\x86\x85R."sv);
  ASSERT_TRUE(size->is(Kind::Shape));
  EXPECT_EQ(size->shape, (std::vector<int64_t>{2, 3}));
  auto dt = load("ctorch\nbfloat16\n."sv);
  ASSERT_TRUE(dt->is(Kind::Dtype));
  EXPECT_EQ(dt->dtype, DType::BFloat16);
  EXPECT_EQ(load("ctorch\nhalf\n."sv)->dtype, DType::Float16);
  EXPECT_REFUSED("ctorch\nSize\n(K\x02tR."sv, "torch.Size expects one tuple");
  EXPECT_REFUSED("ctorch._utils\n_rebuild_sparse_tensor\n)R."sv, "unsupported sparse tensor");
}

// torch >= 2.0 constructs: _rebuild_tensor_v3 (untyped storage + dtype), _rebuild_from_type_v2 (a tensor
// with Python attributes) and _rebuild_parameter_with_state.
TEST(Unpickler, Torch2TensorConstructs) {
  UnpickleOptions o;
  o.persistent_load = [](const ValuePtr&) {  // an UntypedStorage of 4 bytes: bfloat16 1.0, 2.0
    auto s = Storage::owned(DType::UInt8, {0x80, 0x3f, 0x00, 0x40});
    return Value::of_tensor(Tensor(s, 0, {4}, {1}));
  };
  const std::string v3_args = "(U\x07storageQK\x00K\x02\x85K\x01\x85\x89)ctorch\nbfloat16\nt"s;
  auto v3 = load("ctorch._utils\n_rebuild_tensor_v3\n" + v3_args + "R.", o);
  ASSERT_TRUE(v3->is(Kind::Tensor));
  EXPECT_EQ(v3->as_tensor().dtype(), DType::BFloat16);
  EXPECT_EQ(v3->as_tensor().to_vector<uint16_t>(), (std::vector<uint16_t>{0x3f80, 0x4000}));
  std::string msg = refusal(
      "ctorch._utils\n_rebuild_tensor_v3\n(U\x07storageQK\x00K\x02\x85K\x01\x85\x89)"
      "ctorch\nfloat8_e4m3fn\ntR."s,
      o);
  EXPECT_NE(msg.find("_rebuild_tensor_v3: unsupported dtype <torch.float8_e4m3fn>"), std::string::npos) << msg;
  msg = refusal("ctorch._utils\n_rebuild_tensor_v3\n(K\x01tR."s, o);
  EXPECT_NE(msg.find("_rebuild_tensor_v3 expects at least 7 arguments"), std::string::npos) << msg;

  // _rebuild_from_type_v2(_rebuild_tensor_v3, torch.Tensor, v3's arguments, {'ds_id': '0_29'})
  const std::string typed =
      "ctorch._tensor\n_rebuild_from_type_v2\n(ctorch._utils\n_rebuild_tensor_v3\nctorch\nTensor\n" + v3_args +
      "}\x8c\x05"
      "ds_id\x8c\x04"
      "0_29stR.";
  auto t = load(typed, o);
  ASSERT_TRUE(t->is(Kind::Tensor));
  EXPECT_EQ(t->as_tensor().numel(), 2);
  ASSERT_TRUE(t->tensor_type);
  EXPECT_EQ(t->tensor_type->class_path(), "torch.Tensor");
  EXPECT_EQ(t->tensor_state->at("ds_id")->s, "0_29");
  msg = refusal(
      "ctorch._tensor\n_rebuild_from_type_v2\n(K\x01"
      "ctorch\nTensor\n)}tR."s,
      o);
  EXPECT_NE(msg.find("_rebuild_from_type_v2: first argument is not a function"), std::string::npos) << msg;
  msg = refusal("ctorch._tensor\n_rebuild_from_type_v2\n(K\x01tR."s, o);
  EXPECT_NE(msg.find("_rebuild_from_type_v2 expects 4 arguments"), std::string::npos) << msg;

  // _rebuild_parameter_with_state(tensor, True, OrderedDict(), {'x': 1})
  const std::string param = "ctorch._utils\n_rebuild_parameter_with_state\n(ctorch._utils\n_rebuild_tensor_v3\n" +
                            v3_args +
                            "R\x88"
                            "ccollections\nOrderedDict\n)R}\x8c\x01xK\x01stR.";
  auto p = load(param, o);
  ASSERT_TRUE(p->is(Kind::Tensor));
  EXPECT_TRUE(p->as_tensor().is_parameter);
  EXPECT_TRUE(p->as_tensor().requires_grad);
  EXPECT_FALSE(p->tensor_type);
  EXPECT_EQ(p->tensor_state->at("x")->i, 1);
}

TEST(Unpickler, BuiltinsAndOrderedDicts) {
  auto od = load(
      "ccollections\nOrderedDict\n)R(\x8c\x01"
      "bK\x01\x8c\x01"
      "aK\x02u."sv);
  ASSERT_TRUE(od->is(Kind::Dict));
  EXPECT_TRUE(od->ordered);
  EXPECT_EQ(od->entries[0].first->s, "b");
  auto s = load("c__builtin__\nset\n(K\x01K\x02l\x85R."sv);
  EXPECT_TRUE(s->is(Kind::Set));
  EXPECT_EQ(s->items.size(), 2u);
  // Protocol 2 writes bytes as _codecs.encode(latin-1 text, 'latin1').
  auto b = load(
      "c_codecs\nencode\n\x8c\x03"
      "a\xc3\xbf\x8c\x06latin1\x86R."sv);
  ASSERT_TRUE(b->is(Kind::Bytes));
  EXPECT_EQ(b->s, "a\xff");
  EXPECT_TRUE(load("c__builtin__\nbytes\n)R."sv)->is(Kind::Bytes));
  EXPECT_REFUSED("c_codecs\nencode\n\x8c\x02\xc4\x80\x8c\x06latin1\x86R."sv, "character outside latin-1");
}

TEST(Unpickler, UnknownClassesStayOpaqueObjects) {
  // argparse.Namespace via NEWOBJ, then BUILD with its attributes, and a SETITEM applied to it.
  auto v = load(
      "\x80\x02"
      "cargparse\nNamespace\n)\x81}\x8c\x02lrG\x3f\xf0\x00\x00\x00\x00\x00\x00sb\x8c\x01kK\x01s."sv);
  ASSERT_TRUE(v->is(Kind::Object));
  EXPECT_EQ(v->class_path(), "argparse.Namespace");
  EXPECT_EQ(v->object->build, pickle::Object::Build::NewObj);
  EXPECT_EQ(v->attr("lr")->f, 1.0);
  ASSERT_EQ(v->object->dict_items.size(), 1u);
  EXPECT_EQ(v->object->dict_items[0].second->i, 1);
  // STACK_GLOBAL, REDUCE with arguments, NEWOBJ_EX with kwargs.
  auto r = load(
      "\x8c\x08"
      "datetime"
      "\x8c\x04"
      "date"
      "\x93M\xe8\x07K\x01K\x02\x87R."sv);
  EXPECT_EQ(r->class_path(), "datetime.date");
  EXPECT_EQ(r->object->args->items[0]->i, 2024);
  auto ex = load("cpathlib\nPosixPath\n)}\x92."sv);
  EXPECT_EQ(ex->object->build, pickle::Object::Build::NewObjEx);
  EXPECT_TRUE(ex->object->kwargs->is(Kind::Dict));
  // INST and OBJ (protocol 0/1 instance opcodes).
  EXPECT_EQ(load("(K\x01ipathlib\nPurePath\n."sv)->class_path(), "pathlib.PurePath");
  EXPECT_EQ(load("(cpathlib\nPurePath\nK\x01o."sv)->object->args->items.size(), 1u);
}

TEST(Unpickler, HostileCallsAndClassesAreRefused) {
  EXPECT_REFUSED("cmypkg.evil\nRun\n)R."sv, "class mypkg.evil.Run: module 'mypkg.evil' is not under");
  EXPECT_REFUSED("K\x01)R."sv, "REDUCE of a value that cannot be called");
  EXPECT_REFUSED("cargparse\nNamespace\nK\x01R."sv, "REDUCE arguments are not a tuple");
  EXPECT_REFUSED("cargparse\nNamespace\nK\x01\x81."sv, "NEWOBJ arguments are not a tuple");
  EXPECT_REFUSED("K\x01K\x02\x93."sv, "STACK_GLOBAL expects two strings");
  EXPECT_REFUSED("(o."sv, "OBJ without a class");
  EXPECT_REFUSED("K\x01}b."sv, "BUILD on a int");
  EXPECT_REFUSED("\xff."sv, "unknown opcode 0xff");
  EXPECT_REFUSED("\x80\x06."sv, "unsupported pickle protocol 6");
  EXPECT_REFUSED("\x82\x01."sv, "EXT1/2/4");
  EXPECT_REFUSED("\x97."sv, "out-of-band buffers");
  EXPECT_REFUSED("\x98."sv, "out-of-band buffers");
}

TEST(Unpickler, StackAndMarkErrorsNameTheOpcodesByte) {
  EXPECT_EQ(refusal("K\x01K\x02"
                    "a."sv),
            "t.pkl: pickle: APPEND on a int (at byte 4)");
  EXPECT_REFUSED("0."sv, "stack underflow");
  EXPECT_REFUSED("."sv, "stack underflow");
  EXPECT_REFUSED("K\x01t."sv, "MARK expected but not found");
  EXPECT_REFUSED("K\x01"sv, "truncated: needs 1 more bytes, 0 left");
  EXPECT_REFUSED(
      "X\xff\xff\xff\x7f"
      "abc"sv,
      "truncated: needs 2147483647 more bytes, 3 left");
  EXPECT_REFUSED("\x8e\xff\xff\xff\xff\xff\xff\xff\xff."sv, "truncated");
}

TEST(Unpickler, EveryTruncationOfARealPickleIsRefused) {
  // A protocol-2 pickle with a tensor, memo, dict, object and strings: every proper prefix fails with
  // an Error (never a crash or a value).
  std::string full = rebuild_v2("K\x00"sv, "K\x02K\x02\x86"sv, "K\x02K\x01\x86"sv,
                                "\x89"
                                "ccollections\nOrderedDict\n)Rtq\x01R");
  full = std::string("\x80\x02}q\x00(\x8c\x01wq\x02"sv) + full.substr(2) + std::string("\x8c\x01nh\x02u."sv);
  auto o = with_storage(4);
  auto v = load(full, o);
  ASSERT_EQ(v->entries.size(), 2u);
  EXPECT_EQ(v->at("n")->s, "w");
  for (size_t n = 0; n < full.size(); ++n) {
    std::string msg = refusal(std::string_view(full).substr(0, n), o);
    EXPECT_EQ(msg.rfind("t.pkl: pickle: ", 0), 0u) << n << ": " << msg;
  }
}

TEST(Unpickler, NestingDeeperThanTheLimitIsRefused) {
  UnpickleOptions o;
  o.max_depth = 10;
  std::string deep;
  for (int k = 0; k < 12; ++k) deep += "]";
  for (int k = 0; k < 11; ++k) deep += "a";
  deep += ".";
  std::string msg = refusal(deep, o);
  EXPECT_NE(msg.find("nesting deeper than 10 levels"), std::string::npos) << msg;
  std::string ok;
  for (int k = 0; k < 9; ++k) ok += "]";
  for (int k = 0; k < 8; ++k) ok += "a";
  ok += ".";
  EXPECT_TRUE(load(ok, o)->is(Kind::List));
  std::string marks(11, '(');
  msg = refusal(marks, o);
  EXPECT_NE(msg.find("more than 10 MARKs open at once"), std::string::npos) << msg;
}

TEST(Unpickler, MemoryBudgetRefusesBombs) {
  UnpickleOptions o;
  o.max_memory = 4096;
  // A list of 100 new dicts: each new value counts its struct, far past 4 KiB.
  std::string bomb = "](";
  for (int k = 0; k < 100; ++k) bomb += "}";
  bomb += "e.";
  std::string msg = refusal(bomb, o);
  EXPECT_NE(msg.find("a memory bomb, or damage"), std::string::npos) << msg;
  o.max_memory = 0;  // the default budget (64 MiB + 48 x size) takes it
  EXPECT_EQ(load(bomb, o)->items.size(), 100u);
}

TEST(Unpickler, ReferenceCyclesAreRefused) {
  // l = []; l.append(l)
  EXPECT_REFUSED(
      "]q\x00h\x00"
      "a."sv,
      "reference cycle");
  // A shared (acyclic) value is fine.
  EXPECT_EQ(load("]q\x00(h\x00h\x00t."sv)->items.size(), 2u);
}

TEST(Unpickler, ConsumedCountsUpToStopSoPicklesCanFollowEachOther) {
  std::string_view two = "K\x01.K\x02."sv;
  size_t consumed = 0;
  EXPECT_EQ(load(two, {}, &consumed)->i, 1);
  EXPECT_EQ(consumed, 3u);
  EXPECT_EQ(load(two.substr(consumed), {}, &consumed)->i, 2);
  EXPECT_EQ(consumed, 3u);
}

TEST(Unpickler, DictItemsHookMayReplaceValuesAndSparseMemoStillResolves) {
  UnpickleOptions o;
  size_t calls = 0;
  o.on_dict_items = [&](std::vector<ValuePtr>& kv, std::vector<ValuePtr>& dropped) {
    ++calls;
    for (size_t k = 1; k < kv.size(); k += 2)
      if (kv[k]->is(Kind::Str)) {
        dropped.push_back(kv[k]);
        kv[k] = Value::integer(static_cast<int64_t>(kv[k]->s.size()));
      }
  };
  // {'a': 'xyz', 'b': [memo 1 fetched twice]} with memo 2 never fetched.
  auto v = load(
      "\x80\x02}q\x00(\x8c\x01"
      "a\x8c\x03xyzq\x02\x8c\x01"
      "b]q\x01h\x01\x86u."sv,
      o);
  EXPECT_EQ(calls, 1u);
  EXPECT_EQ(v->at("a")->i, 3);
  const auto& pair = v->at("b");
  ASSERT_EQ(pair->items.size(), 2u);
  EXPECT_EQ(pair->items[0].get(), pair->items[1].get());
}

TEST(Unpickler, PicklesWrittenByPythonAtEveryProtocol) {
  const std::string dir = ucpkit::testing::scratch_dir("unpickler_python");
  const std::string script = R"(
import collections, pickle, sys
shared = [1, 2]
v = {'i': -3, 'big': 2**70, 'f': 0.5, 's': 'h\u00e9', 'b': b'\x00\xff', 't': (True, None),
     'l': [shared, shared], 'set': {7}, 'od': collections.OrderedDict([('z', 1)])}
for p in range(6):
    open(sys.argv[1] + '/p%d.pkl' % p, 'wb').write(pickle.dumps(v, protocol=p))
)";
  std::ofstream(dir + "/w.py") << script;
  std::string out;
  ASSERT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + dir + "/w.py " + dir, &out), 0) << out;
  for (int p = 0; p < 6; ++p) {
    SCOPED_TRACE("protocol " + std::to_string(p));
    const std::string bytes = ucpkit::testing::file_bytes(dir + "/p" + std::to_string(p) + ".pkl");
    ASSERT_FALSE(bytes.empty());
    size_t consumed = 0;
    auto v = load(bytes, {}, &consumed);
    EXPECT_EQ(consumed, bytes.size());
    EXPECT_EQ(v->at("i")->i, -3);
    ASSERT_TRUE(v->at("big")->is(Kind::BigInt));
    EXPECT_EQ(v->at("big")->s, std::string("\0\0\0\0\0\0\0\0\x40", 9));  // 2**70 in 9 bytes
    EXPECT_EQ(v->at("f")->f, 0.5);
    EXPECT_EQ(v->at("s")->s, "h\xc3\xa9");
    EXPECT_EQ(v->at("b")->s, "\x00\xff"sv);
    EXPECT_TRUE(v->at("t")->items[0]->b);
    EXPECT_TRUE(v->at("t")->items[1]->is_none());
    EXPECT_EQ(v->at("l")->items[0].get(), v->at("l")->items[1].get());
    EXPECT_EQ(v->at("set")->items.at(0)->i, 7);
    EXPECT_TRUE(v->at("od")->ordered);
    EXPECT_EQ(v->at("od")->at("z")->i, 1);
  }
}

}  // namespace pickle_unpickler_test
