// formats/dcp: every tensor of every committed real DCP checkpoint (tests/formats/dcp/data, written by
// torch 2.6's torch.distributed.checkpoint.save from 2 and 4 gloo ranks and by torch 1.13's prototype
// DCP; scripts/fixtures/dcp_fixtures.sh) read bit-exact against the full tensors the saving script recorded
// (<variant>.truth/tensors.safetensors: torch's own full_state_dict gather, not DCP loading).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/reader.h"
#include "io/safetensors_file.h"
#include "core/mapped_file.h"
#include "io/torch/torch_file.h"
#include "io/zip/zip_reader.h"
#include "support/process.h"

namespace dcp_reader_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::dcp::ClassEra;
using formats::dcp::Reader;
using ucpkit::testing::slurp;

namespace {

const std::string& kData = ucpkit::testing::kDcpData;

std::map<std::string, SafetensorsTensor> truth_of(const std::string& variant) {
  const std::string p = kData + "/" + variant + ".truth/tensors.safetensors";
  return parse_safetensors(slurp(p), p);
}

// Reads every tensor entry of `dir` and compares it with the truth: same key set, dtype, shape, bytes.
void expect_matches_truth(const std::string& dir, const std::map<std::string, SafetensorsTensor>& truth) {
  Reader r(dir);
  std::set<std::string> tensor_keys;
  for (const auto& e : r.metadata().entries)
    if (!e.is_bytes) tensor_keys.insert(e.fqn);
  std::set<std::string> truth_keys;
  for (const auto& [k, v] : truth) truth_keys.insert(k);
  EXPECT_EQ(tensor_keys, truth_keys) << dir;
  for (const auto& [name, want] : truth) {
    SCOPED_TRACE(dir + " " + name);
    const Tensor t = r.read_tensor(name);
    EXPECT_EQ(dtype_safetensors_name(t.dtype()), want.dtype);
    EXPECT_EQ(t.shape(), want.shape);
    const auto b = t.contiguous().contiguous_bytes();
    ASSERT_EQ(b.size(), want.bytes.size());
    EXPECT_EQ(0, std::memcmp(b.data(), want.bytes.data(), b.size())) << "values differ";
  }
}

size_t chunk_count(const Reader& r) {
  size_t n = 0;
  for (const auto& e : r.metadata().entries) n += e.chunks.size();
  return n;
}

}  // namespace

TEST(DcpReader, Fsdp2RowShardingTwoRanks) {
  expect_matches_truth(kData + "/fsdp_w2", truth_of("fsdp_w2"));
  Reader r(kData + "/fsdp_w2");
  EXPECT_EQ(r.metadata().era, ClassEra::Current);
  const auto* e = r.metadata().find("tok_embeddings.weight");
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->chunks.size(), 2u);  // Shard(0) over 2 ranks: two row blocks
  EXPECT_EQ(e->chunks[1].offsets, (std::vector<int64_t>{e->size[0] / 2, 0}));
}

