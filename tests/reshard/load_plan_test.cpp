// ucp-load's per-rank plan without I/O: the optimizer flavour docs/ucp-load.md promises for
// --optimizer auto, when the exchange is used, that the files-mode jobs name every target file
// DeepSpeed's layout has exactly once over any number of ranks, each atomic tensor verified by one
// rank, and which steps a rank runs for each kind of input and output.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "reshard/load.h"
#include "reshard/load_plan.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"
#include "plan_models.h"

namespace load_plan_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
using patterns::JoinKind;
using namespace ucpkit::reshard::test_models;

namespace {

TargetLayout target_of(int tp, int pp, int dp, int zero) {
  TargetLayout t;
  t.tp = tp;
  t.pp = pp;
  t.dp = dp;
  t.zero_stage = zero;
  return t;
}

LoadOptions options_for(const TargetLayout& t) {
  LoadOptions o;
  o.target = t;
  return o;
}

}  // namespace

TEST(ResolveTarget, AutoPicksBf16OptimizerAsDocumented) {
  ModelInfo m = tiny_model();
  struct Case {
    DType dtype;
    int zero;
    bool source_bf16_optimizer, want;
  };
  // docs/ucp-load.md --optimizer: auto picks BF16_Optimizer for bf16 with ZeRO 0, or ZeRO 1 when
  // the source used it.
  for (const Case& c : std::vector<Case>{{DType::BFloat16, 0, false, true},
                                         {DType::BFloat16, 1, true, true},
                                         {DType::BFloat16, 1, false, false},
                                         {DType::BFloat16, 2, true, false},
                                         {DType::BFloat16, 3, true, false},
                                         {DType::Float16, 1, true, false},
                                         {DType::Float16, 0, true, false}}) {
    m.source_bf16_optimizer = c.source_bf16_optimizer;
    TargetLayout t = target_of(1, 1, 2, c.zero);
    t.dtype = c.dtype;
    EXPECT_EQ(resolve_target(t, OptimizerKind::Auto, m).bf16_optimizer, c.want)
        << dtype_name(c.dtype) << " zero " << c.zero << " source bf16 " << c.source_bf16_optimizer;
    EXPECT_TRUE(resolve_target(t, OptimizerKind::Bf16, m).bf16_optimizer);
    EXPECT_FALSE(resolve_target(t, OptimizerKind::Zero, m).bf16_optimizer);
  }
  // Everything else is the target as given.
  TargetLayout t = target_of(2, 3, 4, 1);
  t.ep = 2;
  t.sub_group_size = 77;
  t.ds_line = "0.14";
  const auto r = resolve_target(t, OptimizerKind::Auto, m);
  EXPECT_EQ(std::make_tuple(r.tp, r.pp, r.dp, r.zero_stage, r.ep, r.dtype, r.sub_group_size, r.ds_line),
            std::make_tuple(2, 3, 4, 1, 2, DType::BFloat16, int64_t{77}, std::string("0.14")));
}

TEST(UsesExchange, DeepSpeedOutputWhenAskedOrUnderSeveralRanks) {
  EXPECT_FALSE(uses_exchange(OutputFormat::DeepSpeed, ExchangeMode::Auto, 1));
  EXPECT_TRUE(uses_exchange(OutputFormat::DeepSpeed, ExchangeMode::Auto, 2));
  EXPECT_TRUE(uses_exchange(OutputFormat::DeepSpeed, ExchangeMode::Exchange, 1));
  EXPECT_FALSE(uses_exchange(OutputFormat::DeepSpeed, ExchangeMode::Files, 4));
  for (auto mode : {ExchangeMode::Auto, ExchangeMode::Files, ExchangeMode::Exchange})
    for (int ranks : {1, 3}) EXPECT_FALSE(uses_exchange(OutputFormat::Safetensors, mode, ranks));
}

