// The class-path allow-list of checkpoint pickles (lib/io/pickle/class_paths).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "io/pickle/class_paths.h"
#include "support/process.h"

namespace class_paths_test {

namespace {

using ucpkit::pickle::class_path_problem;

struct ResetTrust {
  ResetTrust() { ucpkit::pickle::reset_trusted_modules(); }
  ~ResetTrust() { ucpkit::pickle::reset_trusted_modules(); }
};

// Class paths real DeepSpeed / Megatron-DeepSpeed / torch 2.x checkpoints pickle (docs/formats.md,
// docs/deepspeed-zero3-format.md, the fixtures' generators) and ones users' client state may hold.
TEST(ClassPaths, CheckpointClassesAreAccepted) {
  ResetTrust reset;
  const char* ok[][2] = {{"torch._utils", "_rebuild_tensor_v2"},      {"torch._utils", "_rebuild_tensor_v3"},
                         {"torch", "BFloat16Storage"},                 {"torch", "Size"},
                         {"torch._tensor", "_rebuild_from_type_v2"},   {"torch.serialization", "_get_layout"},
                         {"torch.torch_version", "TorchVersion"},      {"collections", "OrderedDict"},
                         {"collections", "defaultdict"},               {"__builtin__", "set"},
                         {"__builtin__", "xrange"},                    {"builtins", "getattr"},
                         {"_codecs", "encode"},                        {"argparse", "Namespace"},
                         {"copyreg", "_reconstructor"},                {"copy_reg", "_reconstructor"},
                         {"numpy.core.multiarray", "_reconstruct"},    {"numpy", "dtype"},
                         {"numpy._core.multiarray", "scalar"},         {"deepspeed.runtime.fp16.loss_scaler", "LossScaler"},
                         {"deepspeed.utils.tensor_fragment", "fragment_address"},
                         {"deepspeed.runtime.zero.config", "ZeroStageEnum"},
                         {"deepspeed.checkpoint.universal_checkpoint", "SubparamShape"},
                         {"megatron.model.enums", "AttnMaskType"},    {"pathlib", "PosixPath"},
                         {"datetime", "datetime"},                     {"__main__", "MyState"},
                         {"builtins", "dict.fromkeys"},                {"lightning_fabric.utilities.data", "AttributeDict"}};
  for (auto& p : ok) EXPECT_EQ(class_path_problem(p[0], p[1]), "") << p[0] << "." << p[1];
}

TEST(ClassPaths, DamagedPathsAreRefused) {
  ResetTrust reset;
  std::string why = class_path_problem("_Wbuiltin__", "set");
  EXPECT_NE(why.find("'_Wbuiltin__'"), std::string::npos) << why;
  EXPECT_NE(why.find("--trust-module _Wbuiltin__"), std::string::npos) << why;
  EXPECT_NE(class_path_problem("tprch._utils", "_rebuild_tensor_v2"), "");
  EXPECT_NE(class_path_problem("mypackage.models", "Net"), "");
  why = class_path_problem("mypackage.models", "Net");
  EXPECT_NE(why.find("--trust-module mypackage"), std::string::npos) << why;  // the root
  why = class_path_problem("collections", "OrderedDicu");
  EXPECT_NE(why.find("'collections' has no 'OrderedDicu'"), std::string::npos) << why;
  EXPECT_NE(class_path_problem("__builtin__", "sex"), "");
  EXPECT_NE(class_path_problem("argparse", "Namespacf"), "");
  EXPECT_NE(class_path_problem("_codecs", "encodf"), "");
  // Control bytes are escaped, not echoed.
  why = class_path_problem("x\x1b[2J", "y");
  EXPECT_EQ(why.find('\x1b'), std::string::npos);
}

TEST(ClassPaths, TrustedModulesAndTheirSubmodulesAreAccepted) {
  ResetTrust reset;
  ucpkit::pickle::trust_modules({"mypackage", "collections"});
  EXPECT_EQ(class_path_problem("mypackage", "Net"), "");
  EXPECT_EQ(class_path_problem("mypackage.models.gpt", "Net"), "");
  EXPECT_NE(class_path_problem("mypackagex", "Net"), "");  // a prefix of a name is not a parent module
  EXPECT_EQ(class_path_problem("collections", "OrderedDicu"), "");
  EXPECT_NE(class_path_problem("argparse", "Namespacf"), "");
  ucpkit::pickle::trust_modules({"*"});
  EXPECT_EQ(class_path_problem("anything.at_all", "X"), "");
  EXPECT_EQ(class_path_problem("argparse", "Namespacf"), "");
  ucpkit::pickle::reset_trusted_modules();
  EXPECT_NE(class_path_problem("mypackage", "Net"), "");
}

// The committed table is what the generator gives with this machine's Python (the language's own
// module list and namespaces are the independent truth).
TEST(ClassPaths, TableMatchesItsGenerator) {
  const std::string src = UCPKIT_SOURCE_DIR;
  std::string generated;
  // A fresh python, not the tests' warm one (tests/support/pywarm.py): the generator lists the builtins
  // namespace, which torch's import (done there) extends with pybind11's internals.
  ASSERT_EQ(ucpkit::testing::run_command_status(
                "UCPKIT_PYWARM=0 " + std::string(UCPKIT_PYTHON) + " " + src + "/scripts/gen/pickle_class_paths.py 2>/dev/null",
                &generated),
            0);
  std::ifstream in(src + "/lib/io/pickle/class_paths_table.inc");
  std::stringstream committed;
  committed << in.rdbuf();
  EXPECT_EQ(generated, committed.str()) << "regenerate lib/io/pickle/class_paths_table.inc";
}

}  // namespace

}  // namespace class_paths_test
