// Compares a value tree read by ucpkit with the JSON ground truth written by tests/io/fixtures.py
// (encoding described in tests/io/truth.py). Header-only: shared by the io test files.
#pragma once
#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/dtype.h"
#include "io/pickle/value.h"
#include "io/tensor.h"
#include "io/torch/torch_file.h"

namespace iotest {

using json = nlohmann::json;
using ucpkit::DType;
using ucpkit::Tensor;
using ucpkit::pickle::Kind;
using ucpkit::pickle::Value;
using ucpkit::pickle::ValuePtr;

inline std::string fixture(const std::string& name) { return std::string(UCPKIT_FIXTURES_DIR) + "/" + name; }

inline json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path + " (did the fixtures_io test run?)");
  return json::parse(in);
}

inline json truth_of(const std::string& name) { return load_json(fixture(name + ".json")); }

inline std::string to_hex(const void* data, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string r(2 * n, '0');
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    r[2 * i] = d[p[i] >> 4];
    r[2 * i + 1] = d[p[i] & 15];
  }
  return r;
}
inline std::string to_hex(const std::string& s) { return to_hex(s.data(), s.size()); }

inline std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> r(h.size() / 2);
  for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return r;
}

// Little-endian two's complement without redundant sign bytes (Python's pickle encode_long form).
inline std::string canonical_le(std::string s) {
  while (!s.empty()) {
    uint8_t last = static_cast<uint8_t>(s.back());
    uint8_t prev_sign = s.size() >= 2 ? (static_cast<uint8_t>(s[s.size() - 2]) & 0x80) : 0;
    if ((last == 0x00 && !prev_sign && s.size() >= 2) || (last == 0xff && prev_sign && s.size() >= 2)) {
      s.pop_back();
    } else {
      break;
    }
  }
  if (s.size() == 1 && s[0] == 0) s.clear();
  return s;
}

inline DType dtype_of(const std::string& name) {
  auto d = ucpkit::dtype_from_name(name);
  if (!d) throw std::runtime_error("unknown dtype in truth: " + name);
  return *d;
}

// Logical (row-major) element bytes of a tensor.
inline std::string tensor_hex(const Tensor& t) {
  std::vector<uint8_t> buf(t.nbytes());
  t.copy_to(buf.data());
  return to_hex(buf.data(), buf.size());
}

// A tensor built from the truth alone (not through the reader): owned storage + view.
inline Tensor tensor_from_truth(const json& t, const json& storages) {
  const json& st = storages.at(t.at("storage").get<size_t>());
  auto storage = ucpkit::Storage::owned(dtype_of(st.at("dtype")), from_hex(st.at("hex")));
  return Tensor(storage, t.at("offset").get<int64_t>(), t.at("shape").get<std::vector<int64_t>>(),
                t.at("strides").get<std::vector<int64_t>>());
}

class Checker {
 public:
  explicit Checker(const json& storages) : storages_(storages) {}

  std::vector<std::string> errors;

  void check(const ValuePtr& v, const json& t, const std::string& path) {
    try {
      check_inner(v, t, path);
    } catch (const std::exception& e) {
      fail(path, std::string("exception while checking: ") + e.what());
    }
  }

  // How many distinct storages were seen (must equal the truth's count).
  size_t storages_seen() const { return by_storage_.size(); }

  std::string report(size_t max = 40) const {
    std::ostringstream o;
    for (size_t i = 0; i < errors.size() && i < max; ++i) o << "  " << errors[i] << "\n";
    if (errors.size() > max) o << "  ... " << errors.size() - max << " more\n";
    return o.str();
  }

 private:
  const json& storages_;
  std::map<size_t, const ucpkit::Storage*> by_group_;
  std::map<const ucpkit::Storage*, size_t> by_storage_;

  void fail(const std::string& path, const std::string& what) { errors.push_back(path + ": " + what); }

