// lib/reshard/templates: the source's template model files are parsed once per run and shared by
// every writer and thread of the run; a template that is not a model-states dict is refused naming
// the file; target_moe_line decides the native-MoE line only for native-MoE models. On the GPT
// fixture's universal checkpoint (tests/reshard/universal_fixture.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "io/pickle/pickler.h"
#include "io/torch/torch_file.h"
#include "reshard/universal_fixture.h"
#include "reshard/model_info.h"
#include "reshard/templates.h"
#include "reshard/ucp_info.h"
#include "support/process.h"

namespace templates_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

TEST(Templates, EachParsedOnceAndSharedByEveryThread) {
  const ModelInfo model = read_model_info(loadtest::gpt_case().universal.string());
  ASSERT_GE(model.model_files.size(), 1u);
  const Templates t(model.model_files);
  EXPECT_EQ(t.parsed(), 0u);  // nothing read before it is asked for
  std::vector<const pickle::Value*> got(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < got.size(); ++k) threads.emplace_back([&, k] { got[k] = t.model_states(0).get(); });
  for (auto& th : threads) th.join();
  for (const auto* g : got) EXPECT_EQ(g, got[0]) << "one parse, the same root for every thread";
  EXPECT_EQ(t.parsed(), 1u);
  // The same value as the file read on its own (pickled the same, storages numbered in order).
  auto pickled = [](const pickle::ValuePtr& root) {
    int n = 0;
    pickle::PickleOptions o;
    o.storage_id = [&](const std::shared_ptr<Storage>&) { return pickle::Value::str(std::to_string(n++)); };
    return pickle::pickle(root, o);
  };
  EXPECT_EQ(pickled(t.model_states(0)), pickled(load_torch(model.model_files[0])));
  EXPECT_EQ(t.parsed(), 1u);
}

TEST(Templates, NotAModelStatesDictIsRefusedNamingTheFile) {
  const fs::path dir = ucpkit::testing::scratch_dir("templates_bad");
  const std::string missing = (dir / "mp_rank_00_model_states.pt").string();
  const std::string list = (dir / "list_model_states.pt").string();
  save_torch_file(list, pickle::Value::list({pickle::Value::integer(1)}));
  const Templates t({missing, list});
  for (int f : {0, 1, 1}) {  // asked again, refused again
    try {
      (void)t.model_states(f);
      ADD_FAILURE() << "no error for template " << f;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(t.paths()[f]), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(t.parsed(), 0u);
}

TEST(Templates, MoeLineOnlyForNativeMoe) {
  const ModelInfo model = read_model_info(loadtest::gpt_case().universal.string());
  ASSERT_FALSE(model.native_moe);
  const Templates t(model.model_files);
  EXPECT_EQ(target_moe_line(model, TargetLayout{}, t), nullptr);
  EXPECT_EQ(t.parsed(), 0u);  // not even read
}

}  // namespace templates_test
