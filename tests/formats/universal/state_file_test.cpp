// formats/universal/state_file: the zero/<param>/<state>.pt dict. The files read are written by Python's
// torch.save in DeepSpeed's forms and key orders (state_files.py, citing ds_to_universal.py); what the
// writer writes is loaded back by Python's torch.load and must be the same value, key order included.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "formats/universal/state_file.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"
#include "support/process.h"

namespace universal_state_file_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::universal::read_state_file;
using formats::universal::StateFile;
using formats::universal::to_pickle;

namespace {

const std::string kScript = std::string(UCPKIT_SOURCE_DIR) + "/tests/formats/universal/state_files.py";

// The folder of Python-written state files (written once per test binary run).
const std::string& python_files() {
  static const std::string dir = [] {
    const std::string d = ucpkit::testing::scratch_dir("state_file_python");
    std::string out;
    const int rc = ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + kScript + " " + d, &out);
    if (rc != 0) throw std::runtime_error("state_files.py failed:\n" + out);
    return d;
  }();
  return dir;
}

StateFile read(const std::string& name) {
  const std::string path = python_files() + "/" + name;
  return read_state_file(load_torch_file(path).root, path);
}

std::vector<float> values(const Tensor& t) {
  const auto b = t.contiguous().contiguous_bytes();
  const float* p = reinterpret_cast<const float*>(b.data());
  return std::vector<float>(p, p + t.numel());
}

std::vector<float> iota(int n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  return v;
}

}  // namespace

TEST(StateFile, ReadsEveryFormDeepSpeedWrites) {
  auto f = read("cat_dim1.pt");
  EXPECT_FALSE(f.bare);
  EXPECT_EQ(f.cat_dim, 1);
  EXPECT_FALSE(f.param_n_sub_params || f.sub_param_shape || f.vocab_tensor || f.ep_num_experts);
  EXPECT_EQ(f.param.shape(), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(values(f.param), iota(24));

  f = read("two_sub_params.pt");
  EXPECT_EQ(f.cat_dim, 0);
  EXPECT_EQ(f.param_n_sub_params, 2);

  f = read("sub_params_tuple.pt");
  ASSERT_TRUE(f.sub_param_shape);
  EXPECT_FALSE(f.cat_dim);
  EXPECT_EQ(f.sub_param_shape->patterns, std::vector<std::string>{R"(.*query_key_value\.weight$)"});
  EXPECT_TRUE(f.sub_param_shape->sizes_as_tuple);
  EXPECT_EQ(f.sub_param_shape->sub_sizes, (std::vector<int64_t>{8, 4, 4}));
  EXPECT_EQ(f.sub_param_shape->shape, (std::vector<int64_t>{16, -1}));  // as PatternSet::from_json reads it
  EXPECT_EQ(f.sub_param_shape->partition_dim, 0);

  f = read("sub_params_count.pt");
  ASSERT_TRUE(f.sub_param_shape);
  EXPECT_FALSE(f.sub_param_shape->sizes_as_tuple);
  EXPECT_EQ(f.sub_param_shape->sub_sizes.size(), 3u);
  EXPECT_EQ(f.sub_param_shape->patterns, (std::vector<std::string>{"a", "b"}));

  f = read("vocab.pt");
  EXPECT_TRUE(f.vocab_tensor);
  EXPECT_EQ(f.cat_dim, 0);

  f = read("replicated.pt");
  EXPECT_FALSE(f.cat_dim || f.param_n_sub_params || f.sub_param_shape || f.vocab_tensor || f.ep_num_experts);
  EXPECT_EQ(values(f.param), iota(3));

  f = read("expert.pt");
  EXPECT_EQ(f.ep_num_experts, 4);
  EXPECT_EQ(f.cat_dim, 0);
  EXPECT_EQ(f.param.shape(), (std::vector<int64_t>{4, 2, 3}));

  f = read("bare.pt");
  EXPECT_TRUE(f.bare);
  EXPECT_EQ(values(f.param), iota(7));
}

// Every Python-written file, read and written again, loads in Python as the same value (keys in the
// same order); and reading what was written gives the same struct.
TEST(StateFile, WritesWhatPythonWrote) {
  const std::string out = ucpkit::testing::scratch_dir("state_file_written");
  std::string pairs;
  for (const char* name : {"cat_dim1.pt", "two_sub_params.pt", "sub_params_tuple.pt", "sub_params_count.pt",
                           "vocab.pt", "replicated.pt", "expert.pt", "bare.pt"}) {
    SCOPED_TRACE(name);
    const StateFile f = read(name);
    const std::string ours = out + "/" + name;
    save_torch_file(ours, to_pickle(f));
    pairs += " " + ours + " " + python_files() + "/" + name;
    const StateFile back = read_state_file(load_torch_file(ours).root, ours);
    EXPECT_EQ(back.bare, f.bare);
    EXPECT_EQ(back.cat_dim, f.cat_dim);
    EXPECT_EQ(back.param_n_sub_params, f.param_n_sub_params);
    EXPECT_EQ(back.vocab_tensor, f.vocab_tensor);
    EXPECT_EQ(back.ep_num_experts, f.ep_num_experts);
    ASSERT_EQ(back.sub_param_shape.has_value(), f.sub_param_shape.has_value());
    if (f.sub_param_shape) {
      EXPECT_EQ(back.sub_param_shape->patterns, f.sub_param_shape->patterns);
      EXPECT_EQ(back.sub_param_shape->shape, f.sub_param_shape->shape);
      EXPECT_EQ(back.sub_param_shape->sub_sizes, f.sub_param_shape->sub_sizes);
      EXPECT_EQ(back.sub_param_shape->sizes_as_tuple, f.sub_param_shape->sizes_as_tuple);
      EXPECT_EQ(back.sub_param_shape->partition_dim, f.sub_param_shape->partition_dim);
    }
    EXPECT_TRUE(back.param.equal(f.param));
  }
  std::string log;
  EXPECT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + kScript + " --same" + pairs, &log), 0) << log;
}