TEST(FileJobs, NameEveryDeepSpeedFileOnce) {
  struct Case {
    ModelInfo model;
    TargetLayout target;
  };
  const std::vector<Case> cases = {{tiny_model(), target_of(2, 1, 3, 1)},
                                   {tiny_model(), target_of(1, 1, 4, 3)},
                                   {tiny_model(), target_of(2, 1, 2, 2)},
                                   {pipeline_model(), target_of(2, 2, 2, 1)},
                                   {pipeline_model(), target_of(1, 3, 1, 1)}};
  for (const auto& c : cases) {
    const UcpInfo info = ucp_info(c.model, c.target);
    const auto jobs = file_jobs(c.model, info, nullptr);
    std::set<std::tuple<int, int, int>> seen;
    for (const auto& j : jobs) {
      EXPECT_TRUE(seen.insert({j.kind, j.mp, j.dp}).second) << "job listed twice";
      if (j.kind == FileJob::Zero3Model) EXPECT_EQ(c.target.zero_stage, 3);
      if (j.kind == FileJob::Model) EXPECT_NE(c.target.zero_stage, 3);
    }
    // Per model-parallel rank: one model job (ZeRO 0-2) or one per DP rank (ZeRO-3), one optimizer job per DP rank.
    const size_t mp = static_cast<size_t>(c.target.tp * c.target.pp), dp = static_cast<size_t>(c.target.dp);
    EXPECT_EQ(jobs.size(), mp * (c.target.zero_stage == 3 ? 2 * dp : 1 + dp)) << c.target.to_json().dump();
  }
}

