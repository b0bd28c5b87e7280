// lib/io/pickle/pickler: Value trees pickled by ucpkit and loaded by Python's own pickle module (or
// torch.load for tensors), checked there with Python expressions (tests/io/check_pickle.py). What
// torch_write_test.cpp does not cover: one value referenced twice comes back as one Python object
// (memo), cycles, memo indices past 255, APPENDS / SETITEMS batches of 1000, every byte value in
// bytes, integer opcode boundaries, shared tensors, sizes and dtypes; and the pickler's errors.
#include <gtest/gtest.h>

#include <climits>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/pickle/pickler.h"
#include "io/torch/torch_file.h"
#include "support/process.h"

namespace pickle_pickler_test {

using namespace ucpkit;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// Writes `data` and `checks` (one Python expression per line) and runs the independent reader.
void expect_python_agrees(const std::string& name, const std::string& file, const std::vector<std::string>& checks,
                          bool torch) {
  const std::string list = file + ".checks";
  std::ofstream out(list);
  for (const auto& c : checks) out << c << "\n";
  out.close();
  std::string output;
  const int rc = ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR + "/tests/io/check_pickle.py " +
                                          ucpkit::testing::quote(file) + " " + ucpkit::testing::quote(list) + (torch ? " --torch" : ""),
                                      &output);
  EXPECT_EQ(rc, 0) << name << ":\n" << output;
}

// Pickles `root` alone (no tensors) into a file and checks it with Python's pickle.load.
void expect_pickle_loads(const std::string& name, const ValuePtr& root, const std::vector<std::string>& checks) {
  const std::string file = ucpkit::testing::scratch_dir("pickler_" + name) + "/x.pkl";
  const std::string bytes = pickle::pickle(root, {});
  std::ofstream(file, std::ios::binary) << bytes;
  expect_python_agrees(name, file, checks, false);
}

ValuePtr ints(std::initializer_list<int64_t> v) {
  auto l = Value::list();
  for (auto i : v) l->items.push_back(Value::integer(i));
  return l;
}

ValuePtr namespace_object(ValuePtr state) {  // argparse.Namespace(**state), as pickle writes it
  return Value::make_object("argparse", "Namespace", Value::tuple(), std::move(state), pickle::Object::Build::NewObj);
}

}  // namespace

TEST(Pickler, SharedValuesComeBackAsOneObject) {
  auto list = Value::list({Value::integer(1), Value::str("s")});
  auto dict = Value::dict();
  dict->set_item("k", Value::integer(2));
  auto odict = Value::dict(true);
  odict->set_item("z", Value::integer(1));
  odict->set_item("a", Value::integer(2));
  auto tuple = Value::tuple({Value::integer(7), list});
  auto bytes = Value::bytes(std::string("\x00\x01\xfe\xff", 4));
  auto set = Value::set({Value::integer(1), Value::integer(2)});
  auto ns_state = Value::dict();
  ns_state->set_item("a", Value::integer(1));
  auto ns = namespace_object(ns_state);
  auto root = Value::dict();
  for (const char* k : {"a", "b"}) root->set_item(k, list);
  root->set_item("equal_not_same", Value::list({Value::integer(1), Value::str("s")}));
  for (const char* k : {"t1", "t2"}) root->set_item(k, tuple);
  for (const char* k : {"d1", "d2"}) root->set_item(k, dict);
  for (const char* k : {"od1", "od2"}) root->set_item(k, odict);
  for (const char* k : {"by1", "by2"}) root->set_item(k, bytes);
  for (const char* k : {"set1", "set2"}) root->set_item(k, set);
  for (const char* k : {"ns1", "ns2"}) root->set_item(k, ns);
  root->set_item("nested", Value::list({list, Value::tuple({dict, ns})}));
  expect_pickle_loads("shared", root,
                      {"x['a'] == [1, 's'] and x['a'] is x['b']",
                       "x['equal_not_same'] == x['a'] and x['equal_not_same'] is not x['a']",
                       "x['t1'] == (7, [1, 's']) and x['t1'] is x['t2'] and x['t1'][1] is x['a']",
                       "x['d1'] == {'k': 2} and x['d1'] is x['d2']",
                       "type(x['od1']).__name__ == 'OrderedDict' and list(x['od1'].items()) == [('z', 1), ('a', 2)]",
                       "x['od1'] is x['od2']",
                       "x['by1'] == bytes([0, 1, 254, 255]) and x['by1'] is x['by2']",
                       "x['set1'] == {1, 2} and type(x['set1']) is set and x['set1'] is x['set2']",
                       "type(x['ns1']).__module__ == 'argparse' and vars(x['ns1']) == {'a': 1}",
                       "x['ns1'] is x['ns2']",
                       "x['nested'][0] is x['a'] and x['nested'][1][0] is x['d1'] and x['nested'][1][1] is x['ns1']"});
}

