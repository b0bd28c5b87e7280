// lib/reshard/deepspeed_writer in isolation, on the GPT fixture's universal checkpoint (ucp-union of the
// dsgen source) planned for TP 2 DP 3 ZeRO-1 bf16: the module weights of every slot
// (low_precision_slice) and every ZeRO partition of every state (partition_tensor) against dsgen's
// ground truth sliced, padded and rounded here; the sources of generated storages; files laid out
// without writing anything; and the model file and optimizer shards of one rank read back by Python
// torch.load and compared with dsgen's own files for that layout (tests/reshard/check_rank_files.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "io/torch/torch_file.h"
#include "reshard/deepspeed_writer.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"
#include "reshard/universal_fixture.h"
#include "reshard/universal_reader.h"
#include "support/process.h"

namespace deepspeed_writer_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

namespace {

constexpr int kTp = 2, kDp = 3;
constexpr int64_t kVocabMultiple = 8;  // tests/reshard/cases.py target_args: --vocab-multiple 8

struct Setup {
  const loadtest::UnionedCase& c;
  nlohmann::json meta;  // the source truth's meta.json: parameter kinds, vocabulary
  ModelInfo model;
  UcpInfo plan;
  std::unique_ptr<UniversalReader> reader;
  pickle::ValuePtr common;

  Setup() : c(loadtest::gpt_case()) {
    std::ifstream in(c.truth / "meta.json");
    in >> meta;
    model = read_model_info(c.universal.string());
    model.vocab_multiple = kVocabMultiple;
    TargetLayout t;
    t.tp = kTp;
    t.dp = kDp;
    t.zero_stage = 1;
    t.dtype = DType::BFloat16;
    plan = ucp_info(model, t);
    reader = std::make_unique<UniversalReader>(model, c.universal.string(), true);
    common = load_torch((c.universal / "zero" / "optimizer_state.pt").string());
  }
  std::unique_ptr<DeepSpeedWriter> writer() const {
    return std::make_unique<DeepSpeedWriter>(model, plan, *reader, common);
  }
};

const Setup& setup() {
  static const Setup s;
  return s;
}

// dsgen's parameter record (kind: col / row / replicate / average; vocab).
const nlohmann::json& truth_param(const std::string& name) {
  for (const auto& p : setup().meta["params"])
    if (p["name"] == name) return p;
  throw std::runtime_error("no ground truth for " + name);
}

// The ground truth of `state` of universal parameter `name`, fp32, row-major, with its shape.
std::vector<float> truth_values(const std::string& name, const std::string& state, std::vector<int64_t>* shape) {
  auto root = load_torch((setup().c.truth / "universal" / "zero" / name / (state + ".pt")).string());
  const Tensor& t = root->at("param")->as_tensor();
  *shape = t.shape();
  return t.contiguous().to_vector<float>();
}

// TP rank `t`'s slice of that truth as Megatron splits it (dsgen's tp_slice): column-parallel on
// dim 0 (the vocabulary first padded with zero rows to a multiple of kVocabMultiple * kTp), row-parallel
// on dim 1, replicated and averaged parameters whole. Flattened.
std::vector<float> expected_slice(const std::string& name, const std::string& state, int t) {
  const auto& p = truth_param(name);
  const std::string kind = p["kind"];
  std::vector<int64_t> shape;
  std::vector<float> full = truth_values(name, state, &shape);
  if (kind == "replicate" || kind == "average") return full;
  const int64_t rows = shape.at(0), cols = shape.size() > 1 ? shape[1] : 1;
  if (kind == "col") {
    int64_t padded = rows;
    if (p["vocab"].get<bool>()) {
      const int64_t m = kVocabMultiple * kTp;
      padded = (rows + m - 1) / m * m;
    }
    const int64_t per = padded / kTp;
    std::vector<float> out(static_cast<size_t>(per * cols), 0.0f);
    for (int64_t r = 0; r < per; ++r)
      for (int64_t c = 0; c < cols; ++c)
        if (t * per + r < rows) out[r * cols + c] = full[(t * per + r) * cols + c];
    return out;
  }
  if (kind == "row") {
    const int64_t per = cols / kTp;
    std::vector<float> out;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < per; ++c) out.push_back(full[r * cols + t * per + c]);
    return out;
  }
  throw std::runtime_error(name + ": kind " + kind + " not handled by this test");
}

// fp32 -> bf16, round to nearest even (no NaN in the ground truth).
uint16_t bf16_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

std::vector<uint8_t> generated_bytes(const Tensor& t) {
  std::vector<uint8_t> b(static_cast<size_t>(t.storage()->nbytes()));
  t.storage()->generate(0, b);
  return b;
}

std::vector<float> as_floats(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

// The flat fp32 buffer of `g` (slots at their offsets, zeros elsewhere, g.padded elements) from the
// ground truth.
std::vector<float> expected_flat(const GroupPlan& g, const std::string& state, int tp_rank) {
  std::vector<float> flat(static_cast<size_t>(g.padded), 0.0f);
  for (const Slot& s : g.slots) {
    const auto v = expected_slice(setup().model.params[s.param].name, state, tp_rank);
    EXPECT_EQ(static_cast<int64_t>(v.size()), s.numel()) << s.name;
    std::copy(v.begin(), v.end(), flat.begin() + s.offset);
  }
  return flat;
}

}  // namespace

