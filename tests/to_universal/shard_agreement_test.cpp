// lib/to_universal/shard_agreement: the shards of a real ZeRO-1 save (the 16-rank fixture) agree; the same
// shards edited in memory the way a wrong file would differ (fragments that overlap or leave a hole, a state
// of another length, another step or hyper-parameter, a model file of another iteration) are refused naming
// the file. The partition-walk cases over hand-written fragments moved here from plan_unit_test.cpp.
#include "to_universal/shard_agreement.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"

namespace ucpkit::to_universal {
namespace shard_agreement_test {
namespace {

using pickle::Value;
using pickle::ValuePtr;
using ucpkit::testing::error_of;

const std::string kStep = std::string(UCPKIT_FIXTURES_DIR) + "/gpt_dp16_padding_ranks/global_step100/";

std::string shard_path(int dp) {
  return kStep + "bf16_zero_pp_rank_" + std::to_string(dp) + "_mp_rank_00_optim_states.pt";
}

ValuePtr osd(const ValuePtr& root) { return root->at("optimizer_state_dict"); }
// Param group g's optimizer state dict (base_optimizer_state.state[g]).
ValuePtr group_state(const ValuePtr& root, size_t g) {
  return osd(root)->at("base_optimizer_state")->at("state")->entries.at(g).second;
}
ValuePtr mappings(const ValuePtr& root, size_t g) { return osd(root)->at("param_slice_mappings")->items.at(g); }

// Records shards 0..n-1, `edit` applied to shard `edited`'s pickle before it is read; returns finish()'s error.
std::string agreement_of(int n, int edited, const std::function<void(const ValuePtr&)>& edit) {
  ShardAgreement a;
  for (int d = 0; d < n; ++d) {
    const ValuePtr root = load_torch(shard_path(d));
    if (d == edited) edit(root);
    const ShardView shard(root, shard_path(d));
    a.optim_shard(shard, root, shard_path(d));
  }
  return error_of([&] { a.finish(); });
}

// A shard whose partitions hold several parameters (3 DP ranks of a larger model).
const std::string kBig = std::string(UCPKIT_FIXTURES_DIR) +
                         "/gpt_tp2_pp2_dp3/global_step100/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt";

std::string one_shard_error(const std::function<void(const ValuePtr&)>& edit) {
  const ValuePtr root = load_torch(kBig);
  if (mappings(root, 0)->entries.size() < 2) return "fixture changed: group 0 has fewer than 2 fragments";
  edit(root);
  return error_of([&] {
    ShardAgreement a;
    a.optim_shard(ShardView(root, kBig), root, kBig);
  });
}

TEST(ShardAgreement, TheBigShardAloneIsAccepted) {
  EXPECT_EQ(one_shard_error([](const ValuePtr&) {}), "");
}

TEST(ShardAgreement, TheShardsOfOneSaveAgree) {
  EXPECT_EQ(agreement_of(16, -1, [](const ValuePtr&) {}), "");
}

TEST(ShardAgreement, OverlappingFragmentsAreRefused) {
  const auto what = one_shard_error([](const ValuePtr& root) {
    auto& e = mappings(root, 0)->entries;
    e[1].second = e[0].second;  // the second parameter given the first one's elements
  });
  EXPECT_NE(what.find(kBig), std::string::npos) << what;
  EXPECT_NE(what.find("param group 0: param_slice_mappings fragments of"), std::string::npos) << what;
  EXPECT_NE(what.find("overlap (elements [0, "), std::string::npos) << what;
}

TEST(ShardAgreement, AHoleInTheFragmentsIsRefused) {
  const auto what = one_shard_error([](const ValuePtr& root) {
    auto& e = mappings(root, 0)->entries;
    e.erase(e.begin());  // the parameter at element 0 dropped
  });
  EXPECT_NE(what.find("param group 0: elements [0, "), std::string::npos) << what;
  EXPECT_NE(what.find("belong to no parameter (a hole in param_slice_mappings before"), std::string::npos) << what;
}

TEST(ShardAgreement, AStateOfAnotherLengthIsRefused) {
  int64_t partition = 0;
  const auto what = one_shard_error([&](const ValuePtr& root) {
    partition = osd(root)->at("single_partition_of_fp32_groups")->items[0]->as_tensor().numel();
    group_state(root, 0)->set_item("exp_avg", Value::of_tensor(Tensor::zeros(DType::Float32, {3})));
  });
  EXPECT_NE(what.find(kBig), std::string::npos) << what;
  EXPECT_NE(what.find("param group 0: optimizer state exp_avg holds 3 elements but the flat partition has " +
                      std::to_string(partition)),
            std::string::npos)
      << what;
}

TEST(ShardAgreement, AShardOfAnotherStepIsNamedAgainstTheOthers) {
  const auto what = agreement_of(3, 1, [](const ValuePtr& root) {
    for (size_t g = 0; g < 2; ++g) group_state(root, g)->set_item("step", Value::integer(99));
  });
  EXPECT_NE(what.find(shard_path(1) + ": optimizer step is 99 but " + shard_path(0) + " and 3 other files say"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("files of different saves"), std::string::npos) << what;
}

TEST(ShardAgreement, AnotherHyperParameterIsNamed) {
  const auto what = agreement_of(3, 2, [](const ValuePtr& root) {
    osd(root)->at("base_optimizer_state")->at("param_groups")->items[0]->set_item("lr", Value::real(0.5));
  });
  EXPECT_NE(what.find(shard_path(2) + ": hyper-parameter set of param group 0 is"), std::string::npos) << what;
  EXPECT_NE(what.find("lr=0.5"), std::string::npos) << what;
  EXPECT_NE(what.find("and 1 other file say"), std::string::npos) << what;
}

TEST(ShardAgreement, AModelFileOfAnotherSaveIsNamed) {
  const std::string tp4 = std::string(UCPKIT_FIXTURES_DIR) + "/gpt_tp2_pp2_dp3/global_step100/";
  ShardAgreement a;
  for (int mp = 0; mp < 4; ++mp) {
    const std::string path = tp4 + "mp_rank_0" + std::to_string(mp) + "_model_states.pt";
    const ValuePtr root = load_torch(path);
    if (mp == 3) root->set_item("ds_version", Value::str("0.9.0"));
    a.model_file(root, path);
  }
  const auto what = error_of([&] { a.finish(); });
  EXPECT_NE(what.find(tp4 + "mp_rank_03_model_states.pt: ds_version is '0.9.0' but " + tp4 +
                      "mp_rank_00_model_states.pt and 2 other files say '0.16.4'"),
            std::string::npos)
      << what;
}

using Frags = std::vector<std::tuple<std::string, int64_t, int64_t>>;

TEST(UcpShardAgreement, ParameterCutAtAPartitionBoundaryIsAccepted) {
  ShardAgreement a;
  a.partition("mp0/g0", 0, 2, 16, Frags{{"a", 0, 10}, {"b", 10, 6}}, "r0.pt");
  a.partition("mp0/g0", 1, 2, 16, Frags{{"b", 0, 4}, {"c", 4, 12}}, "r1.pt");
  EXPECT_NO_THROW(a.finish());
}

TEST(UcpShardAgreement, ExchangedRankFilesAreRefusedNamingAFile) {
  // Rank files swapped: partition 0 starts with the tail of b, which ends partition 1.
  ShardAgreement a;
  a.partition("mp0/g0", 0, 2, 16, Frags{{"b", 0, 4}, {"c", 4, 12}}, "r1.pt");
  a.partition("mp0/g0", 1, 2, 16, Frags{{"a", 0, 10}, {"b", 10, 6}}, "r0.pt");
  try {
    a.finish();
    FAIL() << "exchanged partitions accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("r0.pt") != std::string::npos || what.find("r1.pt") != std::string::npos) << what;
  }
}

TEST(UcpShardAgreement, ParameterInTwoSeparateRunsOfPartitionsIsRefused) {
  ShardAgreement a;
  a.partition("mp0/g0", 0, 3, 8, Frags{{"a", 0, 8}}, "r0.pt");
  a.partition("mp0/g0", 1, 3, 8, Frags{{"b", 0, 8}}, "r1.pt");
  a.partition("mp0/g0", 2, 3, 8, Frags{{"a", 0, 8}}, "r2.pt");
  EXPECT_THROW(a.finish(), Error);
}

TEST(UcpShardAgreement, AContinuationThatDoesNotStartAtZeroIsRefused) {
  // b ends partition 0, but partition 1 has it after c: not a continuation.
  ShardAgreement a;
  a.partition("mp0/g0", 0, 2, 16, Frags{{"a", 0, 10}, {"b", 10, 6}}, "r0.pt");
  a.partition("mp0/g0", 1, 2, 16, Frags{{"c", 0, 4}, {"b", 4, 12}}, "r1.pt");
  const auto what = error_of([&] { a.finish(); });
  EXPECT_NE(what.find("r1.pt: mp0/g0: parameter b is also in r0.pt, but not as the continuation of that partition "
                      "into this one (partition 0 -> 1)"),
            std::string::npos)
      << what;
}

TEST(UcpShardAgreement, ZeroSizedFragmentsAndUnplannedPartitionsAreIgnored) {
  ShardAgreement a;
  a.partition("mp0/g0", 0, 3, 16, Frags{{"z", 0, 0}, {"a", 0, 16}}, "r0.pt");
  a.partition("mp0/g0", 2, 3, 16, Frags{{"z", 5, 0}, {"b", 0, 16}}, "r2.pt");  // partition 1 not read
  EXPECT_NO_THROW(a.finish());
}

}  // namespace
}  // namespace shard_agreement_test
}  // namespace ucpkit::to_universal