TEST(Pickler, CyclesThroughListsDictsAndObjects) {
  auto list = Value::list({Value::integer(5)});
  list->items.push_back(list);
  auto dict = Value::dict();
  dict->set_item("self", dict);
  auto state = Value::dict();
  auto ns = namespace_object(state);
  state->set_item("me", ns);
  state->set_item("l", list);
  auto root = Value::dict();
  root->set_item("l", list);
  root->set_item("d", dict);
  root->set_item("ns", ns);
  expect_pickle_loads("cycles", root,
                      {"x['l'][0] == 5 and x['l'][1] is x['l']", "x['d']['self'] is x['d']",
                       "x['ns'].me is x['ns'] and x['ns'].l is x['l']"});
  list->items.clear();  // break the cycles
  dict->entries.clear();
  state->entries.clear();
}

TEST(Pickler, LongMemoIndicesAndLargeBatches) {
  // 300 lists each referenced twice: memo indices past 255 (LONG_BINPUT / LONG_BINGET); lists and
  // dicts longer than one APPENDS / SETITEMS batch of 1000, with a last batch of one item.
  auto shared = Value::list();
  std::vector<ValuePtr> lists;
  for (int i = 0; i < 300; ++i) lists.push_back(ints({i}));
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& l : lists) shared->items.push_back(l);
  auto big = Value::list(), odd = Value::list();
  for (int i = 0; i < 2500; ++i) big->items.push_back(Value::integer(i));
  for (int i = 0; i < 1001; ++i) odd->items.push_back(Value::integer(i));
  auto map = Value::dict(), omap = Value::dict(true);
  for (int i = 0; i < 2001; ++i) {
    map->set_item(std::to_string(i), Value::integer(i));
    omap->set_item(std::to_string(2000 - i), Value::integer(i));
  }
  auto root = Value::dict();
  root->set_item("shared", shared);
  root->set_item("big", big);
  root->set_item("odd", odd);
  root->set_item("map", map);
  root->set_item("omap", omap);
  expect_pickle_loads("long_memo", root,
                      {"len(x['shared']) == 600 and all(x['shared'][i] == [i] for i in range(300))",
                       "all(x['shared'][i] is x['shared'][i + 300] for i in range(300))",
                       "len({id(v) for v in x['shared']}) == 300",
                       "any(op.name == 'LONG_BINGET' for op, _, _ in pickletools.genops(raw))",
                       "x['big'] == list(range(2500)) and x['odd'] == list(range(1001))",
                       "x['map'] == {str(i): i for i in range(2001)}",
                       "list(x['omap'].items()) == [(str(2000 - i), i) for i in range(2001)]"});
}

TEST(Pickler, BytesAndIntegerBoundaries) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  auto root = Value::dict();
  root->set_item("all", Value::bytes(all));
  root->set_item("empty", Value::bytes(""));
  root->set_item("high", Value::bytes("\x80"));
  // The edges of BININT1, BININT2, BININT and LONG1, both signs.
  const std::vector<int64_t> edges = {0, 255, 256, 65535, 65536, -1, -255, -256, -65536, INT32_MAX,
                                      int64_t{INT32_MAX} + 1, INT32_MIN, int64_t{INT32_MIN} - 1, int64_t{1} << 40,
                                      -(int64_t{1} << 40), int64_t{1} << 55, -(int64_t{1} << 55), 0x7f00000000000000,
                                      INT64_MAX, INT64_MIN, INT64_MIN + 1};
  auto l = Value::list();
  std::string expect = "x['ints'] == [";
  for (auto v : edges) {
    l->items.push_back(Value::integer(v));
    expect += std::to_string(v) + ", ";
  }
  expect += "]";
  root->set_item("ints", l);
  expect_pickle_loads("bytes_ints", root,
                      {"x['all'] == bytes(range(256)) and type(x['all']) is bytes", "x['empty'] == b''",
                       "x['high'] == b'\\x80'", expect});
}