TEST(DeepSpeedWriterValues, LowPrecisionSliceIsTheRoundedTpSlice) {
  const auto& s = setup();
  auto w = s.writer();
  int checked = 0;
  for (const MpRankPlan& mr : s.plan.mp_ranks)
    for (const GroupPlan& g : mr.groups)
      for (const Slot& slot : g.slots) {
        const std::string& name = s.model.params[slot.param].name;
        SCOPED_TRACE(name + " tp rank " + std::to_string(mr.tp_rank));
        Tensor t = w->low_precision_slice(slot);
        EXPECT_EQ(t.dtype(), DType::BFloat16);
        EXPECT_EQ(t.shape(), slot.slice.shape);
        EXPECT_TRUE(t.storage()->is_generated());
        const auto want = expected_slice(name, "fp32", mr.tp_rank);
        const auto bytes = generated_bytes(t);
        ASSERT_EQ(bytes.size(), want.size() * 2);
        size_t bad = 0;
        for (size_t k = 0; k < want.size(); ++k) {
          uint16_t got;
          std::memcpy(&got, bytes.data() + 2 * k, 2);
          bad += got != bf16_of(want[k]);
        }
        EXPECT_EQ(bad, 0u) << "elements differ";
        ++checked;
      }
  EXPECT_GT(checked, 20);  // every parameter of both TP ranks
}

TEST(DeepSpeedWriterValues, PartitionTensorsAreTheFlatBufferCutInDpParts) {
  const auto& s = setup();
  auto w = s.writer();
  int checked = 0;
  for (const MpRankPlan& mr : s.plan.mp_ranks)
    for (const GroupPlan& g : mr.groups) {
      ASSERT_EQ(g.partition_count, kDp);
      ASSERT_EQ(g.padded, g.partition * kDp);
      for (const std::string& state : s.model.states) {
        const auto flat = expected_flat(g, state, mr.tp_rank);
        for (int p = 0; p < kDp; ++p) {
          SCOPED_TRACE("mp " + std::to_string(mr.mp) + " group " + std::to_string(g.group) + " part " +
                       std::to_string(p) + " " + state);
          const std::vector<float> want(flat.begin() + p * g.partition, flat.begin() + (p + 1) * g.partition);
          Tensor owned = w->partition_tensor(g, p, state);
          EXPECT_FALSE(owned.storage()->is_generated());
          EXPECT_EQ(owned.shape(), (std::vector<int64_t>{g.partition}));
          EXPECT_TRUE(owned.to_vector<float>() == want);
          Tensor streamed = w->partition_tensor(g, p, state, -1, true);
          EXPECT_TRUE(streamed.storage()->is_generated());
          EXPECT_TRUE(as_floats(generated_bytes(streamed)) == want);
          const int64_t len = g.partition / 2;  // the first half only
          Tensor prefix = w->partition_tensor(g, p, state, len);
          EXPECT_TRUE(prefix.to_vector<float>() == std::vector<float>(want.begin(), want.begin() + len));
          ++checked;
        }
      }
    }
  EXPECT_EQ(checked, kTp * 2 * kDp * 3);  // 2 TP ranks x 2 groups x 3 DP parts x 3 states
}

