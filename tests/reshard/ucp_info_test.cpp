// UcpInfo without I/O: TP slices per join rule, vocabulary re-padding, ZeRO partitions and
// padding, pipeline stages, layout checks; and the flat-range copy of a TP slice.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "core/error.h"
#include "reshard/exchange.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"
#include "reshard/universal_reader.h"
#include "plan_models.h"

namespace ucp_info_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
using patterns::JoinKind;
using patterns::ParamRule;
using namespace ucpkit::reshard::test_models;

namespace {

// The reference: materialize the TP slice by explicit index arithmetic.
std::vector<float> slice_ref(const std::vector<float>& u, const std::vector<int64_t>& ushape, const TpSlice& s) {
  std::vector<float> out;
  const int64_t rows = ushape[0], cols = ushape.size() > 1 ? ushape[1] : 1;
  auto at = [&](int64_t r, int64_t c) { return r < rows ? u[r * cols + c] : 0.0f; };
  if (s.dim == 0) {
    for (auto [a, n] : s.pieces)
      for (int64_t r = a; r < a + n; ++r)
        for (int64_t c = 0; c < cols; ++c) out.push_back(at(r, c));
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (auto [a, n] : s.pieces)
        for (int64_t c = a; c < a + n; ++c) out.push_back(at(r, c));
  }
  return out;
}

std::vector<float> iota_vec(int64_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 1.0f);
  return v;
}

}  // namespace

TEST(TpSlice, CatDim0AndDim1) {
  patterns::PatternSet set;
  auto s = tp_slice("w", {8, 6}, rule(JoinKind::Cat, 0), set, 2, 1, -1);
  EXPECT_EQ(s.shape, (std::vector<int64_t>{4, 6}));
  ASSERT_EQ(s.pieces.size(), 1u);
  EXPECT_EQ(s.pieces[0], (std::pair<int64_t, int64_t>{4, 4}));
  s = tp_slice("w", {8, 6}, rule(JoinKind::Cat, 1), set, 3, 2, -1);
  EXPECT_EQ(s.dim, 1);
  EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(s.pieces[0], (std::pair<int64_t, int64_t>{4, 2}));
}

TEST(TpSlice, TwoSubParamsTakesEachHalf) {
  patterns::PatternSet set;
  auto s = tp_slice("h4h", {8, 2}, rule(JoinKind::TwoSubParams), set, 2, 1, -1);
  ASSERT_EQ(s.pieces.size(), 2u);
  EXPECT_EQ(s.pieces[0], (std::pair<int64_t, int64_t>{2, 2}));
  EXPECT_EQ(s.pieces[1], (std::pair<int64_t, int64_t>{6, 2}));
  EXPECT_EQ(s.shape, (std::vector<int64_t>{4, 2}));
}

TEST(TpSlice, SubParamsGqaUnequalSizes) {
  patterns::PatternSet set;
  patterns::SubParamSpec spec;
  spec.sub_sizes = {8, 4, 4};  // q, k, v rows
  spec.shape = {16, -1};
  set.sub_params.push_back(spec);
  auto r = rule(JoinKind::SubParams);
  r.sub_param_index = 0;
  auto s = tp_slice("qkv", {16, 3}, r, set, 2, 1, -1);
  ASSERT_EQ(s.pieces.size(), 3u);
  EXPECT_EQ(s.pieces[0], (std::pair<int64_t, int64_t>{4, 4}));
  EXPECT_EQ(s.pieces[1], (std::pair<int64_t, int64_t>{10, 2}));
  EXPECT_EQ(s.pieces[2], (std::pair<int64_t, int64_t>{14, 2}));
  EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 3}));
  EXPECT_THROW(tp_slice("qkv", {16, 3}, r, set, 8, 0, -1), Error);  // 4 kv rows over 8 ranks
}

