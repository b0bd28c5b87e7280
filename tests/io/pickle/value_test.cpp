// lib/io/pickle/value: the Value tree's constructors, dict and attribute access, conversions (ints from
// bools, big ints and enum objects; fragment addresses; shapes), class paths through copyreg and
// getattr, repr, deep_copy and release_tree. Expected values are written by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "io/pickle/value.h"
#include "support/errors.h"

namespace pickle_value_test {

using namespace ucpkit;
using pickle::Kind;
using pickle::Object;
using pickle::Value;
using pickle::ValuePtr;

namespace {

std::string thrown(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

ValuePtr big(std::string le_bytes) {
  auto v = Value::integer(0);
  v->kind = Kind::BigInt;
  v->s = std::move(le_bytes);
  return v;
}

}  // namespace

TEST(Value, ConstructorsSetKindAndPayload) {
  EXPECT_TRUE(Value::none()->is_none());
  EXPECT_TRUE(Value::boolean(true)->b);
  EXPECT_EQ(Value::integer(-5)->i, -5);
  EXPECT_EQ(Value::real(0.5)->f, 0.5);
  EXPECT_EQ(Value::str("s")->kind, Kind::Str);
  EXPECT_EQ(Value::bytes("b")->kind, Kind::Bytes);
  EXPECT_TRUE(Value::list()->is_sequence());
  EXPECT_TRUE(Value::tuple()->is_sequence());
  EXPECT_FALSE(Value::set()->is_sequence());
  EXPECT_TRUE(Value::dict(true)->ordered);
  EXPECT_EQ(Value::torch_size({2, 3})->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Value::torch_dtype(DType::BFloat16)->dtype, DType::BFloat16);
  auto g = Value::global("torch", "FloatStorage");
  EXPECT_EQ(g->s, "torch");
  EXPECT_EQ(g->name, "FloatStorage");
  auto t = Value::of_tensor(Tensor::zeros(DType::Float32, {2}));
  EXPECT_EQ(t->as_tensor().numel(), 2);
  auto o = Value::make_object("argparse", "Namespace", nullptr, nullptr, Object::Build::NewObj);
  ASSERT_TRUE(o->object);
  EXPECT_TRUE(o->object->args->is(Kind::Tuple));  // null args become ()
  EXPECT_EQ(o->object->build, Object::Build::NewObj);
  EXPECT_FALSE(o->object->state);
}

TEST(Value, KindNamesArePythonLike) {
  EXPECT_EQ(pickle::kind_name(Kind::None), "None");
  EXPECT_EQ(pickle::kind_name(Kind::BigInt), "int (big)");
  EXPECT_EQ(pickle::kind_name(Kind::Dict), "dict");
  EXPECT_EQ(pickle::kind_name(Kind::Shape), "torch.Size");
  EXPECT_EQ(pickle::kind_name(Kind::Dtype), "torch.dtype");
  EXPECT_EQ(pickle::kind_name(Kind::Object), "object");
}

TEST(Value, DictAccessByStringKeys) {
  auto d = Value::dict();
  d->set_item("a", Value::integer(1));
  d->set_item("b", Value::integer(2));
  d->set_item("a", Value::integer(3));  // replaces in place
  ASSERT_EQ(d->entries.size(), 2u);
  EXPECT_EQ(d->entries[0].first->s, "a");
  EXPECT_EQ(d->entries[0].second->i, 3);
  EXPECT_TRUE(d->contains("b"));
  EXPECT_EQ(d->get("zz"), nullptr);
  EXPECT_EQ(d->at("b")->i, 2);
  EXPECT_EQ(thrown([&] { d->at("zz"); }), "missing key 'zz'");
  // Non-string keys are not found by string lookups.
  d->entries.emplace_back(Value::integer(7), Value::str("seven"));
  EXPECT_EQ(d->get("7"), nullptr);
  EXPECT_TRUE(d->erase("a"));
  EXPECT_FALSE(d->erase("a"));
  EXPECT_EQ(d->entries.size(), 2u);
  auto l = Value::list();
  EXPECT_EQ(l->get("a"), nullptr);
  EXPECT_EQ(thrown([&] { l->at("a"); }), "expected a dict holding 'a', found list");
  EXPECT_EQ(thrown([&] { l->set_item("a", Value::none()); }), "set_item on a list");
  EXPECT_EQ(pickle::entry_of(nullptr, "a"), nullptr);
  EXPECT_EQ(pickle::entry_of(d, "b")->i, 2);
}

TEST(Value, AttributesLiveInTheObjectsState) {
  auto ns = Value::make_object("argparse", "Namespace", Value::tuple(), nullptr);
  EXPECT_EQ(ns->attr("lr"), nullptr);
  ns->set_attr("lr", Value::real(0.1));  // creates the state dict
  ASSERT_TRUE(ns->object->state);
  EXPECT_EQ(ns->attr("lr")->f, 0.1);
  // (dict, slots) state, as for classes with __slots__: both parts are searched.
  auto slots = Value::dict();
  slots->set_item("s", Value::integer(4));
  auto st = Value::dict();
  st->set_item("d", Value::integer(5));
  auto obj = Value::make_object("m", "C", nullptr, Value::tuple({st, slots}));
  EXPECT_EQ(obj->attr("d")->i, 5);
  EXPECT_EQ(obj->attr("s")->i, 4);
  obj->set_attr("d", Value::integer(6));  // into the dict part
  EXPECT_EQ(st->at("d")->i, 6);
  auto odd = Value::make_object("m", "C", nullptr, Value::integer(1));
  EXPECT_EQ(thrown([&] { odd->set_attr("x", Value::none()); }), "object m.C has no attribute dict");
  EXPECT_EQ(thrown([] { Value::integer(1)->set_attr("x", Value::none()); }), "set_attr on a int");
  EXPECT_EQ(Value::dict()->attr("x"), nullptr);
}

TEST(Value, ClassPathSeesThroughCopyregAndGetattr) {
  EXPECT_EQ(Value::global("torch", "Size")->class_path(), "torch.Size");
  EXPECT_EQ(Value::make_object("argparse", "Namespace", nullptr, nullptr)->class_path(), "argparse.Namespace");
  auto cls = Value::global("megatron.model.enums", "AttnMaskType");
  EXPECT_EQ(Value::make_object("copyreg", "_reconstructor", Value::tuple({cls}), nullptr)->class_path(),
            "megatron.model.enums.AttnMaskType");
  EXPECT_EQ(Value::make_object("copyreg", "__newobj__", Value::tuple({cls}), nullptr)->class_path(),
            "megatron.model.enums.AttnMaskType");
  EXPECT_EQ(Value::make_object("builtins", "getattr", Value::tuple({cls, Value::str("causal")}), nullptr)->class_path(),
            "megatron.model.enums.AttnMaskType");
  // getattr of a non-class keeps its own path.
  EXPECT_EQ(Value::make_object("builtins", "getattr", Value::tuple({Value::integer(1)}), nullptr)->class_path(),
            "builtins.getattr");
  EXPECT_EQ(Value::integer(1)->class_path(), "int");
}

TEST(Value, AsIntAcceptsBoolsBigIntsThatFitAndIntEnums) {
  EXPECT_EQ(Value::boolean(true)->as_int(), 1);
  EXPECT_EQ(big("")->as_int(), 0);
  EXPECT_EQ(big("\xff")->as_int(), -1);  // sign-extended
  EXPECT_EQ(big(std::string("\x00\x80", 2))->as_int(), -32768);
  EXPECT_EQ(big(std::string("\xff\x00", 2))->as_int(), 255);
  EXPECT_EQ(big(std::string("\x00\x00\x00\x00\x00\x00\x00\x80", 8))->as_int(), INT64_MIN);
  EXPECT_EQ(thrown([] { big(std::string(9, '\x01'))->as_int(); }), "integer does not fit in 64 bits");
  // ZeroStageEnum(2) (Python < 3.11) and getattr(ZeroStageEnum, 'weights') (3.11+).
  auto enum_cls = Value::global("deepspeed.runtime.zero.config", "ZeroStageEnum");
  EXPECT_EQ(
      Value::make_object("deepspeed.runtime.zero.config", "ZeroStageEnum", Value::tuple({Value::integer(2)}), nullptr)
          ->as_int(),
      2);
  EXPECT_EQ(
      Value::make_object("builtins", "getattr", Value::tuple({enum_cls, Value::str("weights")}), nullptr)->as_int(), 3);
  EXPECT_EQ(
      Value::make_object("builtins", "getattr", Value::tuple({enum_cls, Value::str("disabled")}), nullptr)->as_int(),
      0);
  // An enum rebuilt with its state: _value_.
  auto st = Value::dict();
  st->set_item("_value_", Value::integer(9));
  EXPECT_EQ(Value::make_object("m", "E", nullptr, st)->as_int(), 9);
  EXPECT_EQ(thrown([] { Value::str("x")->as_int(); }), "expected an int, found str 'x'");
}

TEST(Value, OtherConversionsRefuseOtherKinds) {
  EXPECT_EQ(Value::integer(3)->as_float(), 3.0);
  EXPECT_EQ(Value::boolean(true)->as_float(), 1.0);
  EXPECT_EQ(thrown([] { Value::str("x")->as_float(); }), "expected a float, found str");
  EXPECT_TRUE(Value::integer(2)->as_bool());
  EXPECT_FALSE(Value::integer(0)->as_bool());
  EXPECT_EQ(thrown([] { Value::real(1)->as_bool(); }), "expected a bool, found float");
  EXPECT_EQ(Value::str("s")->as_str(), "s");
  EXPECT_EQ(thrown([] { Value::bytes("s")->as_str(); }), "expected a str, found bytes");
  EXPECT_EQ(Value::tuple({Value::integer(4), Value::boolean(true)})->as_shape(), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(Value::torch_size({5})->as_shape(), (std::vector<int64_t>{5}));
  EXPECT_EQ(thrown([] { Value::dict()->as_shape(); }), "expected a shape, found dict");
  EXPECT_EQ(thrown([] { Value::none()->as_tensor(); }), "expected a tensor, found None");
}

TEST(Value, FragmentAddressFromAttributesArgumentsOrPair) {
  auto st = Value::dict();
  st->set_item("numel", Value::integer(10));
  st->set_item("start", Value::integer(20));
  auto by_state = Value::make_object("deepspeed.utils.tensor_fragment", "fragment_address", nullptr, st);
  EXPECT_EQ(by_state->as_fragment_address(), (std::pair<int64_t, int64_t>{10, 20}));
  auto by_args = Value::make_object("deepspeed.utils.tensor_fragment", "fragment_address",
                                    Value::tuple({Value::integer(3), Value::integer(4)}), nullptr);
  EXPECT_EQ(by_args->as_fragment_address(), (std::pair<int64_t, int64_t>{3, 4}));
  EXPECT_EQ(Value::tuple({Value::integer(5), Value::integer(6)})->as_fragment_address(),
            (std::pair<int64_t, int64_t>{5, 6}));
  EXPECT_EQ(thrown([] { Value::list({Value::integer(1)})->as_fragment_address(); }),
            "expected a fragment_address, found list");
}

TEST(Value, ReprIsShortAndDepthLimited) {
  auto d = Value::dict(true);
  d->set_item("t", Value::of_tensor(Tensor::zeros(DType::Float16, {2, 3})));
  d->set_item("n", Value::list({Value::list({Value::integer(1)})}));
  d->set_item("s", Value::torch_size({4}));
  EXPECT_EQ(d->repr(3), "OrderedDict{'t': tensor(float16, [2, 3]), 'n': [[1]], 's': torch.Size([4])}");
  EXPECT_EQ(d->repr(1), "OrderedDict{'t': tensor(float16, [2, 3]), 'n': [...], 's': torch.Size([4])}");
  EXPECT_EQ(d->repr(0), "OrderedDict{...}");
  std::vector<ValuePtr> many;
  for (int k = 0; k < 10; ++k) many.push_back(Value::integer(k));
  EXPECT_EQ(Value::tuple(many)->repr(), "(0, 1, 2, 3, 4, 5, 6, 7, ... (10 items))");
  EXPECT_EQ(Value::str(std::string(70, 'a'))->repr(), "'" + std::string(60, 'a') + "...'");
  EXPECT_EQ(Value::bytes("abc")->repr(), "b<3 bytes>");
  EXPECT_EQ(big("123456789")->repr(), "<int of 9 bytes>");
  EXPECT_EQ(Value::global("torch", "Size")->repr(), "<torch.Size>");
  EXPECT_EQ(Value::make_object("argparse", "Namespace", nullptr, nullptr)->repr(), "<argparse.Namespace object>");
  EXPECT_EQ(Value::torch_dtype(DType::BFloat16)->repr(), "torch.bfloat16");
  auto fs = Value::set({Value::boolean(false), Value::none()});
  fs->kind = Kind::FrozenSet;
  EXPECT_EQ(fs->repr(), "frozenset({False, None})");
}

TEST(Value, DeepCopyCopiesContainersKeepsSharingAndTensorsStorages) {
  auto shared = Value::list({Value::integer(1)});
  auto t = Value::of_tensor(Tensor::zeros(DType::Float32, {2}));
  auto st = Value::dict();
  st->set_item("k", shared);
  auto obj = Value::make_object("m", "C", Value::tuple({shared}), st);
  auto root = Value::dict();
  root->set_item("a", shared);
  root->set_item("b", shared);
  root->set_item("t", t);
  root->set_item("o", obj);
  auto c = pickle::deep_copy(root);
  ASSERT_NE(c.get(), root.get());
  EXPECT_NE(c->at("a").get(), shared.get());
  EXPECT_EQ(c->at("a").get(), c->at("b").get());  // one copy for one shared value
  EXPECT_EQ(c->at("o")->object->args->items[0].get(), c->at("a").get());
  EXPECT_NE(c->at("o")->object.get(), obj->object.get());
  EXPECT_NE(c->at("t")->tensor.get(), t->tensor.get());
  EXPECT_EQ(c->at("t")->tensor->storage(), t->tensor->storage());  // storages stay shared
  c->at("a")->items.push_back(Value::integer(2));
  EXPECT_EQ(shared->items.size(), 1u);  // the original is untouched
  // A cycle is copied as a cycle.
  auto cyc = Value::list();
  cyc->items.push_back(cyc);
  auto cc = pickle::deep_copy(cyc);
  EXPECT_EQ(cc->items[0].get(), cc.get());
  pickle::release_tree(cyc);
  pickle::release_tree(cc);
  EXPECT_EQ(pickle::deep_copy(nullptr), nullptr);
}

TEST(Value, ReleaseTreeFreesVeryDeepAndCyclicTreesWithoutRecursion) {
  // One million nested lists: a recursive destructor would overflow the stack.
  auto root = Value::list();
  ValuePtr at = root;
  for (int k = 0; k < 1000000; ++k) {
    auto next = Value::list();
    at->items.push_back(next);
    at = next;
  }
  std::weak_ptr<Value> leaf = at;
  at.reset();
  pickle::release_tree(std::move(root));
  EXPECT_TRUE(leaf.expired());
  auto cyc = Value::dict();
  cyc->entries.emplace_back(Value::str("self"), cyc);
  std::weak_ptr<Value> w = cyc;
  pickle::release_tree(std::move(cyc));
  EXPECT_TRUE(w.expired());
  pickle::release_tree(nullptr);
}

}  // namespace pickle_value_test