TEST(DcpReader, TwoDimensionalShardingFourRanks) {
  expect_matches_truth(kData + "/twod_w4", truth_of("twod_w4"));
  Reader r(kData + "/twod_w4");
  const auto* e = r.metadata().find("layers.0.feed_forward.w1.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->chunks.size(), 4u);  // (Shard(0), Shard(1)) on a 2x2 mesh
}

TEST(DcpReader, OptimizerStateThroughGetStateDict) {
  expect_matches_truth(kData + "/fsdp_optim_w2", truth_of("fsdp_optim_w2"));
  Reader r(kData + "/fsdp_optim_w2");
  // Non-tensor optimizer state: bytes items holding torch.save(obj); values as nontensor.json records.
  auto value = [&](const std::string& k) {
    const auto b = r.read_bytes(k);
    return load_torch_bytes(b, k).root;
  };
  EXPECT_DOUBLE_EQ(value("optim.param_groups.0.lr")->as_float(), 0.01);
  EXPECT_DOUBLE_EQ(value("optim.param_groups.0.eps")->as_float(), 1e-08);
  EXPECT_FALSE(value("optim.param_groups.0.amsgrad")->as_bool());
  // DefaultSavePlanner's planner_data: flattened key -> the nested path it came from.
  ASSERT_TRUE(r.metadata().planner);
  EXPECT_EQ(r.metadata().planner->strings("optim.state.norm.weight.exp_avg"),
            (std::vector<std::string>{"optim", "state", "norm.weight", "exp_avg"}));
  EXPECT_TRUE(r.metadata().save_id.has_value());
}

TEST(DcpReader, FsdpTimesTensorParallelFourRanks) {
  expect_matches_truth(kData + "/fsdp_tp_optim_w4", truth_of("fsdp_tp_optim_w4"));
}

TEST(DcpReader, PlainTensorsAreWholeChunks) {
  expect_matches_truth(kData + "/plain_w2", truth_of("plain_w2"));
  Reader r(kData + "/plain_w2");
  for (const auto& e : r.metadata().entries) {
    ASSERT_EQ(e.chunks.size(), 1u) << e.fqn;
    EXPECT_EQ(e.chunks[0].sizes, e.size) << e.fqn;
  }
}

TEST(DcpReader, RankLocalSavesEachReadAlone) {
  // no_dist save: every rank its own folder with its own .metadata (torch 2.6 has no __{rank}.metadata).
  const auto truth = truth_of("ranklocal_w2");
  for (const char* part : {"rank_0", "rank_1"}) {
    ASSERT_TRUE(fs::exists(kData + "/ranklocal_w2/" + part + "/.metadata"));
    expect_matches_truth(kData + "/ranklocal_w2/" + part, truth);
  }
  EXPECT_FALSE(fs::exists(kData + "/ranklocal_w2/.metadata"));
}

TEST(DcpReader, Torch113PrototypeEra) {
  expect_matches_truth(kData + "/torch113_w2", truth_of("torch113_w2"));
  Reader r(kData + "/torch113_w2");
  EXPECT_EQ(r.metadata().era, ClassEra::Prototype);
  const auto b = r.read_bytes("step");
  EXPECT_EQ(load_torch_bytes(b, "step").root->as_int(), 7);
  EXPECT_EQ(r.metadata().find("col")->dtype, DType::BFloat16);
}

TEST(DcpReader, OneChunkAtATimeEqualsItsBoxOfTheTruth) {
  const auto truth = truth_of("twod_w4");
  Reader r(kData + "/twod_w4");
  const std::string name = "layers.0.attention.wo.weight";
  const auto* e = r.metadata().find(name);
  ASSERT_NE(e, nullptr);
  const auto& want = truth.at(name);
  const int64_t cols = want.shape[1];
  for (size_t k = 0; k < e->chunks.size(); ++k) {
    const auto& c = e->chunks[k];
    const auto v = r.read_chunk(name, k).contiguous().to_vector<float>();
    ASSERT_EQ(static_cast<int64_t>(v.size()), c.sizes[0] * c.sizes[1]);
    for (int64_t i = 0; i < c.sizes[0]; ++i)
      for (int64_t j = 0; j < c.sizes[1]; ++j) {
        float w;
        std::memcpy(&w, want.bytes.data() + 4 * ((c.offsets[0] + i) * cols + c.offsets[1] + j), 4);
        ASSERT_EQ(std::memcmp(&v[static_cast<size_t>(i * c.sizes[1] + j)], &w, 4), 0) << k << " " << i << " " << j;
      }
  }
  EXPECT_GT(chunk_count(r), r.metadata().entries.size());
}

TEST(DcpReader, OneItemCheckpoint) {
  // storage_data with one entry is pickled with SETITEM, not SETITEMS.
  expect_matches_truth(kData + "/single_item_w1", truth_of("single_item_w1"));
  Reader r(kData + "/single_item_w1");
  ASSERT_EQ(r.metadata().items.size(), 1u);
  EXPECT_EQ(r.metadata().items[0].storage.relative_path, "__0_0.distcp");
}

TEST(DcpReader, MoreItemsThanOnePickleBatch) {
  // pickle writes SETITEMS in batches of 1000: storage_data of 2500 items spans three. Written now by
  // the real torch 1.13 DCP (many_items.py), truth by the same script.
  const std::string d = ucpkit::testing::scratch_dir("dcp_many_items");
  std::string out;
  const std::string cmd = std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR + "/tests/formats/dcp/many_items.py " +
                          ucpkit::testing::quote(d) + " 2500 2>&1";
  ASSERT_EQ(ucpkit::testing::run_command(cmd, &out), 0) << out;
  const std::string tp = d + "/truth/tensors.safetensors";
  const auto truth = parse_safetensors(slurp(tp), tp);
  ASSERT_EQ(truth.size(), 2500u);
  expect_matches_truth(d + "/ckpt", truth);
  EXPECT_EQ(Reader(d + "/ckpt").metadata().items.size(), 2500u);
}

// view_tensor (a reshard's whole tensors, rewrite.cpp): a tensor saved as one item is a mapped storage of the item's
// record, the same bytes as read_tensor's copy; a tensor of several chunks has no view; a flipped bit in the record is
// caught by view_tensor itself (its CRC-32 pass over the map), naming the data file.
TEST(DcpReader, WholeItemsAreViewsOfTheirRecords) {
  size_t views = 0, none = 0;
  for (const char* v : {"plain_w2", "fsdp_w2", "single_item_w1", "t214_plain_w2"}) {
    const Reader r(kData + "/" + v);
    for (const auto& e : r.metadata().entries) {
      if (e.is_bytes) continue;
      SCOPED_TRACE(std::string(v) + " " + e.fqn);
      const auto view = r.view_tensor(e.fqn);
      if (e.chunks.size() != 1) {
        EXPECT_FALSE(view) << "several chunks have no view";
        ++none;
        continue;
      }
      ASSERT_TRUE(view);
      const Tensor copy = r.read_tensor(e.fqn);
      EXPECT_EQ(view->dtype(), copy.dtype());
      EXPECT_EQ(view->shape(), copy.shape());
      EXPECT_TRUE(view->is_contiguous());
      if (copy.numel() == 0) continue;
      EXPECT_TRUE(view->storage()->is_mapped());
      EXPECT_TRUE(view->equal(copy));
      ++views;
    }
  }
  EXPECT_GT(views, 3u);
  EXPECT_GT(none, 3u);
}

TEST(DcpReader, FlippedBitInAWholeItemIsCaughtByItsView) {
  const Reader clean(kData + "/plain_w2");
  std::string fqn;
  for (const auto& e : clean.metadata().entries)
    if (!e.is_bytes && e.chunks.size() == 1 && e.size.size() == 2 && e.size[0] * e.size[1] >= 16) fqn = e.fqn;
  ASSERT_FALSE(fqn.empty());
  const std::string d = ucpkit::testing::scratch_dir("dcp_view_flip") + "/ckpt";
  const std::string file = ucpkit::testing::flip_first_chunk(kData + "/plain_w2", fqn, d);
  const Reader r(d);
  ucpkit::testing::expect_crc_error([&] { (void)r.view_tensor(fqn); }, file);
}

// view_tensor of a whole item whose zip has an earlier item's layout (TensorZipReader::match_place: only where its
// record's bytes are): a flipped bit in its data or serialization id is refused naming the data file, one in its
// pickle too (parsed again), and an undamaged one is the same view as a fresh reader's.
TEST(DcpReader, WholeItemsViewedThroughAnEarlierItemsLayoutStillCatchDamage) {
  std::string variant;
  std::string first, later;
  const formats::dcp::Item* later_item = nullptr;
  for (const char* v : {"plain_w2", "t214_plain_w2", "fsdp_optim_w2", "single_item_w1"}) {
    const Reader clean(kData + "/" + v);
    std::map<std::tuple<int, std::vector<int64_t>, uint64_t, std::string>, std::vector<std::string>> layouts;
    for (const auto& e : clean.metadata().entries) {
      if (e.is_bytes || e.chunks.size() != 1 || e.size.empty()) continue;
      const auto& item = clean.metadata().item_of(e.fqn, &e.chunks[0].offsets);
      layouts[{static_cast<int>(e.dtype), e.size, item.storage.length, item.storage.relative_path}].push_back(e.fqn);
    }
    for (const auto& [key, fqns] : layouts)
      if (fqns.size() >= 2) variant = v, first = fqns.front(), later = fqns.back();
    if (!variant.empty()) break;
  }
  ASSERT_FALSE(variant.empty()) << "no fixture with two whole items of one layout";
  const Reader clean(kData + "/" + variant);
  const auto& le = *clean.metadata().find(later);
  later_item = &clean.metadata().item_of(later, &le.chunks[0].offsets);
  const std::string src = kData + "/" + variant + "/" + later_item->storage.relative_path;
  const auto records = ZipReader(MappedFile::slice(MappedFile::open(src), later_item->storage.offset,
                                                   later_item->storage.length, "item"))
                           .records();
  {
    const Reader r(kData + "/" + variant);
    ASSERT_TRUE(r.view_tensor(first));
    const auto through = r.view_tensor(later);
    const auto fresh = Reader(kData + "/" + variant).view_tensor(later);
    ASSERT_TRUE(through && fresh);
    EXPECT_TRUE(through->equal(*fresh));
    EXPECT_EQ(through->shape(), fresh->shape());
  }
  int n = 0;
  for (const std::string record : {"/data/0", "/data.pkl", "/.data/serialization_id"}) {
    SCOPED_TRACE(record);
    const std::string d = ucpkit::testing::scratch_dir("dcp_view_layout_flip" + std::to_string(n++)) + "/ckpt";
    fs::copy(kData + "/" + variant, d, fs::copy_options::recursive);
    const std::string file = d + "/" + later_item->storage.relative_path;
    std::string bytes = slurp(file);
    const auto rec = std::find_if(records.begin(), records.end(), [&](const auto& r) {
      return r.first.size() >= record.size() &&
             r.first.compare(r.first.size() - record.size(), record.size(), record) == 0;
    });
    ASSERT_NE(rec, records.end());
    bytes[later_item->storage.offset + rec->second.data_offset + rec->second.size / 2] ^= 0x10;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    const Reader r(d);
    ASSERT_TRUE(r.view_tensor(first));  // its layout remembered
    try {
      (void)r.view_tensor(later);
      ADD_FAILURE() << "a flipped bit went through";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(file), std::string::npos) << err.what();
      EXPECT_EQ(std::string(err.what()).find('\n'), std::string::npos) << err.what();
    }
  }
}

