// The exchange plan's steps and one rank's part of it (lib/reshard/exchange_plan.h) without I/O and
// without MPI, each against a small case worked out by hand or an independent element-by-element
// count. The whole plan_exchange is checked on many shapes in ucp_info_test.cpp (Exchange.*).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "core/error.h"
#include "reshard/exchange_plan.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"

namespace exchange_plan_test {

using namespace ucpkit;
using namespace ucpkit::reshard;

namespace {

// Parameters of the given element counts (1-D), states fp32 and exp_avg.
ModelInfo model_of(const std::vector<int64_t>& numels) {
  ModelInfo m;
  m.states = {"fp32", "exp_avg"};
  for (size_t i = 0; i < numels.size(); ++i) {
    ParamInfo p;
    p.name = "p" + std::to_string(i);
    p.shape = {numels[i]};
    p.stored_numel = numels[i];
    m.params.push_back(p);
  }
  return m;
}

ExchangePlan cut(const ModelInfo& m, int ranks, int64_t unit_elements, uint64_t batch_bytes = 0) {
  ExchangePlan plan;
  plan.ranks = ranks;
  plan.unit_elements = unit_elements;
  plan.batch_bytes = batch_bytes;
  cut_units(m, plan);
  return plan;
}

FileNeeds needs_of(AtomicNeeds elements, uint64_t bytes) {
  FileNeeds f;
  f.elements = std::move(elements);
  f.bytes = bytes;
  return f;
}

}  // namespace

TEST(ExchangePlan, UnitsCoverEveryTensorOnceInModelOrder) {
  // 10 elements in units of 4: [0,4) [4,8) [8,10); 4: one unit; 0: one empty unit.
  const ModelInfo m = model_of({10, 4, 0});
  const ExchangePlan plan = cut(m, 1, 4);
  const std::vector<std::tuple<int, int, int64_t, int64_t>> expect = {
      {0, 0, 0, 4}, {0, 0, 4, 4}, {0, 0, 8, 2}, {0, 1, 0, 4}, {0, 1, 4, 4}, {0, 1, 8, 2},
      {1, 0, 0, 4}, {1, 1, 0, 4}, {2, 0, 0, 0}, {2, 1, 0, 0}};
  ASSERT_EQ(plan.reads.size(), expect.size());
  for (size_t u = 0; u < expect.size(); ++u) {
    const auto& [param, state, start, count] = expect[u];
    EXPECT_EQ(plan.reads[u].param, param) << u;
    EXPECT_EQ(plan.reads[u].state, state) << u;
    EXPECT_EQ(plan.reads[u].start, start) << u;
    EXPECT_EQ(plan.reads[u].count, count) << u;
    EXPECT_EQ(plan.reads[u].bytes, static_cast<uint64_t>(count) * 4) << u;
  }
  EXPECT_EQ(plan.first_unit, (std::vector<size_t>{0, 3, 6, 7, 8, 9, 10}));
  EXPECT_EQ(tensor_index(m, 1, 1), 3u);
}

TEST(ExchangePlan, FilesBalancedByBytesThenEmptyFilesByCount) {
  // Bytes 50, 40, 30, 20 onto 2 ranks, largest first onto the least loaded: 50 -> 0, 40 -> 1,
  // 30 -> 1 (40 < 50), 20 -> 0 (50 < 70): loads 70 and 70. The three empty files go by count
  // (2 files each so far): rank 0, then 1, then 0.
  std::vector<FileNeeds> files;
  for (uint64_t b : {50, 0, 40, 30, 0, 20, 0}) files.push_back(needs_of({}, b));
  EXPECT_EQ(assign_files(files, 2), (std::vector<int>{0, 0, 1, 1, 1, 0, 0}));
  // One rank writes everything.
  EXPECT_EQ(assign_files(files, 1), std::vector<int>(files.size(), 0));
  // More ranks than files with bytes: the empty files go to the ranks without files first.
  EXPECT_EQ(assign_files({needs_of({}, 5), needs_of({}, 0), needs_of({}, 0)}, 3), (std::vector<int>{0, 1, 2}));
}

TEST(ExchangePlan, UnitNeedsCountEachRanksElementsAndPickTheQueue) {
  // One tensor of 12 elements (p0 fp32) in units of 4; p0 exp_avg is needed by no file.
  const ModelInfo m = model_of({12});
  ExchangePlan plan = cut(m, 2, 4);
  // File 0 (rank 0): [0, 6); file 1 (rank 1): [2, 4) and [5, 12); file 2 (rank 0): [4, 6).
  std::vector<FileNeeds> files = {needs_of({{{0, 0}, {{0, 6}}}}, 24),
                                  needs_of({{{0, 0}, {{2, 2}, {5, 7}}}}, 36),
                                  needs_of({{{0, 0}, {{4, 2}}}}, 8)};
  plan.file_ranks = {0, 1, 0};
  const UnitNeeds n = unit_needs(m, files, plan);
  ASSERT_EQ(n.by_rank.size(), 6u);
  using V = std::vector<std::pair<int, uint64_t>>;
  // Unit 0 = [0,4): file 0 has 4, file 1 has 2. Unit 1 = [4,8): file 0 2, file 1 3, file 2 2
  // (rank 0: 4). Unit 2 = [8,12): file 1 4. Units 3..5 (exp_avg): nobody.
  EXPECT_EQ(n.by_rank[0], (V{{0, 4}, {1, 2}}));
  EXPECT_EQ(n.by_rank[1], (V{{0, 4}, {1, 3}}));
  EXPECT_EQ(n.by_rank[2], (V{{1, 4}}));
  for (size_t u = 3; u < 6; ++u) EXPECT_TRUE(n.by_rank[u].empty());
  // Queue: the single file needing most (unit 1: file 1 with 3, although rank 0 needs 4 in all).
  EXPECT_EQ(n.queue, (std::vector<long>{0, 1, 1, -1, -1, -1}));
  // A tie goes to the lower file.
  files[2].elements = {{{0, 0}, {{4, 3}}}};
  EXPECT_EQ(unit_needs(m, files, plan).queue[1], 1);
  files[0].elements = {{{0, 0}, {{4, 3}}}};
  EXPECT_EQ(unit_needs(m, files, plan).queue[1], 0);
  // Needs outside the model are an error, not a wrong index.
  files[0].elements = {{{1, 0}, {{0, 1}}}};
  EXPECT_THROW(unit_needs(m, files, plan), Error);
}

TEST(ExchangePlan, OwnersNeedNearlyTheMostAndBalanceTheirReads) {
  // Four units of 4 elements (16 bytes) on 3 ranks.
  const ModelInfo m = model_of({8, 8});
  ExchangePlan plan = cut(m, 3, 4);
  ASSERT_EQ(plan.reads.size(), 8u);
  UnitNeeds n;
  n.by_rank = {
      {{0, 10}, {1, 9}},  // 9 >= 9/10 of 10: both qualify, neither has read: the lower, rank 0
      {{0, 10}, {1, 9}},  // rank 0 has read 16 bytes: rank 1
      {{0, 10}, {1, 8}},  // 8 < 9: only rank 0
      {{2, 1}},           // only rank 2 needs it
      {},                 // nobody: the rank that has read least (rank 1: 16, rank 2: 16) -> rank 1
      {},                 // now rank 2 has read least
      {{1, 5}, {2, 5}},   // ranks 1, 2 both 32: the lower
      {{1, 5}, {2, 5}}};  // rank 1 48, rank 2 32: rank 2
  n.queue.assign(8, -1);
  choose_owners(n, plan);
  std::vector<int> owners;
  for (const auto& r : plan.reads) owners.push_back(r.owner);
  EXPECT_EQ(owners, (std::vector<int>{0, 1, 0, 2, 1, 2, 1, 2}));
}

TEST(ExchangePlan, QueuesMergedByProgress) {
  // Queue 0: units 0..3 of 4 bytes each (total 16); queue 1: units 4, 5 of 8 bytes each (total 16).
  // Middles: queue 0 at 2/16, 6/16, 10/16, 14/16; queue 1 at 4/16, 12/16.
  const ModelInfo m = model_of({4, 4});  // 4 tensors of 4 elements
  ExchangePlan plan = cut(m, 1, 1);      // 16 units of 1 element (4 bytes)
  plan.reads.resize(6);
  plan.reads[4].bytes = plan.reads[5].bytes = 8;
  const std::vector<long> queue = {0, 0, 0, 0, 1, 1};
  EXPECT_EQ(merge_queues(queue, plan), (std::vector<size_t>{0, 4, 1, 2, 5, 3}));
  // Equal positions keep model order (stable).
  EXPECT_EQ(merge_queues({0, 1, 0, 1, -1, -1}, plan), (std::vector<size_t>{0, 1, 4, 2, 3, 5}));
}

TEST(ExchangePlan, BatchesCloseOnceTheBudgetIsReachedInModelOrder) {
  const ModelInfo m = model_of({20});
  for (uint64_t budget : {0ull, 4ull, 10ull, 24ull, 1000ull}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    ExchangePlan plan = cut(m, 1, 3, budget);  // p0 and its exp_avg: 7 units each (the last of 2)
    std::vector<size_t> order(plan.reads.size());
    std::iota(order.rbegin(), order.rend(), 0);  // reversed: batches must be sorted back
    cut_batches(order, plan);
    std::vector<int> seen(plan.reads.size(), 0);
    size_t taken = 0;
    for (size_t b = 0; b < plan.batches.size(); ++b) {
      const auto& batch = plan.batches[b];
      ASSERT_FALSE(batch.empty());
      EXPECT_TRUE(std::is_sorted(batch.begin(), batch.end()));
      uint64_t bytes = 0;
      for (size_t u : batch) {
        ++seen[u];
        EXPECT_EQ(plan.reads[u].batch, static_cast<int>(b));
        bytes += plan.reads[u].bytes;
      }
      // Exactly the next units of `order`: the batch reached the budget only with its last unit.
      std::vector<size_t> expect(order.begin() + taken, order.begin() + taken + batch.size());
      std::sort(expect.begin(), expect.end());
      EXPECT_EQ(batch, expect);
      const uint64_t last = plan.reads[order[taken + batch.size() - 1]].bytes;
      taken += batch.size();
      if (b + 1 < plan.batches.size()) EXPECT_GE(bytes, budget);
      EXPECT_LT(bytes - last, std::max<uint64_t>(budget, 1));
    }
    EXPECT_EQ(taken, plan.reads.size());
    for (int s : seen) EXPECT_EQ(s, 1);
    if (budget >= 1000) EXPECT_EQ(plan.batches.size(), 1u);
    if (budget == 0) EXPECT_EQ(plan.batches.size(), plan.reads.size());
  }
}

TEST(ExchangePlan, PlanIsTheStepsInOrder) {
  // plan_exchange = cut_units, assign_files, unit_needs, choose_owners, merge_queues, cut_batches.
  const ModelInfo m = model_of({40, 7, 33});
  std::vector<FileNeeds> files = {needs_of({{{0, 0}, {{0, 40}}}, {{1, 1}, {{0, 7}}}}, 188),
                                  needs_of({{{2, 0}, {{3, 30}}}, {{0, 1}, {{10, 5}}}}, 140), needs_of({}, 0)};
  const ExchangePlan plan = plan_exchange(m, files, 2, 640);
  EXPECT_EQ(plan.unit_elements, 5);  // 640 / 32 / 4
  ExchangePlan steps = cut(m, 2, 5, 640);
  steps.file_ranks = assign_files(files, 2);
  const UnitNeeds n = unit_needs(m, files, steps);
  choose_owners(n, steps);
  cut_batches(merge_queues(n.queue, steps), steps);
  EXPECT_EQ(plan.file_ranks, steps.file_ranks);
  EXPECT_EQ(plan.batches, steps.batches);
  EXPECT_EQ(plan.to_json(m), steps.to_json(m));
  EXPECT_THROW(plan_exchange(m, files, 0, 640), Error);
}

// What this rank does with the plan.

TEST(ExchangePlan, FillPiecesCoverEveryByteOnceInTheStepOfItsUnit) {
  // Two params: emb [10, 4] (vocabulary, cat dim 0) and dense [4, 8] (cat dim 1), TP 2, rank 1.
  ModelInfo m = model_of({40, 32});
  m.params[0].shape = {10, 4};
  m.params[0].rule.kind = patterns::JoinKind::Cat;
  m.params[0].rule.vocab = true;
  m.params[1].shape = {4, 8};
  m.params[1].rule.kind = patterns::JoinKind::Cat;
  m.params[1].rule.cat_dim = 1;
  patterns::PatternSet set;
  Slot emb, dense;
  emb.param = 0;  // rows 5..9 of 10 padded to 12: rank 1 holds rows 6..11, rows 10 and 11 padding
  emb.slice = tp_slice("emb", {10, 4}, m.params[0].rule, set, 2, 1, 12);
  dense.param = 1;  // columns 4..7 of every row
  dense.slice = tp_slice("dense", {4, 8}, m.params[1].rule, set, 2, 1, -1);
  // Independent truth: the atomic element of slice element i (-1: padding).
  auto atomic_of = [](const Slot& s, int64_t i) -> int64_t {
    if (s.param == 0) return i < 16 ? 24 + i : -1;
    return i / 4 * 8 + 4 + i % 4;
  };
  // A bf16 storage of 60 bytes: gap [0, 4), dense slice elements [2, 12) of exp_avg at [4, 24), gap
  // [24, 30), emb slice elements [0, 24) of fp32 at [30, 78) (its last 8 elements padding), gap to 90.
  const uint64_t es = 2, nbytes = 90;
  const std::vector<StorageSource> sources = {{4, 24, &dense, 2, 1}, {30, 78, &emb, 0, 0}};
  for (int64_t unit : {1, 3, 5, 64}) {
    for (int batches : {1, 2, 3}) {
      SCOPED_TRACE("unit " + std::to_string(unit) + " batches " + std::to_string(batches));
      ExchangePlan plan = cut(m, 1, unit);
      for (size_t u = 0; u < plan.reads.size(); ++u) plan.reads[u].batch = static_cast<int>((u * 7 + 3) % batches);
      // The expected step of every byte: gaps 0; an element the batch of its unit + 1; padding the
      // step of the element before it in its source (0 at the source's start).
      std::vector<size_t> expect(nbytes, 0);
      for (const auto& s : sources) {
        size_t step = 0;
        for (uint64_t p = s.byte_begin; p < s.byte_end; p += es) {
          const int64_t e = atomic_of(*s.slot, s.param_offset + static_cast<int64_t>((p - s.byte_begin) / es));
          if (e >= 0) {
            const size_t u = plan.first_unit[tensor_index(m, s.slot->param, s.state)] + static_cast<size_t>(e / unit);
            ASSERT_LE(plan.reads[u].start, e);
            ASSERT_LT(e, plan.reads[u].start + plan.reads[u].count);
            step = static_cast<size_t>(plan.reads[u].batch) + 1;
          }
          expect[p] = expect[p + 1] = step;
        }
      }
      std::vector<int> covered(nbytes, 0);
      std::vector<size_t> got(nbytes, 99);
      uint64_t at = 0;
      for (const FillPiece& piece : fill_pieces(sources, es, nbytes, m, plan)) {
        EXPECT_EQ(piece.begin, at);  // in byte order, no gap
        EXPECT_LT(piece.begin, piece.end);
        for (uint64_t p = piece.begin; p < piece.end && p < nbytes; ++p) ++covered[p], got[p] = piece.step;
        at = piece.end;
      }
      EXPECT_EQ(at, nbytes);
      for (uint64_t p = 0; p < nbytes; ++p) EXPECT_EQ(covered[p], 1) << "byte " << p;
      EXPECT_EQ(got, expect);
    }
  }
  // No sources: one zero piece; an empty storage: none.
  const ExchangePlan plan = cut(m, 1, 4);
  const auto zeros = fill_pieces({}, es, 10, m, plan);
  ASSERT_EQ(zeros.size(), 1u);
  EXPECT_EQ(zeros[0].step, 0u);
  EXPECT_EQ(zeros[0].end, 10u);
  EXPECT_TRUE(fill_pieces({}, es, 0, m, plan).empty());
}

TEST(ExchangePlan, FillCostsAreTheBusiestRankAndAnEvenSplitPerStep) {
  // Step 0: 10 and 4 (busiest 10, even 7); step 1: 0 and 6 (6, 3); step 2: 5 and 5 (5, 5).
  EXPECT_EQ(fill_costs({{10, 0, 5}, {4, 6, 5}}), (std::pair<uint64_t, uint64_t>{21, 15}));
  // An even split rounds up: 2 bytes over 3 ranks is 1.
  EXPECT_EQ(fill_costs({{1}, {1}, {0}}), (std::pair<uint64_t, uint64_t>{1, 1}));
  EXPECT_EQ(fill_costs({{7, 3}}), (std::pair<uint64_t, uint64_t>{10, 10}));
}

TEST(ExchangePlan, NeedsSurviveTheirFlatForm) {
  AtomicNeeds needs = {{{0, 0}, {{0, 4}, {10, 2}}}, {{3, 2}, {{5, 100}}}, {{7, 1}, {}}};
  const auto flat = flatten_needs(needs);
  EXPECT_EQ(flat, (std::vector<int64_t>{0, 0, 0, 4, 0, 0, 10, 2, 3, 2, 5, 100}));
  needs.erase({7, 1});  // a tensor with no intervals has no flat form
  EXPECT_EQ(unflatten_needs(flat), needs);
  EXPECT_TRUE(unflatten_needs({}).empty());
}

TEST(ExchangePlan, RankBatchesSendWhatTheOthersReceive) {
  // Three parameters, three ranks each needing overlapping ranges; units of 5 elements.
  const ModelInfo m = model_of({40, 7, 33});
  std::vector<FileNeeds> files = {
      needs_of({{{0, 0}, {{0, 25}}}, {{1, 1}, {{0, 7}}}, {{2, 0}, {{0, 3}}}}, 140),
      needs_of({{{0, 0}, {{20, 20}}}, {{2, 0}, {{1, 30}}}, {{0, 1}, {{10, 5}}}}, 220),
      needs_of({{{2, 1}, {{0, 33}}}, {{0, 0}, {{3, 4}, {30, 9}}}}, 184)};
  for (int ranks : {1, 2, 3}) {
    for (uint64_t budget : {40ull, 300ull, 1ull << 30}) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + " budget " + std::to_string(budget));
      const ExchangePlan plan = plan_exchange(m, files, ranks, budget);
      // Each rank needs what its files need.
      std::vector<AtomicNeeds> needs(static_cast<size_t>(ranks));
      for (size_t f = 0; f < files.size(); ++f)
        for (const auto& [key, v] : files[f].elements)
          for (const auto& iv : v) needs[static_cast<size_t>(plan.file_ranks[f])][key].push_back(iv);
      for (auto& n : needs) normalize_needs(n);
      // Independent truth: does `rank` need element e of unit rd (explicit membership).
      auto needs_element = [&](int rank, const ExchangePlan::Read& rd, int64_t e) {
        auto it = needs[static_cast<size_t>(rank)].find({rd.param, rd.state});
        if (it == needs[static_cast<size_t>(rank)].end()) return false;
        for (const auto& [a, n] : it->second)
          if (e >= a && e < a + n) return true;
        return false;
      };
      std::vector<RankBatches> rb;
      for (int r = 0; r < ranks; ++r) rb.push_back(plan_rank_batches(plan, needs, r));
      for (int r = 0; r < ranks; ++r) {
        ASSERT_EQ(rb[r].batches.size(), plan.batches.size());
        uint64_t max_owned = 0, max_send = 0, max_recv = 0;
        for (size_t b = 0; b < plan.batches.size(); ++b) {
          const auto& x = rb[r].batches[b];
          std::vector<size_t> owned;
          for (size_t u : plan.batches[b])
            if (plan.reads[u].owner == r) owned.push_back(u);
          EXPECT_EQ(x.owned, owned);
          ASSERT_EQ(x.owned_at.size(), owned.size() + 1);
          EXPECT_EQ(x.owned_at[0], 0u);
          for (size_t i = 0; i < owned.size(); ++i)
            EXPECT_EQ(x.owned_at[i + 1] - x.owned_at[i], static_cast<uint64_t>(plan.reads[owned[i]].count));
          std::vector<uint64_t> send(static_cast<size_t>(ranks), 0), recv(static_cast<size_t>(ranks), 0);
          for (size_t u : plan.batches[b]) {
            const auto& rd = plan.reads[u];
            for (int64_t e = rd.start; e < rd.start + rd.count; ++e) {
              if (rd.owner == r) {
                for (int s = 0; s < ranks; ++s)
                  if (s != r) send[s] += needs_element(s, rd, e);
              } else {
                recv[rd.owner] += needs_element(r, rd, e);
              }
            }
          }
          EXPECT_EQ(x.send_counts, send) << "batch " << b;
          EXPECT_EQ(x.recv_counts, recv) << "batch " << b;
          for (int s = 0; s < ranks; ++s) EXPECT_EQ(x.send_counts[s], rb[s].batches[b].recv_counts[r]);
          max_owned = std::max(max_owned, x.owned_at.back());
          max_send = std::max(max_send, std::accumulate(send.begin(), send.end(), uint64_t{0}));
          max_recv = std::max(max_recv, std::accumulate(recv.begin(), recv.end(), uint64_t{0}));
        }
        EXPECT_EQ(rb[r].max_owned, max_owned);
        EXPECT_EQ(rb[r].max_send, max_send);
        EXPECT_EQ(rb[r].max_recv, max_recv);
      }
    }
  }
}

}  // namespace exchange_plan_test