  bool expect_kind(const ValuePtr& v, Kind k, const std::string& path) {
    if (!v) {
      fail(path, "null value, expected " + std::string(ucpkit::pickle::kind_name(k)));
      return false;
    }
    if (v->kind != k) {
      fail(path, "kind " + std::string(ucpkit::pickle::kind_name(v->kind)) + " (" + v->repr(1) + "), expected " +
                     std::string(ucpkit::pickle::kind_name(k)));
      return false;
    }
    return true;
  }

  void check_items(const std::vector<ValuePtr>& items, const json& t, const std::string& path) {
    if (items.size() != t.size()) {
      fail(path, "length " + std::to_string(items.size()) + ", expected " + std::to_string(t.size()));
      return;
    }
    for (size_t i = 0; i < items.size(); ++i) check(items[i], t[i], path + "[" + std::to_string(i) + "]");
  }

  void check_inner(const ValuePtr& v, const json& t, const std::string& path) {
    const std::string type = t.at("t");
    if (type == "none") {
      expect_kind(v, Kind::None, path);
    } else if (type == "bool") {
      if (expect_kind(v, Kind::Bool, path) && v->b != t.at("v").get<bool>()) fail(path, "wrong bool");
    } else if (type == "int") {
      if (!v || (v->kind != Kind::Int && v->kind != Kind::BigInt)) {
        fail(path, "expected int " + t.at("v").get<std::string>() + ", found " + (v ? v->repr(1) : "null"));
      } else if (t.contains("i")) {
        int64_t want = t.at("i").get<int64_t>();
        if (v->as_int() != want) fail(path, "int " + std::to_string(v->as_int()) + ", expected " + std::to_string(want));
      } else if (v->kind != Kind::BigInt) {
        fail(path, "expected a big int " + t.at("v").get<std::string>() + ", found a 64-bit int " + std::to_string(v->i));
      } else {
        std::vector<uint8_t> wb = from_hex(t.at("le"));
        std::string want = canonical_le(std::string(wb.begin(), wb.end()));
        if (canonical_le(v->s) != want)
          fail(path, "big int bytes " + to_hex(v->s) + ", expected " + to_hex(want) + " (" +
                         t.at("v").get<std::string>() + ")");
      }
    } else if (type == "float") {
      if (expect_kind(v, Kind::Float, path)) {
        std::string got = to_hex(&v->f, sizeof(double));
        if (got != t.at("hex").get<std::string>())
          fail(path, "float bits " + got + " (" + std::to_string(v->f) + "), expected " + t.at("repr").get<std::string>());
      }
    } else if (type == "str") {
      if (expect_kind(v, Kind::Str, path) && v->s != t.at("v").get<std::string>())
        fail(path, "str '" + v->s.substr(0, 80) + "', expected '" + t.at("v").get<std::string>().substr(0, 80) + "'");
    } else if (type == "bytes") {
      if (expect_kind(v, Kind::Bytes, path) && to_hex(v->s) != t.at("hex").get<std::string>())
        fail(path, "bytes differ (" + std::to_string(v->s.size()) + " bytes)");
    } else if (type == "list" || type == "tuple") {
      if (expect_kind(v, type == "list" ? Kind::List : Kind::Tuple, path)) check_items(v->items, t.at("items"), path);
    } else if (type == "set" || type == "frozenset") {
      if (expect_kind(v, type == "set" ? Kind::Set : Kind::FrozenSet, path)) check_set(v->items, t.at("items"), path);
    } else if (type == "dict") {
      if (!expect_kind(v, Kind::Dict, path)) return;
      if (v->ordered != t.at("ordered").get<bool>())
        fail(path, std::string("dict read as ") + (v->ordered ? "OrderedDict" : "dict") + ", expected the other");
      const json& entries = t.at("entries");
      if (v->entries.size() != entries.size()) {
        fail(path, "dict has " + std::to_string(v->entries.size()) + " entries, expected " +
                       std::to_string(entries.size()));
        return;
      }
      for (size_t i = 0; i < entries.size(); ++i) {
        std::string key_repr = entries[i][0].value("t", "") == "str" ? entries[i][0].at("v").get<std::string>()
                                                                      : "#" + std::to_string(i);
        check(v->entries[i].first, entries[i][0], path + ".key(" + key_repr + ")");
        check(v->entries[i].second, entries[i][1], path + "." + key_repr);
      }
      // "attrs" (e.g. a state_dict's _metadata) has no place in a Dict value: checked by the round trip.
    } else if (type == "shape") {
      if (expect_kind(v, Kind::Shape, path) && v->shape != t.at("v").get<std::vector<int64_t>>())
        fail(path, "wrong torch.Size " + v->repr(1));
    } else if (type == "dtype") {
      if (expect_kind(v, Kind::Dtype, path) && std::string(ucpkit::dtype_name(v->dtype)) != t.at("v").get<std::string>())
        fail(path, "dtype " + std::string(ucpkit::dtype_name(v->dtype)) + ", expected " + t.at("v").get<std::string>());
    } else if (type == "tensor") {
      if (expect_kind(v, Kind::Tensor, path)) check_tensor(*v->tensor, t, path);
    } else if (type == "global") {
      if (expect_kind(v, Kind::Global, path) && v->class_path() != t.at("v").get<std::string>())
        fail(path, "global " + v->class_path() + ", expected " + t.at("v").get<std::string>());
    } else if (type == "enum") {
      check_enum(v, t, path);
    } else if (type == "object") {
      check_object(v, t, path);
    } else {
      fail(path, "unknown truth type " + type);
    }
  }