TEST(DeepSpeedWriterSources, RecordedSourcesTileGeneratedStorages) {
  const auto& s = setup();
  auto w = s.writer();
  // Without a place to put them, no sources are kept.
  StorageSources none;
  const Slot& first = s.plan.mp_ranks[0].groups[0].slots[0];
  (void)w->low_precision_slice(first);
  EXPECT_TRUE(none.empty());
  const int exp_avg = s.reader->state_index("exp_avg");
  for (const MpRankPlan& mr : s.plan.mp_ranks)
    for (const GroupPlan& g : mr.groups) {
      for (const Slot& slot : g.slots) {  // a module weight: one source, the whole storage
        StorageSources rec;
        Tensor t = w->low_precision_slice(slot, &rec);
        ASSERT_EQ(rec.size(), 1u);
        const auto src = rec.at(t.storage().get());
        ASSERT_EQ(src.size(), 1u) << slot.name;
        EXPECT_EQ(src[0].byte_begin, 0u);
        EXPECT_EQ(src[0].byte_end, t.storage()->nbytes());
        EXPECT_EQ(src[0].slot, &slot);
        EXPECT_EQ(src[0].param_offset, 0);
        EXPECT_EQ(src[0].state, 0);
      }
      for (int p = 0; p < kDp; ++p) {
        SCOPED_TRACE("mp " + std::to_string(mr.mp) + " group " + std::to_string(g.group) + " part " +
                     std::to_string(p));
        StorageSources rec;
        Tensor t = w->partition_tensor(g, p, "exp_avg", -1, true, &rec);
        const auto bytes = generated_bytes(t);
        ASSERT_EQ(rec.size(), 1u);
        const auto src = rec.at(t.storage().get());
        ASSERT_FALSE(src.empty());
        // Sorted, disjoint, inside the storage; together they hold exactly the partition's real
        // elements (the rest is padding); each is the named slice range, and every byte outside them is 0.
        std::vector<char> covered(bytes.size(), 0);
        uint64_t at = 0, total = 0;
        for (const auto& x : src) {
          EXPECT_GE(x.byte_begin, at);
          EXPECT_LT(x.byte_begin, x.byte_end);
          EXPECT_LE(x.byte_end, bytes.size());
          EXPECT_EQ(x.state, exp_avg);
          EXPECT_TRUE(x.slot >= g.slots.data() && x.slot < g.slots.data() + g.slots.size());
          at = x.byte_end;
          total += x.byte_end - x.byte_begin;
          const auto want = expected_slice(s.model.params[x.slot->param].name, "exp_avg", mr.tp_rank);
          const int64_t n = static_cast<int64_t>((x.byte_end - x.byte_begin) / 4);
          ASSERT_LE(x.param_offset + n, static_cast<int64_t>(want.size()));
          EXPECT_EQ(std::memcmp(bytes.data() + x.byte_begin, want.data() + x.param_offset, n * 4), 0);
          std::fill(covered.begin() + x.byte_begin, covered.begin() + x.byte_end, 1);
        }
        const int64_t real = std::clamp<int64_t>(g.numel - int64_t{p} * g.partition, 0, g.partition);
        EXPECT_EQ(total, static_cast<uint64_t>(real) * 4);
        for (size_t k = 0; k < bytes.size(); ++k)
          if (!covered[k]) ASSERT_EQ(bytes[k], 0) << "byte " << k << " outside every source";
      }
    }
}

TEST(DeepSpeedWriterFiles, LayingOutWritesNothingAndKeepsEveryGeneratedStoragesSources) {
  const auto& s = setup();
  auto w = s.writer();
  const fs::path dir = ucpkit::testing::scratch_dir("ds_writer_lay_out");
  const auto model = w->model_file(1, dir.string());
  const auto optim = w->optim_file(2, 1, dir.string());
  EXPECT_EQ(fs::path(model.path), dir / s.plan.mp_ranks[1].model_file());
  EXPECT_EQ(fs::path(optim.path), dir / s.plan.optim_file(2, 1));
  EXPECT_TRUE(fs::is_empty(dir));
  for (const auto* f : {&model, &optim}) {
    ASSERT_TRUE(f->root && f->root->kind == pickle::Kind::Dict);
    // Every generated storage of the root has its sources, and the file keeps no others.
    const auto storages = generated_storages(f->root);
    ASSERT_FALSE(storages.empty());
    std::set<const Storage*> seen;
    for (const auto& st : storages) {
      seen.insert(st.get());
      EXPECT_FALSE(f->sources_of(st.get()).empty()) << f->path;
    }
    for (const auto& [st, src] : f->sources) EXPECT_TRUE(seen.count(st)) << f->path << ": a source of no storage";
  }
  // Optimizer file: fp32 + 2 moments per group (the model file's module views share one flat buffer per group).
  EXPECT_EQ(optim.sources.size(), 3 * s.plan.mp_ranks[1].groups.size());
  // Job: the same names as the per-kind calls, and saving writes exactly those files.
  FileJob job;
  job.kind = FileJob::Model;
  job.mp = 1;
  const auto files = w->lay_out(job, dir.string());
  ASSERT_EQ(files.size(), 1u);  // not a pipeline model, no experts
  EXPECT_EQ(files[0].path, model.path);
  const uint64_t n = save_file(files[0], {});
  EXPECT_EQ(n, fs::file_size(model.path));
}

TEST(DeepSpeedWriterFiles, OneRankReadByTorchEqualsGeneratorsFiles) {
  const auto& s = setup();
  auto w = s.writer();
  {
    const int mp = 1;  // the second TP rank: its vocabulary slice ends in padding rows
    const fs::path dir = ucpkit::testing::scratch_dir("ds_writer_mp" + std::to_string(mp));
    uint64_t n = save_file(w->model_file(mp, dir.string()), {});
    for (int d = 0; d < kDp; ++d) n += save_file(w->optim_file(d, mp, dir.string()), {.start_writeback = d == 0});
    uint64_t sizes = 0, files = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      sizes += fs::file_size(e.path());
      ++files;
    }
    EXPECT_EQ(files, 1u + kDp);
    EXPECT_EQ(n, sizes);
    std::string out;
    EXPECT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR +
                                       "/tests/reshard/check_rank_files.py " + ucpkit::testing::quote(dir.string()) + " " +
                                       ucpkit::testing::quote(s.c.ref.string()) + " " + ucpkit::testing::quote(s.c.truth.string()) +
                                       " " + std::to_string(mp),
                                   &out),
              0)
        << out;
  }
}

}  // namespace deepspeed_writer_test