// The key order is DeepSpeed's for each form, whatever order the fields were set in.
TEST(StateFile, KeyOrderIsDeepSpeeds) {
  const auto keys = [](const pickle::ValuePtr& d) {
    std::vector<std::string> k;
    for (const auto& [key, v] : d->entries) k.push_back(key->as_str());
    return k;
  };
  StateFile f;
  f.param = Tensor::from_vector<float>(DType::Float32, {2}, {1, 2});
  f.vocab_tensor = true;
  f.cat_dim = 0;
  EXPECT_EQ(keys(to_pickle(f)), (std::vector<std::string>{"cat_dim", "vocab_tensor", "param"}));  // :447-457
  f.param_n_sub_params = 2;
  EXPECT_EQ(keys(to_pickle(f)), (std::vector<std::string>{"cat_dim", "param_n_sub_params", "vocab_tensor", "param"}));
  StateFile e;
  e.param = f.param;
  e.ep_num_experts = 8;
  EXPECT_EQ(keys(to_pickle(e)), (std::vector<std::string>{"param", "cat_dim", "is_expert_param", "ep_num_experts"}));
  EXPECT_EQ(to_pickle(e)->get("cat_dim")->i, 0);  // :713, whatever cat_dim says
}

TEST(StateFile, DamagedFilesAreRefusedNamingTheFile) {
  const auto error_of = [](const std::string& name) {
    const std::string path = python_files() + "/" + name;
    const auto root = load_torch_file(path).root;
    return ucpkit::testing::error_of([&] { (void)read_state_file(root, path); });
  };
  const std::string e1 = error_of("bad_cat_dim.pt"), e2 = error_of("bad_param.pt"), e3 = error_of("bad_root.pt"),
                    e4 = error_of("bad_expert.pt");
  EXPECT_NE(e1.find("bad_cat_dim.pt"), std::string::npos) << e1;
  EXPECT_NE(e1.find("'cat_dim' is not an int"), std::string::npos) << e1;
  EXPECT_NE(e2.find("bad_param.pt"), std::string::npos) << e2;
  EXPECT_NE(e2.find("no 'param' tensor"), std::string::npos) << e2;
  EXPECT_NE(e3.find("bad_root.pt"), std::string::npos) << e3;
  EXPECT_NE(e3.find("not a universal state file"), std::string::npos) << e3;
  EXPECT_NE(e4.find("bad_expert.pt"), std::string::npos) << e4;
  EXPECT_NE(e4.find("ep_num_experts"), std::string::npos) << e4;
}

}  // namespace universal_state_file_test