  void check_set(const std::vector<ValuePtr>& items, const json& t, const std::string& path) {
    if (items.size() != t.size()) {
      fail(path, "set of " + std::to_string(items.size()) + " items, expected " + std::to_string(t.size()));
      return;
    }
    std::vector<bool> used(items.size(), false);
    for (size_t i = 0; i < t.size(); ++i) {
      bool found = false;
      for (size_t j = 0; j < items.size() && !found; ++j) {
        if (used[j]) continue;
        Checker sub(storages_);
        sub.check(items[j], t[i], path);
        if (sub.errors.empty()) used[j] = found = true;
      }
      if (!found) fail(path, "set item " + t[i].dump().substr(0, 80) + " not found");
    }
  }

  void check_tensor(const Tensor& x, const json& t, const std::string& path) {
    std::string want_dtype = t.at("dtype");
    if (std::string(ucpkit::dtype_name(x.dtype())) != want_dtype)
      fail(path, "dtype " + std::string(ucpkit::dtype_name(x.dtype())) + ", expected " + want_dtype);
    if (x.shape() != t.at("shape").get<std::vector<int64_t>>()) fail(path, "shape differs");
    if (x.strides() != t.at("strides").get<std::vector<int64_t>>()) fail(path, "strides differ");
    if (x.storage_offset() != t.at("offset").get<int64_t>())
      fail(path, "storage offset " + std::to_string(x.storage_offset()) + ", expected " + t.at("offset").dump());
    if (x.requires_grad != t.at("requires_grad").get<bool>()) fail(path, "requires_grad differs");
    if (x.is_parameter != t.at("parameter").get<bool>()) fail(path, "is_parameter differs");
    if (!x.storage()) {
      fail(path, "tensor without storage");
      return;
    }
    size_t group = t.at("storage");
    const ucpkit::Storage* s = x.storage().get();
    auto g = by_group_.find(group);
    if (g == by_group_.end()) {
      if (by_storage_.count(s)) {
        fail(path, "shares a Storage with storage #" + std::to_string(by_storage_[s]) + " but should not");
      } else {
        by_group_[group] = s;
        by_storage_[s] = group;
        const json& st = storages_.at(group);
        if (x.storage()->numel() != st.at("numel").get<int64_t>())
          fail(path, "storage numel " + std::to_string(x.storage()->numel()) + ", expected " + st.at("numel").dump());
        else if (to_hex(x.storage()->bytes().data(), x.storage()->bytes().size()) != st.at("hex").get<std::string>())
          fail(path, "storage bytes differ");
      }
    } else if (g->second != s) {
      fail(path, "does not share the Storage of the other views of storage #" + std::to_string(group));
    }
    if (x.shape() == t.at("shape").get<std::vector<int64_t>>() && tensor_hex(x) != t.at("hex").get<std::string>())
      fail(path, "element bytes differ");
  }