TEST(FileJobs, JobsWriteTheTargetsExpectedFilesEachOnce) {
  // files_of over every job is the target's one file list (file_names.h expected_files): the jobs
  // split it without gaps or overlaps, whatever the stage, TP, DP and ZeRO stage.
  const std::vector<std::pair<ModelInfo, TargetLayout>> cases = {{tiny_model(), target_of(2, 1, 3, 1)},
                                                                 {tiny_model(), target_of(1, 1, 4, 3)},
                                                                 {pipeline_model(), target_of(2, 2, 2, 1)},
                                                                 {pipeline_model(), target_of(1, 3, 1, 1)}};
  for (const auto& [model, target] : cases) {
    SCOPED_TRACE(target.to_json().dump());
    const UcpInfo info = ucp_info(model, target);
    const auto facts = info.files(model.native_moe);
    std::vector<std::string> from_jobs;
    for (const auto& j : file_jobs(model, info, nullptr)) {
      EXPECT_EQ(j.files, files_of(facts, j, nullptr));  // each job carries its names
      for (const auto& f : j.files) from_jobs.push_back(f);
    }
    auto want = formats::deepspeed::expected_files(facts, nullptr);
    std::sort(from_jobs.begin(), from_jobs.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(from_jobs, want);
    EXPECT_EQ(std::set<std::string>(want.begin(), want.end()).size(), want.size()) << "a file listed twice";
    // The names the plan's own accessors give are on the list.
    for (int d = 0; d < target.dp; ++d)
      EXPECT_TRUE(std::binary_search(want.begin(), want.end(), info.optim_file(d, 0))) << info.optim_file(d, 0);
  }
}

TEST(FileJobs, PipelineLayerFilesFollowTheirStage) {
  // 4 blocks over 2 stages: layers 1 (embedding), 3, 4 on stage 0; 5, 6, 7 (final norm) on stage 1.
  const ModelInfo m = pipeline_model();
  const UcpInfo info = ucp_info(m, target_of(1, 2, 1, 1));
  const auto jobs = file_jobs(m, info, nullptr);
  ASSERT_EQ(jobs.size(), 4u);  // per stage: the model job, one optimizer job
  EXPECT_EQ(jobs[0].kind, FileJob::Model);
  EXPECT_EQ(jobs[2].kind, FileJob::Model);
  ASSERT_EQ(info.mp_ranks.size(), 2u);
  EXPECT_EQ(info.mp_ranks[0].layers.size(), 3u);
  EXPECT_EQ(info.mp_ranks[1].layers.size(), 3u);
}

TEST(FileJobs, OptimizerJobBytesAreTheFp32Partitions) {
  // TP 2, DP 3: group 0 is the embedding slice (vocabulary 10 padded to 12, 6 rows x 4) and the
  // dense slice (4 x 4): 40 elements, padded to a multiple of 2 * DP = 6 -> 42, 14 per rank; group 1
  // is the norm, 4 elements padded to 6, 2 per rank. Three fp32 states of 16 elements.
  const ModelInfo m = tiny_model();
  const UcpInfo info = ucp_info(m, target_of(2, 1, 3, 1));
  for (const auto& j : file_jobs(m, info, nullptr))
    if (j.kind == FileJob::Optim) EXPECT_EQ(j.bytes, 3u * 4u * 16u);
}

TEST(VerifyMask, EveryAtomicTensorByExactlyOneRank) {
  ModelInfo m = pipeline_model();
  for (const auto& p : tiny_model().params) m.params.push_back(p);
  for (int ranks : {1, 2, 3, 5, 16}) {
    std::vector<int> owners(m.params.size(), 0);
    for (int rank = 0; rank < ranks; ++rank) {
      const auto mask = verify_mask(m, ranks, rank);
      ASSERT_EQ(mask.size(), m.params.size());
      for (size_t i = 0; i < mask.size(); ++i) owners[i] += mask[i] ? 1 : 0;
    }
    for (size_t i = 0; i < owners.size(); ++i) EXPECT_EQ(owners[i], 1) << m.params[i].name << " ranks " << ranks;
  }
}

TEST(PlanLoad, FilesModeSplitsTheJobsOverTheRanks) {
  const ModelInfo m = tiny_model();
  auto o = options_for(target_of(2, 1, 3, 1));
  o.exchange = ExchangeMode::Files;
  const UcpInfo info = ucp_info(m, o.target);
  const size_t njobs = file_jobs(m, info, nullptr).size();
  for (int ranks : {1, 2, 4, 9}) {
    std::vector<int> taken(njobs, 0);
    for (int rank = 0; rank < ranks; ++rank) {
      const auto p = plan_load(o, m, info, nullptr, false, ranks, rank);
      EXPECT_FALSE(p.exchange);
      EXPECT_TRUE(p.verify && p.verify_first);
      EXPECT_EQ(p.jobs.size(), njobs);
      for (size_t k : p.my_jobs) ++taken.at(k);
    }
    for (int t : taken) EXPECT_EQ(t, 1) << ranks << " ranks";
  }
}

TEST(PlanLoad, WhichStepsRun) {
  const ModelInfo m = tiny_model();
  auto o = options_for(target_of(1, 1, 2, 1));
  const UcpInfo info = ucp_info(m, o.target);

  // Universal input, several ranks: the exchange, which verifies while the owners read.
  auto p = plan_load(o, m, info, nullptr, false, 2, 0);
  EXPECT_TRUE(p.exchange && p.verify);
  EXPECT_FALSE(p.verify_first);
  EXPECT_TRUE(p.jobs.empty() && p.my_jobs.empty() && p.verify_mask.empty());

  // --no-verify: nothing verified.
  o.verify = false;
  p = plan_load(o, m, info, nullptr, false, 1, 0);
  EXPECT_FALSE(p.verify || p.verify_first || p.exchange);
  EXPECT_FALSE(p.jobs.empty());

  // Native input: the universal checksums only with --verify-against (--verify does not apply).
  o.verify = true;
  p = plan_load(o, m, info, nullptr, true, 1, 0);
  EXPECT_TRUE(p.direct);
  EXPECT_FALSE(p.verify);
  o.verify_against = "/nowhere/manifest.json";
  p = plan_load(o, m, info, nullptr, true, 1, 0);
  EXPECT_TRUE(p.verify && p.verify_first);
  EXPECT_EQ(p.verify_mask, std::vector<char>(m.params.size(), 1));

  // safetensors: never the exchange, no DeepSpeed jobs; the verification still split over the ranks.
  o.verify_against.clear();
  o.format = OutputFormat::Safetensors;
  o.exchange = ExchangeMode::Exchange;
  p = plan_load(o, m, info, nullptr, false, 3, 1);
  EXPECT_EQ(p.format, OutputFormat::Safetensors);
  EXPECT_FALSE(p.exchange);
  EXPECT_TRUE(p.verify_first);
  EXPECT_TRUE(p.jobs.empty());
}

TEST(PlanLoad, EveryFileHasOneWriterAndTheRanksFilesAddUpToTheLayout) {
  // The files-mode plan names who writes each job (job_ranks, the same on every rank), each rank's
  // my_jobs are exactly the jobs given to it, and my_files over the ranks is expected_files' length.
  const ModelInfo m = pipeline_model();
  auto o = options_for(target_of(2, 2, 3, 1));
  o.exchange = ExchangeMode::Files;
  const UcpInfo info = ucp_info(m, o.target);
  const size_t want = formats::deepspeed::expected_files(info.files(m.native_moe), nullptr).size();
  for (int ranks : {1, 2, 5}) {
    size_t total = 0;
    std::vector<int> first;
    for (int rank = 0; rank < ranks; ++rank) {
      const auto p = plan_load(o, m, info, nullptr, false, ranks, rank);
      ASSERT_EQ(p.job_ranks.size(), p.jobs.size());
      if (rank == 0) first = p.job_ranks;
      EXPECT_EQ(p.job_ranks, first) << "every rank computes the same split";
      std::vector<size_t> given;
      for (size_t k = 0; k < p.jobs.size(); ++k)
        if (p.job_ranks[k] == rank) given.push_back(k);
      std::vector<size_t> mine = p.my_jobs;
      std::sort(mine.begin(), mine.end());
      EXPECT_EQ(mine, given);
      total += p.my_files();
    }
    EXPECT_EQ(total, want) << ranks << " ranks";
  }
}

TEST(PlanLoad, JsonNamesEveryJobsFilesAndWriter) {
  const ModelInfo m = tiny_model();
  auto o = options_for(target_of(2, 1, 2, 3));
  o.exchange = ExchangeMode::Files;
  const UcpInfo info = ucp_info(m, o.target);
  const auto p = plan_load(o, m, info, nullptr, false, 2, 1);
  const auto j = p.to_json(m);
  EXPECT_EQ(j["format"], "deepspeed");
  EXPECT_EQ(j["mode"], "files");
  EXPECT_EQ(j["verify_first"], true);
  ASSERT_EQ(j["jobs"].size(), p.jobs.size());
  std::set<std::string> kinds, files;
  for (size_t k = 0; k < p.jobs.size(); ++k) {
    const auto& x = j["jobs"][k];
    kinds.insert(x["kind"].get<std::string>());
    EXPECT_EQ(x["rank"], p.job_ranks[k]);
    for (const auto& f : x["files"]) EXPECT_TRUE(files.insert(f.get<std::string>()).second) << f;
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"zero3_model", "optim"}));  // ZeRO-3: no mp_rank model job
  EXPECT_TRUE(files.count(info.zero3_model_file(1, 1)));
  EXPECT_TRUE(files.count(info.optim_file(0, 0)));
  // The tensors this rank verifies, by name: with rank 0's, every parameter once.
  const auto p0 = plan_load(o, m, info, nullptr, false, 2, 0).to_json(m);
  std::multiset<std::string> verified;
  for (const auto* v : {&j, &p0})
    for (const auto& n : (*v)["verified_by_this_rank"]) verified.insert(n.get<std::string>());
  EXPECT_EQ(verified.size(), m.params.size());
  for (const auto& prm : m.params) EXPECT_EQ(verified.count(prm.name), 1u) << prm.name;
  EXPECT_EQ(j["my_jobs"].get<std::vector<size_t>>(), p.my_jobs);
}

}  // namespace load_plan_test