TEST(Pickler, SharedTensorsSizesAndDtypesThroughTorchLoad) {
  std::vector<float> vals(12);
  for (int i = 0; i < 12; ++i) vals[static_cast<size_t>(i)] = static_cast<float>(i) - 2.5f;
  Tensor base = Tensor::from_vector(DType::Float32, {3, 4}, vals);
  auto t = Value::of_tensor(base);
  auto view = Value::of_tensor(base.narrow(1, 1, 2));  // another tensor of the same storage
  Tensor p = Tensor::from_vector(DType::Float32, {2}, std::vector<float>{1.0f, 2.0f});
  p.is_parameter = true;
  p.requires_grad = true;
  auto param = Value::of_tensor(p);
  Tensor g = Tensor::from_vector(DType::Float32, {1}, std::vector<float>{3.0f});
  g.requires_grad = true;
  auto size = Value::torch_size({3, 4});
  auto root = Value::dict(true);
  for (const char* k : {"t1", "t2"}) root->set_item(k, t);
  root->set_item("in_list", Value::list({t, view, param}));
  root->set_item("view", view);
  root->set_item("p1", param);
  root->set_item("p2", param);
  root->set_item("grad", Value::of_tensor(g));
  root->set_item("s1", size);
  root->set_item("s2", size);
  root->set_item("dt", Value::torch_dtype(DType::BFloat16));
  const std::string file = ucpkit::testing::scratch_dir("pickler_tensors") + "/x.pt";
  save_torch_file(file, root);
  expect_python_agrees("tensors", file,
                       {"x['t1'] is x['t2'] and x['in_list'][0] is x['t1']",
                        "x['t1'].tolist() == [[i * 4 + j - 2.5 for j in range(4)] for i in range(3)]",
                        "x['view'] is x['in_list'][1] and x['view'] is not x['t1']",
                        "x['view'].storage().data_ptr() == x['t1'].storage().data_ptr()",
                        "x['view'].storage_offset() == 1 and x['view'].stride() == (4, 1) and x['view'].shape == (3, 2)",
                        "x['view'].tolist() == [[i * 4 + j - 2.5 for j in (1, 2)] for i in range(3)]",
                        "isinstance(x['p1'], torch.nn.Parameter) and x['p1'].requires_grad and x['p1'] is x['p2']",
                        "x['in_list'][2] is x['p1'] and x['p1'].tolist() == [1.0, 2.0]",
                        "x['grad'].requires_grad and not isinstance(x['grad'], torch.nn.Parameter)",
                        "type(x['s1']) is torch.Size and x['s1'] == (3, 4) and x['s1'] is x['s2']",
                        "x['dt'] is torch.bfloat16", "type(x).__name__ == 'OrderedDict'"},
                       true);
}

TEST(Pickler, ErrorsNamedTensorWithoutStorageWriterNullAndDepth) {
  auto t = Value::of_tensor(Tensor::zeros(DType::Float32, {2}));
  EXPECT_THROW(pickle::pickle(Value::list({t}), {}), Error);
  EXPECT_THROW(pickle::pickle(Value::list({Value::integer(1), nullptr}), {}), Error);
  // 2000 nested saves are fine, 2001 are refused.
  auto nest = [](int lists) {
    ValuePtr v = Value::integer(0);
    for (int k = 0; k < lists; ++k) v = Value::list({v});
    return v;
  };
  EXPECT_NO_THROW(pickle::pickle(nest(1999), {}));
  try {
    pickle::pickle(nest(2000), {});
    ADD_FAILURE() << "no error for 2001 nested values";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nested too deeply"), std::string::npos) << e.what();
  }
}

TEST(PickleStream, PiecesWriteWhatSaveWritesForTheValuesTheyStandFor) {
  // The pieces a DCP `.metadata` is written with (formats/dcp/writer.cpp) against save() of the Values they stand
  // for: a shared class Global and shared Strs (memoized once, 300 texts: memo indices past 255), an unshared
  // torch.Size, ints of each width; both orders of first use.
  pickle::PickleOptions po;
  po.memoize_repeats = true;
  pickle::PickleStream pieces(po), values(po);
  // Shared: held twice (as the writer's pool and the objects made from it held them), so a transient save memoizes
  // them.
  const ValuePtr cls = Value::global("m.n", "C"), cls_user = cls;
  std::vector<ValuePtr> texts;
  for (int k = 0; k < 300; ++k) texts.push_back(Value::str("t" + std::to_string(k)));
  const std::vector<ValuePtr> text_users = texts;
  const ValuePtr empty = Value::tuple(), empty_user = empty;
  pickle::PickleStream::MemoRef cls_ref, empty_ref;
  std::vector<pickle::PickleStream::MemoRef> text_refs(300);
  for (int round = 0; round < 2; ++round) {
    for (int k = 0; k < 300; ++k) {
      pieces.global_value("m.n", "C", cls_ref);
      values.save(cls, true);
      if (k % 2) pieces.str(std::string(texts[k]->s));  // a copy: memoized by its text
      else pieces.str(texts[k]->s, text_refs[k]);       // by its text the first time (round 0), by the ref after
      values.save(texts[k], true);
      pieces.save_shared(empty, empty_ref);
      values.save(empty, true);
      const std::vector<int64_t> dims{k, 70000, -5};
      pieces.size(dims);
      values.save(Value::torch_size(dims), true);
      for (int64_t v : {int64_t{7}, int64_t{300}, int64_t{70000}, int64_t{1} << 40}) {
        pieces.integer(v);
        values.save(Value::integer(v), true);
      }
      pieces.op(pickle::Op::POP);
      values.op(pickle::Op::POP);
    }
  }
  EXPECT_EQ(pieces.finish(), values.finish());
}

}  // namespace pickle_pickler_test
