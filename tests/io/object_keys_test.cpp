// Instances and classes as dict keys (Python hashes them; DCP's Metadata.storage_data is keyed by
// MetadataIndex objects): read by identity, every entry kept, in order. Truth: Python's own pickle.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/pickle/unpickler.h"
#include "support/process.h"

namespace object_keys_test {

namespace {

std::vector<uint8_t> python_pickle(const std::string& expr, int protocol) {
  std::string out;
  const std::string script = "import sys, fractions, decimal; sys.stdout.write(__import__('pickle').dumps(" + expr +
                             ", protocol=" + std::to_string(protocol) + ").hex())";
  EXPECT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " -c " + ucpkit::testing::quote(script), &out), 0)
      << out;
  std::vector<uint8_t> b;
  for (size_t i = 0; i + 1 < out.size(); i += 2) b.push_back(static_cast<uint8_t>(std::stoi(out.substr(i, 2), nullptr, 16)));
  return b;
}

}  // namespace

TEST(ObjectKeys, InstancesAndClassesAsDictKeysAreKeptInOrder) {
  for (int protocol : {2, 4}) {
    SCOPED_TRACE(protocol);
    // Two equal-valued Fractions are two objects in the pickle only when they are distinct keys; 1500
    // entries span two SETITEMS batches.
    const auto b = python_pickle("{**{fractions.Fraction(i, 7): i for i in range(1500)}, decimal.Decimal: 'cls', 'x': 1}",
                                 protocol);
    const auto v = ucpkit::pickle::unpickle(b, "keys.pkl");
    ASSERT_EQ(v->entries.size(), 1502u);
    EXPECT_EQ(v->entries[0].first->class_path(), "fractions.Fraction");
    EXPECT_EQ(v->entries[1499].second->i, 1499);
    EXPECT_EQ(v->entries[1501].first->s, "x");
  }
}

// torch dtypes as keys, alone and in tuples: Megatron-Core's distributed optimizer saves per_bucket_numel
// keyed by (param dtype, grad dtype) tuples. Each dtype is one Python object, so equal dtypes are one key.
TEST(ObjectKeys, TorchDtypesAsDictKeys) {
  for (int protocol : {2, 4}) {
    SCOPED_TRACE(protocol);
    const auto b = python_pickle(
        "(lambda t: {t.float32: 1, t.bfloat16: 2, (t.bfloat16, t.float32): 3, (t.float32, t.float32): 4})"
        "(__import__('torch'))",
        protocol);
    const auto v = ucpkit::pickle::unpickle(b, "dtype_keys.pkl");
    ASSERT_EQ(v->entries.size(), 4u);
    EXPECT_EQ(v->entries[0].first->kind, ucpkit::pickle::Kind::Dtype);
    EXPECT_EQ(v->entries[0].first->dtype, ucpkit::DType::Float32);
    EXPECT_EQ(v->entries[1].first->dtype, ucpkit::DType::BFloat16);
    EXPECT_EQ(v->entries[2].first->kind, ucpkit::pickle::Kind::Tuple);
    EXPECT_EQ(v->entries[3].second->i, 4);
  }
}

}  // namespace object_keys_test