// Items whose zips share a layout are read through the first one's (TensorZipReader remembers it): a later item's
// flipped bit in its data, its pickle or its serialization id is still refused, one line naming the data file;
// every item of every fixture read through one reader equals the truth (expect_matches_truth above).
TEST(DcpReader, ItemsReadThroughAnEarlierItemsLayoutStillCatchDamage) {
  const Reader clean(kData + "/fsdp_optim_w2");
  // Two items of one dtype, chunk shape and item length in one data file (an exp_avg's and an exp_avg_sq's
  // shard): the later one is damaged.
  std::map<std::tuple<int, std::vector<int64_t>, uint64_t, std::string>, std::vector<const formats::dcp::Item*>> layouts;
  std::map<const formats::dcp::Item*, std::string> fqn_of;
  for (const auto& e : clean.metadata().entries) {
    if (e.is_bytes) continue;
    for (const auto& c : e.chunks) {
      const auto& item = clean.metadata().item_of(e.fqn, &c.offsets);
      layouts[{static_cast<int>(e.dtype), c.sizes, item.storage.length, item.storage.relative_path}].push_back(&item);
      fqn_of[&item] = e.fqn;
    }
  }
  const formats::dcp::Item *first = nullptr, *later = nullptr;
  for (auto& [key, items] : layouts)
    if (items.size() >= 2 && !std::get<1>(key).empty()) {
      std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->storage.offset < b->storage.offset; });
      first = items.front(), later = items.back();
    }
  ASSERT_TRUE(first && later);
  const std::string src = kData + "/fsdp_optim_w2/" + later->storage.relative_path;
  const auto records = ZipReader(MappedFile::slice(MappedFile::open(src), later->storage.offset, later->storage.length, "item")).records();
  int variant = 0;
  for (const std::string record : {"/data/0", "/data.pkl", "/.data/serialization_id"}) {
    SCOPED_TRACE(record);
    const std::string d = ucpkit::testing::scratch_dir("dcp_layout_flip" + std::to_string(variant++)) + "/ckpt";
    fs::copy(kData + "/fsdp_optim_w2", d, fs::copy_options::recursive);
    const std::string file = d + "/" + later->storage.relative_path;
    std::string bytes = slurp(file);
    const auto rec = std::find_if(records.begin(), records.end(), [&](const auto& r) {
      return r.first.size() >= record.size() && r.first.compare(r.first.size() - record.size(), record.size(), record) == 0;
    });
    ASSERT_NE(rec, records.end());
    bytes[later->storage.offset + rec->second.data_offset + rec->second.size / 2] ^= 0x10;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    const Reader r(d);
    (void)r.read_tensor(fqn_of[first]);  // its layout remembered
    if (record != "/data.pkl") {
      ucpkit::testing::expect_crc_error([&] { (void)r.read_tensor(fqn_of[later]); }, file);
      continue;
    }
    try {  // the pickle is parsed again, and its damage reported before its CRC-32 is
      (void)r.read_tensor(fqn_of[later]);
      ADD_FAILURE() << "a flipped bit in a pickle went through";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(file), std::string::npos) << err.what();
      EXPECT_EQ(std::string(err.what()).find('\n'), std::string::npos) << err.what();
    }
  }
}

}  // namespace dcp_reader_test