TEST(TpSlice, VocabularyRepaddedForNewTp) {
  patterns::PatternSet set;
  EXPECT_EQ(pad_vocab(10, 2, 2), 12);
  EXPECT_EQ(pad_vocab(100, 8, 3), 120);
  EXPECT_EQ(infer_vocab_multiple(100, 112, 2), 8);
  auto s = tp_slice("emb", {10, 4}, rule(JoinKind::Cat, 0, true), set, 2, 1, 12);
  EXPECT_EQ(s.shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(s.pieces[0], (std::pair<int64_t, int64_t>{6, 6}));
  EXPECT_THROW(tp_slice("emb", {10, 4}, rule(JoinKind::Cat, 0, true), set, 2, 0, 8), Error);
}

TEST(CopyFlatRange, MatchesExplicitIndexingForEveryRangeAndRule) {
  patterns::PatternSet set;
  struct Case {
    std::vector<int64_t> ushape;
    TpSlice slice;
  };
  const std::vector<Case> cases = {
      {{10, 6}, tp_slice("a", {10, 6}, rule(JoinKind::Cat, 1), set, 3, 1, -1)},
      {{10, 6}, tp_slice("b", {10, 6}, rule(JoinKind::Cat, 0, true), set, 2, 1, 12)},
      {{12, 6}, tp_slice("c", {12, 6}, rule(JoinKind::TwoSubParams), set, 3, 2, -1)},
      {{10, 6}, tp_slice("d", {10, 6}, rule(JoinKind::Replicate), set, 4, 3, -1)},
  };
  for (const auto& c : cases) {
    const auto src = iota_vec(c.ushape[0] * c.ushape[1]);
    const auto want = slice_ref(src, c.ushape, c.slice);
    const int64_t n = c.slice.numel();
    ASSERT_EQ((int64_t)want.size(), n);
    for (int64_t a = 0; a < n; a += 5)
      for (int64_t b = a; b <= n; b += 7) {
        std::vector<float> got(b - a, -1.0f);
        copy_flat_range(src.data(), c.ushape, c.slice, a, b, got.data());
        for (int64_t i = a; i < b; ++i) ASSERT_EQ(got[i - a], want[i]) << "range " << a << ".." << b << " at " << i;
      }
  }
}

TEST(Partition, PaddingToTwiceDpAndTrailingAllPaddingRanks) {
  GroupPlan g;
  Slot a, b;
  a.slice.shape = {7};
  b.slice.shape = {3};
  b.offset = 7;
  g.slots = {a, b};
  g.numel = 10;
  g.partition_count = 8;
  g.padded = 16;  // multiple of 2 * 8
  g.partition = 2;
  auto p0 = partition_of(g, 0);
  ASSERT_EQ(p0.fragments.size(), 1u);
  EXPECT_EQ(p0.fragments[0].numel, 2);
  auto p3 = partition_of(g, 3);  // elements 6..7: end of a, start of b
  ASSERT_EQ(p3.fragments.size(), 2u);
  EXPECT_EQ(p3.fragments[0].param_offset, 6);
  EXPECT_EQ(p3.fragments[1].start, 1);
  EXPECT_EQ(p3.fragments[1].param_offset, 0);
  EXPECT_EQ(p3.padding, 0);
  EXPECT_EQ(partition_of(g, 4).padding, 0);
  EXPECT_EQ(partition_of(g, 5).padding, 2);
  EXPECT_TRUE(partition_of(g, 7).fragments.empty());
  EXPECT_EQ(partition_of(g, 7).padding, 2);
}

TEST(UcpInfo, PlanForTinyModel) {
  auto m = tiny_model();
  TargetLayout t;
  t.tp = 2;
  t.dp = 3;
  auto plan = ucp_info(m, t);
  EXPECT_EQ(plan.padded_vocab, 12);
  ASSERT_EQ(plan.mp_ranks.size(), 2u);
  const auto& g0 = plan.mp_ranks[1].groups[0];
  ASSERT_EQ(g0.slots.size(), 2u);
  EXPECT_EQ(g0.slots[0].slice.shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(g0.slots[1].slice.shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(g0.numel, 40);
  EXPECT_EQ(g0.padded, 42);  // multiple of 6
  EXPECT_EQ(g0.partition, 14);
  EXPECT_EQ(partition_of(g0, 2).padding, 2);
  EXPECT_EQ(plan.optim_file(1, 1), "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt");
  auto j = plan.to_json(m);
  EXPECT_EQ(j["ranks"].size(), 6u);
  EXPECT_EQ(j["ranks"][0]["partitions"][0]["fragments"][0]["name"], "emb");
}

TEST(UcpInfo, Zero3SubGroupsAndPerParameterPartitions) {
  auto m = tiny_model();
  TargetLayout t;
  t.tp = 2;
  t.dp = 3;
  t.zero_stage = 3;
  auto plan = ucp_info(m, t);
  // TP rank 1: emb [6, 4] (24 elements, 8 per DP rank) and dense [4, 4] (16, 6 per rank) in group 0.
  const auto& g = plan.mp_ranks[1].groups.at(0);
  ASSERT_TRUE(g.per_param);
  EXPECT_EQ(g.partition, 8 + 6);
  const auto p2 = partition_of(g, 2);
  ASSERT_EQ(p2.fragments.size(), 2u);
  EXPECT_EQ(p2.fragments[0].start, 0);  // emb elements [16, 24)
  EXPECT_EQ(p2.fragments[0].numel, 8);
  EXPECT_EQ(p2.fragments[0].param_offset, 16);
  EXPECT_EQ(p2.fragments[1].start, 8);  // dense elements [12, 16), then 2 padding
  EXPECT_EQ(p2.fragments[1].numel, 4);
  EXPECT_EQ(p2.fragments[1].param_offset, 12);
  EXPECT_EQ(p2.padding, 2);
  EXPECT_EQ(plan.zero3_model_file(2, 1), "zero_pp_rank_2_mp_rank_01_model_states.pt");

  // Sub-groups close once the per-rank slices reach sub_group_size, never across optimizer groups.
  t.dp = 4;
  t.sub_group_size = 5;
  plan = ucp_info(m, t);
  const auto& gs = plan.mp_ranks[1].groups;
  ASSERT_EQ(gs.size(), 3u);  // [emb] (6 >= 5), [dense] (4), [norm] (group 1)
  EXPECT_EQ(gs[0].slots.at(0).name, "emb");
  EXPECT_EQ(gs[1].slots.at(0).name, "dense");
  EXPECT_EQ(gs[2].group, 1);

  // More ranks than elements: trailing ranks own an empty, all-padding slice.
  t.tp = 1;
  t.dp = 16;
  t.sub_group_size = 1000000000;
  plan = ucp_info(m, t);
  const auto& norm = plan.mp_ranks[0].groups.at(1);
  EXPECT_EQ(norm.partition, 1);
  EXPECT_EQ(partition_of(norm, 3).fragments.size(), 1u);
  EXPECT_TRUE(partition_of(norm, 4).fragments.empty());
  EXPECT_EQ(partition_of(norm, 4).padding, 1);
}

TEST(UcpInfo, ImpossibleLayoutsAndOptionCombos) {
  auto m = tiny_model();
  TargetLayout t;
  t.tp = 3;  // 4 heads
  EXPECT_THROW(ucp_info(m, t), Error);
  t.tp = 1;
  t.pp = 2;
  t.zero_stage = 2;
  EXPECT_THROW(ucp_info(m, t), UsageError);
  t.pp = 1;
  t.zero_stage = 0;
  EXPECT_THROW(ucp_info(m, t), UsageError);  // ZeRO-0 without BF16_Optimizer
  t.zero_stage = 1;
  t.ep = 2;
  EXPECT_THROW(ucp_info(m, t), UsageError);  // no experts
  t.ep = 1;
  t.zero_stage = 3;
  m.pipeline = true;
  EXPECT_THROW(ucp_info(m, t), Error);  // PipelineEngine runs ZeRO 0/1 only
}

TEST(UcpInfo, PipelineStagesLayerFilesAndTiedCopy) {
  // PipelineModule's type:transformer partition: the blocks spread over the stages (stage_of_blocks),
  // the layers before the first block on the first stage, the ones after the last on the last; the
  // tied embedding on the first stage and, as the head's copy (layer 8), on the last.
  TargetLayout t;
  t.pp = 2;
  t.dp = 1;
  auto m = pipeline_model(true);
  auto info = ucp_info(m, t);
  EXPECT_EQ(info.stage_layers, (std::vector<std::vector<int>>{{1, 3, 4}, {5, 6, 7, 8}}));
  ASSERT_EQ(info.mp_ranks.size(), 2u);
  auto layer_names = [&](const MpRankPlan& mr) {
    std::vector<std::pair<int, std::string>> out;
    for (const auto& lf : mr.layers)
      for (const auto& [local, where] : lf.entries) out.push_back({lf.layer, local});
    return out;
  };
  using Entries = std::vector<std::pair<int, std::string>>;
  EXPECT_EQ(layer_names(info.mp_ranks[0]),
            (Entries{{1, "word_embeddings.weight"}, {3, "mlp.weight"}, {4, "mlp.weight"}}));
  EXPECT_EQ(layer_names(info.mp_ranks[1]), (Entries{{5, "mlp.weight"},
                                                    {6, "mlp.weight"},
                                                    {7, "final_layernorm.weight"},
                                                    {8, "word_embeddings.weight"}}));
  auto slot_names = [](const MpRankPlan& mr) {
    std::vector<std::string> out;
    for (const auto& g : mr.groups)
      for (const auto& s : g.slots) out.push_back(s.name);
    return out;
  };
  const std::string tied = "tied_modules.embed.word_embeddings.weight";
  EXPECT_EQ(slot_names(info.mp_ranks[0]), (std::vector<std::string>{tied, "3.mlp.weight", "4.mlp.weight"}));
  // The last stage's flat buffer: the tied copy before its own parameters (PipelineModule registers
  // tied modules first), or after them where the source showed that order.
  EXPECT_EQ(slot_names(info.mp_ranks[1]),
            (std::vector<std::string>{tied, "5.mlp.weight", "6.mlp.weight", "7.final_layernorm.weight"}));
  m.tied_copy_first = false;
  info = ucp_info(m, t);
  EXPECT_EQ(slot_names(info.mp_ranks[1]),
            (std::vector<std::string>{"5.mlp.weight", "6.mlp.weight", "7.final_layernorm.weight", tied}));
  // Untied, 3 stages: blocks 2 + 1 + 1, no head copy.
  t.pp = 3;
  info = ucp_info(pipeline_model(false), t);
  EXPECT_EQ(info.stage_layers, (std::vector<std::vector<int>>{{1, 3, 4}, {5}, {6, 7}}));
  // Layer files list their entries in the source file's key order when it is known.
  m = pipeline_model(false);
  add_param(m, "7.final_layernorm.bias", {4}, rule(JoinKind::Replicate), 0, 7);
  m.params.back().local = "final_layernorm.bias";
  m.layer_keys[7] = {"final_layernorm.bias", "final_layernorm.weight"};
  t.pp = 2;
  info = ucp_info(m, t);
  EXPECT_EQ(layer_names(info.mp_ranks[1]), (Entries{{5, "mlp.weight"},
                                                    {6, "mlp.weight"},
                                                    {7, "final_layernorm.bias"},
                                                    {7, "final_layernorm.weight"}}));
}

TEST(UcpInfo, StagesOfBlocks) {
  EXPECT_EQ(stage_of_blocks(4, 2), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(stage_of_blocks(5, 3), (std::vector<int>{0, 0, 1, 1, 2}));
}

// The MPI exchange plan, from what each target file needs of each atomic tensor (synthetic needs
// shaped like a ZeRO target: DP partition files each taking a contiguous run of the flat buffer of
// all parameters, in every state; two weight files taking the fp32 state of half the parameters).
TEST(Exchange, PlanReadsEveryElementOnceByAMainUserAndKeepsFilesInStep) {
  ModelInfo m = tiny_model();
  for (int i = 0; i < 9; ++i) m.params.push_back(m.params[i % 3]);  // 12 parameters of 40, 32, 4 elements
  const size_t S = m.states.size(), P = m.params.size(), T = P * S;
  int64_t flat = 0;
  std::vector<int64_t> offset;  // of each parameter in the flat buffer
  for (const auto& p : m.params) offset.push_back(std::exchange(flat, flat + p.stored_numel));
  for (int nfiles : {1, 3, 4, 7}) {
    std::vector<FileNeeds> files(static_cast<size_t>(nfiles) + 2);
    for (int f = 0; f < nfiles; ++f) {
      const int64_t lo = flat * f / nfiles, hi = flat * (f + 1) / nfiles;
      for (size_t p = 0; p < P; ++p) {
        const int64_t a = std::max(lo, offset[p]), b = std::min(hi, offset[p] + m.params[p].stored_numel);
        if (a >= b) continue;
        for (int s = 0; s < static_cast<int>(S); ++s) files[f].elements[{static_cast<int>(p), s}] = {{a - offset[p], b - a}};
        files[f].bytes += static_cast<uint64_t>(b - a) * 4 * S;
      }
    }
    for (size_t p = 0; p < P; ++p) {
      auto& w = files[static_cast<size_t>(nfiles) + (p < P / 2 ? 0 : 1)];
      w.elements[{static_cast<int>(p), 0}] = {{0, m.params[p].stored_numel}};
      w.bytes += static_cast<uint64_t>(m.params[p].stored_numel) * 2;
    }
    // Files with nothing to fill (ZeRO-3 or pipeline model files): spread by count.
    const size_t with_bytes = files.size();
    files.resize(files.size() + 5);
    // Independent truth: what each file needs of element e of tensor t.
    auto file_needs_element = [&](size_t f, size_t t, int64_t e) {
      auto it = files[f].elements.find({static_cast<int>(t / S), static_cast<int>(t % S)});
      if (it == files[f].elements.end()) return false;
      for (const auto& [a, n] : it->second)
        if (e >= a && e < a + n) return true;
      return false;
    };
    for (int ranks : {1, 2, 3, 5}) {
      for (uint64_t budget : {4ull, 100ull, 1000ull, 1ull << 40}) {
        SCOPED_TRACE("files " + std::to_string(nfiles) + " ranks " + std::to_string(ranks) + " budget " +
                     std::to_string(budget));
        const auto plan = plan_exchange(m, files, ranks, budget);
        // Files balanced by bytes: the spread is at most the largest file.
        ASSERT_EQ(plan.file_ranks.size(), files.size());
        std::vector<uint64_t> load(ranks, 0);
        uint64_t largest_file = 0;
        for (size_t f = 0; f < files.size(); ++f) {
          load[plan.file_ranks[f]] += files[f].bytes;
          largest_file = std::max(largest_file, files[f].bytes);
        }
        const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
        EXPECT_LE(*hi - *lo, largest_file);
        std::vector<size_t> count(ranks, 0);
        for (size_t f = 0; f < with_bytes; ++f) ++count[plan.file_ranks[f]];
        for (size_t f = with_bytes; f < files.size(); ++f) {
          EXPECT_EQ(count[plan.file_ranks[f]], *std::min_element(count.begin(), count.end())) << "file " << f;
          ++count[plan.file_ranks[f]];
        }
        // Units: every element of every tensor in exactly one, in model order, none larger than
        // budget / 32 bytes (at least one element).
        EXPECT_EQ(plan.unit_elements, std::max<int64_t>(1, static_cast<int64_t>(budget / 128)));
        ASSERT_EQ(plan.first_unit.size(), T + 1);
        for (size_t t = 0; t < T; ++t) {
          int64_t at = 0;
          for (size_t u = plan.first_unit[t]; u < plan.first_unit[t + 1]; ++u) {
            const auto& r = plan.reads[u];
            EXPECT_EQ(static_cast<size_t>(r.param) * S + static_cast<size_t>(r.state), t);
            EXPECT_EQ(r.start, at);
            EXPECT_GE(r.count, 1);
            EXPECT_LE(r.count, plan.unit_elements);
            EXPECT_EQ(r.bytes, static_cast<uint64_t>(r.count) * 4);
            at += r.count;
          }
          EXPECT_EQ(at, m.params[t / S].stored_numel) << "tensor " << t;
        }
        // Each unit read once, by a rank whose files need (nearly) the most of its elements.
        std::vector<int> seen(plan.reads.size(), 0);
        for (size_t b = 0; b < plan.batches.size(); ++b) {
          uint64_t bytes = 0, largest = 0;
          for (size_t i = 0; i < plan.batches[b].size(); ++i) {
            const size_t u = plan.batches[b][i];
            if (i > 0) EXPECT_LT(plan.batches[b][i - 1], u);  // model order inside a batch
            const auto& r = plan.reads[u];
            ++seen[u];
            EXPECT_EQ(r.batch, static_cast<int>(b));
            ASSERT_GE(r.owner, 0);
            ASSERT_LT(r.owner, ranks);
            std::vector<uint64_t> need(ranks, 0);
            const size_t t = static_cast<size_t>(r.param) * S + static_cast<size_t>(r.state);
            for (size_t f = 0; f < files.size(); ++f)
              for (int64_t e = r.start; e < r.start + r.count; ++e) need[plan.file_ranks[f]] += file_needs_element(f, t, e);
            const uint64_t most = *std::max_element(need.begin(), need.end());
            EXPECT_GE(need[r.owner] * 10, most * 9) << "unit " << u;  // within 9/10 of the most
            bytes += r.bytes;
            largest = std::max(largest, r.bytes);
          }
          if (b + 1 < plan.batches.size()) EXPECT_GE(bytes, budget);
          EXPECT_LT(bytes, budget + largest);  // closed as soon as the budget was reached
        }
        for (size_t u = 0; u < seen.size(); ++u) EXPECT_EQ(seen[u], 1) << "unit " << u;
        if (budget == (1ull << 40)) EXPECT_EQ(plan.batches.size(), 1u);
        // Files in step: each unit's queue is the file needing most of its elements (lowest index
        // on ties); a queue is read in model order, and after every batch any two queues are done
        // to the same fraction within half a unit of each.
        std::vector<long> queue(plan.reads.size(), -1);
        for (size_t u = 0; u < plan.reads.size(); ++u) {
          const auto& r = plan.reads[u];
          const size_t t = static_cast<size_t>(r.param) * S + static_cast<size_t>(r.state);
          uint64_t best = 0;
          for (size_t f = 0; f < files.size(); ++f) {
            uint64_t n = 0;
            for (int64_t e = r.start; e < r.start + r.count; ++e) n += file_needs_element(f, t, e);
            if (n > best) best = n, queue[u] = static_cast<long>(f);
          }
        }
        std::map<long, uint64_t> total, largest_in, done;
        std::map<long, int> last_batch;
        for (size_t u = 0; u < plan.reads.size(); ++u) {
          total[queue[u]] += plan.reads[u].bytes;
          largest_in[queue[u]] = std::max(largest_in[queue[u]], plan.reads[u].bytes);
          if (last_batch.count(queue[u])) EXPECT_GE(plan.reads[u].batch, last_batch[queue[u]]);
          last_batch[queue[u]] = plan.reads[u].batch;
        }
        for (size_t b = 0; b < plan.batches.size(); ++b) {
          for (size_t u : plan.batches[b]) done[queue[u]] += plan.reads[u].bytes;
          for (const auto& [q1, d1] : done)
            for (const auto& [q2, d2] : done) {
              const double f1 = static_cast<double>(d1) / total[q1], f2 = static_cast<double>(d2) / total[q2];
              const double slack = (static_cast<double>(largest_in[q1]) / total[q1] +
                                    static_cast<double>(largest_in[q2]) / total[q2]) / 2;
              EXPECT_LE(std::abs(f1 - f2), slack + 1e-9) << "batch " << b << " queues " << q1 << " " << q2;
            }
        }
      }
    }
  }
}

// What a rank needs from an atomic tensor: the elements of its TP slices, as merged intervals,
// compared with explicit indexing.
TEST(Exchange, NeedsAreTheSliceElementsMerged) {
  ModelInfo m = tiny_model();
  patterns::PatternSet set;
  Slot dense;  // [4, 8] split along columns over TP 2: rank 1 holds columns 4..7 of every row
  dense.param = 1;
  dense.slice = tp_slice("dense", {4, 8}, m.params[1].rule, set, 2, 1, -1);
  Slot emb;  // [10, 4] split along rows over TP 2 with the vocabulary padded to 12 rows
  emb.param = 0;
  emb.slice = tp_slice("emb", {10, 4}, m.params[0].rule, set, 2, 1, 12);
  // Storage of bf16: dense elements [2, 2 + 10) of the slice; emb: its whole slice (6 rows, 1 padding).
  std::vector<StorageSource> sources = {{0, 20, &dense, 2, 1}, {20, 20 + 48, &emb, 0, 0}};
  AtomicNeeds needs;
  add_needs(m, sources, DType::BFloat16, needs);
  add_needs(m, {{0, 8, &dense, 0, 1}}, DType::BFloat16, needs);  // overlaps the first: merged
  normalize_needs(needs);
  // Independent truth: slice element i of dense rank 1 is atomic (i / 4) * 8 + 4 + i % 4.
  auto expect = [](std::vector<int64_t> elems) {
    std::sort(elems.begin(), elems.end());
    std::vector<std::pair<int64_t, int64_t>> iv;
    for (int64_t e : elems) {
      if (!iv.empty() && iv.back().first + iv.back().second == e)
        ++iv.back().second;
      else if (iv.empty() || iv.back().first + iv.back().second < e)
        iv.emplace_back(e, 1);
    }
    return iv;
  };
  std::vector<int64_t> d;
  for (int64_t i = 0; i < 12; ++i) d.push_back(i / 4 * 8 + 4 + i % 4);
  EXPECT_EQ((needs[{1, 1}]), expect(d));
  std::vector<int64_t> e;  // rows 6..9 exist (24..39), rows 10..11 are padding
  for (int64_t i = 24; i < 40; ++i) e.push_back(i);
  EXPECT_EQ((needs[{0, 0}]), expect(e));
  EXPECT_EQ(needs.size(), 2u);
}

}  // namespace ucp_info_test