  void check_enum(const ValuePtr& v, const json& t, const std::string& path) {
    if (!expect_kind(v, Kind::Object, path)) return;
    int64_t want = t.at("int");
    try {
      if (v->as_int() != want) fail(path, "enum as_int() " + std::to_string(v->as_int()) + ", expected " + std::to_string(want));
    } catch (const std::exception& e) {
      fail(path, "enum as_int() threw: " + std::string(e.what()) + " (" + v->repr(2) + ")");
    }
    // Python <= 3.10 pickles cls(value); 3.11 pickles getattr(cls, name): either names the class.
    std::string cls = t.at("class");
    bool getattr_form = v->object && v->object->args && v->object->args->items.size() == 2 &&
                        v->object->args->items[0]->kind == Kind::Global &&
                        v->object->args->items[0]->class_path() == cls;
    if (v->class_path() != cls && !getattr_form) fail(path, "enum class " + v->class_path() + ", expected " + cls);
  }

  void check_object(const ValuePtr& v, const json& t, const std::string& path) {
    if (!expect_kind(v, Kind::Object, path)) return;
    std::string cls = t.at("class");
    if (v->class_path() != cls) fail(path, "class " + v->class_path() + ", expected " + cls);
    if (!v->object) {
      fail(path, "object without Object");
      return;
    }
    const auto& o = *v->object;
    // Constructor arguments (without the class for NEWOBJ / copyreg.__newobj__).
    if (o.args) {
      std::vector<ValuePtr> args = o.args->items;
      if (o.callable && o.callable->class_path() == "copyreg.__newobj__" && !args.empty()) args.erase(args.begin());
      check_items(args, t.at("args"), path + ".args");
    } else if (!t.at("args").empty()) {
      fail(path, "no constructor arguments");
    }
    if (t.contains("state")) {
      check(o.state, t.at("state"), path + ".state");
      // attr() must see every field of a dict state
      const json& st = t.at("state");
      if (st.at("t") == "dict")
        for (const auto& e : st.at("entries"))
          if (e[0].at("t") == "str") {
            std::string name = e[0].at("v");
            ValuePtr a = v->attr(name);
            if (!a) fail(path, "attr('" + name + "') is null");
          }
    } else if (o.state && !o.state->is_none()) {
      fail(path, "unexpected state " + o.state->repr(1));
    }
  }
};

// Loads fixture `name` (its .pt named in the truth) and compares everything with the truth.
inline void check_fixture(const std::string& name) {
  json truth = truth_of(name);
  ucpkit::TorchFile tf = ucpkit::load_torch_file(fixture(truth.at("file")));
  EXPECT_EQ(tf.container, truth.at("container") == "zip" ? ucpkit::TorchContainer::Zip : ucpkit::TorchContainer::Legacy);
  if (truth.at("container") == "zip") EXPECT_EQ(tf.archive_prefix, truth.at("prefix").get<std::string>());
  Checker c(truth.at("storages"));
  c.check(tf.root, truth.at("value"), "$");
  EXPECT_TRUE(c.errors.empty()) << name << ": " << c.errors.size() << " differences\n" << c.report();
  EXPECT_EQ(c.storages_seen(), truth.at("storages").size()) << name << ": distinct storages";
}

}  // namespace iotest
