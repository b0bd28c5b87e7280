// Real torch 2.x files (tests/io/torch2_real: made with torch 2.11 on the GPU machine, see its README)
// read value by value against the truth torch 2.11 computed, their tensor attributes
// (_rebuild_from_type_v2 / _rebuild_parameter_with_state state) checked, and written back: the
// written file is compared with the original by tests/io/torch2_writeback.py (symbolic pickle call
// trees, zip records, torch 1.13 torch.load values) and read back by ucpkit.
#include <cstdlib>
#include <filesystem>

#include "truth_check.h"

namespace iotest {
namespace torch2_real_test {
namespace {

std::string real(const std::string& name) { return std::string(UCPKIT_SOURCE_DIR) + "/tests/io/torch2_real/" + name; }

// "$['a']['b'][0]" -> the value at that path.
ValuePtr at_path(const ValuePtr& root, const std::string& path) {
  ValuePtr v = root;
  size_t p = 1;
  while (p < path.size() && v) {
    if (path.compare(p, 2, "['") == 0) {
      size_t e = path.find("']", p + 2);
      v = v->get(path.substr(p + 2, e - p - 2));
      p = e + 2;
    } else if (path[p] == '[') {
      size_t e = path.find(']', p);
      v = v->items.at(std::stoul(path.substr(p + 1, e - p - 1)));
      p = e + 1;
    } else {
      return nullptr;
    }
  }
  return v;
}

// truth.py (torch 2.11) describes str and float subclasses as their base type and a meta tensor as a
// tensor without storage; ucpkit keeps those as the objects they were pickled as (so they are
// written back unchanged). Each such pair is checked here, then both sides are replaced by the
// plain value for the Checker.
int substitute(ValuePtr& v, json& t) {
  int n = 0;
  const std::string type = t.at("t");
  if (type == "dict" && v->is(Kind::Dict) && t.at("entries").size() == v->entries.size()) {
    for (size_t k = 0; k < v->entries.size(); ++k) n += substitute(v->entries[k].second, t["entries"][k][1]);
  } else if ((type == "list" || type == "tuple") && v->is_sequence() && t.at("items").size() == v->items.size()) {
    for (size_t k = 0; k < v->items.size(); ++k) n += substitute(v->items[k], t["items"][k]);
  } else if (v->is(Kind::Object)) {
    const std::string cls = v->class_path();
    const auto& args = v->object->args->items;
    if (type == "str" && cls == "torch.torch_version.TorchVersion") {
      EXPECT_EQ(args.back()->as_str(), t.at("v").get<std::string>());  // NEWOBJ(cls, (str,))
      v = Value::str(args.back()->as_str());
      ++n;
    } else if (type == "float" && (cls == "numpy._core.multiarray.scalar" || cls == "numpy.core.multiarray.scalar")) {
      EXPECT_EQ(to_hex(args.at(1)->s), t.at("hex").get<std::string>());  // numpy.dtype('f8'), 8 raw bytes
      double d;
      std::memcpy(&d, args.at(1)->s.data(), 8);
      v = Value::real(d);
      ++n;
    } else if (type == "tensor" && t.value("device", "") == "meta" && cls == "torch._utils._rebuild_meta_tensor_no_storage") {
      EXPECT_EQ(std::string(ucpkit::dtype_name(args.at(0)->dtype)), t.at("dtype").get<std::string>());
      EXPECT_EQ(args.at(1)->as_shape(), t.at("shape").get<std::vector<int64_t>>());
      EXPECT_EQ(args.at(2)->as_shape(), t.at("strides").get<std::vector<int64_t>>());
      EXPECT_EQ(args.at(3)->as_bool(), t.at("requires_grad").get<bool>());
      v = Value::none();
      t = json{{"t", "none"}};
      ++n;
    }
  }
  return n;
}

void check_real(const std::string& file, const ucpkit::TorchFile& tf) {
  json truth = load_json(real(file + ".truth.json"));
  ValuePtr root = ucpkit::pickle::deep_copy(tf.root);
  const int substituted = substitute(root, truth["truth"]["value"]);
  if (file.find("values") != std::string::npos) EXPECT_EQ(substituted, 2) << file;
  if (file.find("meta") != std::string::npos) EXPECT_EQ(substituted, 1) << file;
  Checker c(truth.at("truth").at("storages"));
  c.check(root, truth.at("truth").at("value"), "$");
  EXPECT_TRUE(c.errors.empty()) << file << ": " << c.errors.size() << " differences\n" << c.report();
  EXPECT_EQ(c.storages_seen(), truth.at("truth").at("storages").size()) << file;
  // tensor attributes: Python reprs of each attribute, by path
  for (const auto& [path, attrs] : truth.at("tensor_attrs").items()) {
    ValuePtr t = at_path(root, path);
    ASSERT_TRUE(t && t->is(Kind::Tensor)) << file << " " << path;
    ASSERT_TRUE(t->tensor_state && t->tensor_state->is(Kind::Dict)) << file << " " << path << ": no attribute state";
    EXPECT_EQ(t->tensor_state->entries.size(), attrs.size()) << file << " " << path;
    for (const auto& [name, repr] : attrs.items()) {
      ValuePtr a = t->tensor_state->get(name);
      ASSERT_TRUE(a) << file << " " << path << "." << name;
      EXPECT_EQ(a->repr(), repr.get<std::string>()) << file << " " << path << "." << name;
    }
  }
}

const char* kFiles[] = {"torch2_values.pt", "torch2_values_legacy.pt", "torch2_meta.pt",
                        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"};

TEST(Torch2Real, ReadMatchesTorch211Truth) {
  for (const char* f : kFiles) {
    SCOPED_TRACE(f);
    check_real(f, ucpkit::load_torch_file(real(f)));
  }
}

// DeepSpeed ZeRO-3 under torch >= 2.0: every fp32_flat_groups entry is a
// _rebuild_from_type_v2(_rebuild_tensor_v2, torch.Tensor, args, {'ds_id': ...}) record.
TEST(Torch2Real, ZeroThreeFlatGroupsAreTensors) {
  auto root = ucpkit::load_torch(real("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  const auto& groups = root->at("optimizer_state_dict")->at("fp32_flat_groups");
  ASSERT_EQ(groups->items.size(), 2u);
  for (const auto& g : groups->items) {
    ASSERT_TRUE(g->is(Kind::Tensor));
    ASSERT_TRUE(g->tensor_type);
    EXPECT_EQ(g->tensor_type->class_path(), "torch.Tensor");
    EXPECT_TRUE(g->tensor->requires_grad);
    EXPECT_TRUE(g->tensor_state->get("ds_id"));
  }
}

TEST(Torch2Real, WriteBackKeepsRecordsAndValues) {
  const auto dir = std::filesystem::path(UCPKIT_BUILD_DIR) / "torch2_writeback";
  std::filesystem::create_directories(dir);
  for (const char* f : {"torch2_values.pt", "torch2_meta.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"}) {
    SCOPED_TRACE(f);
    auto tf = ucpkit::load_torch_file(real(f));
    const std::string out = (dir / f).string();
    ucpkit::TorchSaveOptions so;
    so.archive_prefix = tf.archive_prefix;
    ucpkit::save_torch_file(out, tf.root, so);
    check_real(f, ucpkit::load_torch_file(out));
    const std::string cmd = std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR + "/tests/io/torch2_writeback.py " +
                            real(f) + " " + out;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

}  // namespace
}  // namespace torch2_real_test
}  // namespace iotest
