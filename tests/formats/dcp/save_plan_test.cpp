// formats/dcp save plans: torch's compute_local_shape_and_global_offset on worked examples (its own
// docstring's, uneven torch.chunk splits), and whole plans checked against the real torch 2.6 saves
// committed in tests/formats/dcp/data: the same chunks per tensor, in the same order, in the same
// data file (replica deduplication included).
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/dcp/dcp_data.h"
#include "formats/dcp/metadata.h"
#include "formats/dcp/reader.h"
#include "formats/dcp/rewrite.h"
#include "formats/dcp/save_plan.h"
#include "formats/dcp/writer.h"

namespace dcp_save_plan_test {

using namespace ucpkit;
using namespace ucpkit::formats::dcp;

namespace {

using V = std::vector<int64_t>;

// fqn -> chunks (offsets, sizes) in listed order.
std::map<std::string, std::vector<std::pair<V, V>>> chunks_of(const std::vector<Entry>& entries) {
  std::map<std::string, std::vector<std::pair<V, V>>> m;
  for (const Entry& e : entries)
    for (const Chunk& c : e.chunks) m[e.fqn].push_back({c.offsets, c.sizes});
  return m;
}

// (fqn, offsets or none) -> data file, from real metadata and from a plan.
using Where = std::map<std::pair<std::string, V>, std::string>;
Where where_of(const Metadata& md) {
  Where w;
  for (const Item& it : md.items) w[{it.fqn, it.offset.value_or(V{-1})}] = it.storage.relative_path;
  return w;
}
Where where_of(const SavePlan& p) {
  Where w;
  for (const PlannedFile& f : p.files)
    for (const PlannedItem& it : f.items)
      w[{p.entries[it.entry].fqn, it.chunk == PlannedItem::kBytes ? V{-1} : p.entries[it.entry].chunks[it.chunk].offsets}] =
          f.relative_path;
  return w;
}

// The saving ranks' state-dict order: the order of planner_data (each rank's flattening map, merged),
// not of state_dict_metadata (the global plan lists rank 0's kept items first).
std::vector<Entry> in_state_dict_order(const Metadata& md) {
  std::vector<Entry> out;
  for (size_t k = 0; k < md.planner->size(); ++k) out.push_back(*md.find(std::string(md.planner->flat(k))));
  EXPECT_EQ(out.size(), md.entries.size());
  return out;
}

void expect_plan_is_torchs(const std::string& variant, const Target& target) {
  SCOPED_TRACE(variant);
  const Metadata md = read_metadata(ucpkit::testing::kDcpData + "/" + variant + "/.metadata");
  const SavePlan plan = make_save_plan(in_state_dict_order(md), target);
  EXPECT_EQ(chunks_of(plan.entries), chunks_of(md.entries));
  EXPECT_EQ(where_of(plan), where_of(md));
  size_t items = 0;
  for (const auto& f : plan.files) items += f.items.size();
  EXPECT_EQ(items, md.items.size());
}

}  // namespace

// torch/distributed/tensor/_utils.py's docstring: an (8, 4) tensor on a 2x4 mesh, [Shard(0), Shard(0)].
TEST(DcpSavePlan, LocalBoxTorchDocstringNestedRowShards) {
  for (int64_t r = 0; r < 8; ++r) {
    const Chunk c = local_box({8, 4}, {2, 4}, {r / 4, r % 4}, {Placement::shard(0), Placement::shard(0)});
    EXPECT_EQ(c.sizes, (V{1, 4})) << r;
    EXPECT_EQ(c.offsets, (V{r, 0})) << r;
  }
}

// The same docstring: a (2,) tensor over 8 ranks, Shard(0): ranks past the data get empty boxes at 2.
TEST(DcpSavePlan, LocalBoxTorchDocstringEmptyShards) {
  const V want_size{1, 1, 0, 0, 0, 0, 0, 0}, want_off{0, 1, 2, 2, 2, 2, 2, 2};
  for (int64_t r = 0; r < 8; ++r) {
    const Chunk c = local_box({2}, {8}, {r}, {Placement::shard(0)});
    EXPECT_EQ(c.sizes, V{want_size[r]}) << r;
    EXPECT_EQ(c.offsets, V{want_off[r]}) << r;
  }
}

// torch.chunk's uneven split (ceil-sized pieces): 5 rows over 4 ranks are 2, 2, 1, 0 at 0, 2, 4, 5;
// over 2 ranks 3 and 2. Columns and 2-D: 7 columns over 2 ranks are 4 and 3.
TEST(DcpSavePlan, LocalBoxUnevenSplits) {
  const V size4{2, 2, 1, 0}, off4{0, 2, 4, 5};
  for (int64_t r = 0; r < 4; ++r) {
    const Chunk c = local_box({5, 3}, {4}, {r}, {Placement::shard(0)});
    EXPECT_EQ(c.sizes, (V{size4[r], 3}));
    EXPECT_EQ(c.offsets, (V{off4[r], 0}));
  }
  EXPECT_EQ(local_box({5, 3}, {2}, {1}, {Placement::shard(0)}).sizes, (V{2, 3}));
  EXPECT_EQ(local_box({5, 3}, {2}, {1}, {Placement::shard(0)}).offsets, (V{3, 0}));
  const Chunk col = local_box({3, 7}, {2}, {1}, {Placement::shard(1)});
  EXPECT_EQ(col.sizes, (V{3, 3}));
  EXPECT_EQ(col.offsets, (V{0, 4}));
  // (Shard(0), Shard(1)) on a 2x2 mesh, rank (1, 1) of a 5x7 tensor: rows 3:5, columns 4:7.
  const Chunk g = local_box({5, 7}, {2, 2}, {1, 1}, {Placement::shard(0), Placement::shard(1)});
  EXPECT_EQ(g.offsets, (V{3, 4}));
  EXPECT_EQ(g.sizes, (V{2, 3}));
  // Replicate leaves the whole box.
  EXPECT_EQ(local_box({5, 7}, {2}, {1}, {Placement::replicate()}).sizes, (V{5, 7}));
}

// Whole tensors: one rank, one file, every entry once in state-dict order.
TEST(DcpSavePlan, WholeTensorsOnRankZero) {
  std::vector<Entry> in{{"a", false, DType::Float32, {3, 2}, {}}, {"b", true, DType::Float32, {}, {}},
                        {"c", false, DType::BFloat16, {}, {}}};
  const SavePlan p = make_save_plan(in, Target::whole());
  ASSERT_EQ(p.files.size(), 1u);
  EXPECT_EQ(p.files[0].relative_path, "__0_0.distcp");
  ASSERT_EQ(p.files[0].items.size(), 3u);
  EXPECT_EQ(p.entries[0].chunks.size(), 1u);
  EXPECT_EQ(p.entries[0].chunks[0].sizes, (V{3, 2}));
  EXPECT_EQ(p.entries[2].chunks[0].sizes, V{});
  EXPECT_EQ(p.files[0].items[1].chunk, PlannedItem::kBytes);
  EXPECT_NE(plan_json(p).find("\"relative_path\": \"__0_0.distcp\""), std::string::npos);
}

// Boxes past the first eight of an entry (make_save_plan compares the first few, indexes the rest): 64 ranks of a
// 1,000-row tensor hold 63 distinct boxes of 16 rows (the last 8) and one empty one past the end, each once, in rank
// order; a scalar all hold is one item; an entry with 64 column boxes of a grid likewise.
TEST(DcpSavePlan, ManyBoxesOfOneEntryAreEachPlannedOnce) {
  std::vector<Entry> in{{"w", false, DType::Float32, {1000, 3}, {}}, {"s", false, DType::Float32, {}, {}}};
  const SavePlan p = make_save_plan(in, Target::rows(64));
  const auto& w = p.entries[0].chunks;
  int64_t rows = 0;
  for (size_t k = 0; k < w.size(); ++k) {
    EXPECT_EQ(w[k].offsets[0], rows) << k;
    rows += w[k].sizes[0];
  }
  EXPECT_EQ(rows, 1000);
  EXPECT_GE(w.size(), 63u);
  EXPECT_LE(w.size(), 64u);
  EXPECT_EQ(p.entries[1].chunks.size(), 1u);
  EXPECT_NO_THROW(check_chunks_cover(p.entries[0], "plan"));
  size_t items = 0;
  for (const auto& f : p.files) items += f.items.size();
  EXPECT_EQ(items, w.size() + 1);
}

// Replicas: dedup_save_plans walks the items in order of first appearance (rank 0's whole list
// first) and gives each to the holder with the fewest planned bytes so far (bytes items weigh 1):
// rank 0 has its 8-byte row of w when s (held by all) comes, so s goes to rank 1, t to rank 2, g to 3.
TEST(DcpSavePlan, ReplicasGoToTheLeastLoadedRank) {
  std::vector<Entry> in{{"w", false, DType::Float32, {4, 2}, {}},  // one 8-byte row per rank
                        {"s", false, DType::Float32, {}, {}},
                        {"t", false, DType::Float32, {}, {}},
                        {"g", true, DType::Float32, {}, {}}};
  const SavePlan p = make_save_plan(in, Target::rows(4));
  ASSERT_EQ(p.files.size(), 4u);
  EXPECT_EQ(p.files[0].items.size(), 1u);
  const char* extra[] = {"s", "t", "g"};
  for (int r = 1; r < 4; ++r) {
    ASSERT_EQ(p.files[r].items.size(), 2u) << r;
    EXPECT_EQ(p.entries[p.files[r].items[0].entry].fqn, "w");
    EXPECT_EQ(p.entries[p.files[r].items[1].entry].fqn, extra[r - 1]);
  }
  EXPECT_EQ(p.entries[0].chunks.size(), 4u);
}

// A rank's items come in one run per first holder (replicas first held by rank 0, rows first held by the rank itself,
// rows of short tensors first held by the ranks before it): merged, each data file lists them in state-dict order.
TEST(DcpSavePlan, EachFileListsItsItemsInStateDictOrder) {
  std::vector<Entry> in;
  for (int k = 0; k < 60; ++k) {
    const std::string n = std::to_string(k);
    if (k % 3 == 0) in.push_back({"s" + n, false, DType::Float32, {}, {}});
    else if (k % 3 == 1) in.push_back({"w" + n, false, DType::Float32, {8, 2}, {}});
    else in.push_back({"v" + n, false, DType::Float32, {2 + k % 5, 3}, {}});  // fewer rows than ranks for some
  }
  const SavePlan p = make_save_plan(in, Target::rows(8));
  size_t items = 0;
  for (const PlannedFile& f : p.files) {
    items += f.items.size();
    for (size_t i = 1; i < f.items.size(); ++i) EXPECT_LT(f.items[i - 1].entry, f.items[i].entry) << f.relative_path;
  }
  size_t chunks = 0;
  for (const Entry& e : p.entries) chunks += e.chunks.size();
  EXPECT_EQ(items, chunks);
}

TEST(DcpSavePlan, TargetNamesAndMeshes) {
  EXPECT_EQ(target_kind_name(Target::grid(4, 2).kind), "grid");
  EXPECT_EQ(target_kind_name(Target::replicated(2).kind), "replicated");
  EXPECT_EQ(mesh_shape(Target::grid(8, 2)), (V{4, 2}));
  EXPECT_EQ(mesh_shape(Target::whole()), V{1});
  EXPECT_EQ(placements_for(Target::columns(2), 1), std::vector<Placement>{Placement::shard(0)});
  EXPECT_EQ(placements_for(Target::grid(4, 2), 1), (std::vector<Placement>{Placement::shard(0), Placement::replicate()}));
}

TEST(DcpSavePlan, BadTargetsAndInputs) {
  EXPECT_THROW(mesh_shape(Target::grid(6, 4)), UsageError);
  EXPECT_THROW(mesh_shape(Target::rows(0)), UsageError);
  std::vector<Entry> twice{{"a", false, DType::Float32, {2}, {}}, {"a", false, DType::Float32, {2}, {}}};
  EXPECT_THROW(make_save_plan(twice, Target::whole()), Error);
  // Among many (the repeat found by hash tag and name, not position): the second listing is named.
  std::vector<Entry> many;
  for (int k = 0; k < 5000; ++k) many.push_back({"layer." + std::to_string(k) + ".w", false, DType::Float32, {2}, {}});
  EXPECT_NO_THROW(make_save_plan(many, Target::rows(2)));
  many.push_back(many[3171]);
  try {
    make_save_plan(many, Target::rows(2));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "DCP plan: 'layer.3171.w' is listed twice");
  }
  // rewrite_plan skips the check only for a Metadata whose index holds each of its entries: one built without an
  // index, or with a repeat added after it (add_entry keeps the first), is still checked.
  Metadata md;
  md.entries = twice;
  EXPECT_THROW(rewrite_plan(md, Target::rows(2), {}), Error);
  Metadata indexed;
  indexed.add_entry(twice[0]);
  EXPECT_NO_THROW(rewrite_plan(indexed, Target::rows(2), {}));
  indexed.add_entry(twice[1]);
  EXPECT_THROW(rewrite_plan(indexed, Target::rows(2), {}), Error);
}

// Real torch 2.6 saves: plain tensors on 2 ranks (each written once, spread by the replica balance);
// FSDP2 Shard(0) on 2 ranks; the 2x2 mesh with 1-D (Shard(0), Replicate())
// replicas; FSDP2 with Adam state and param_groups bytes items (placed by the dedup balance).
TEST(DcpSavePlan, MatchesTorchReplicatedPlainTensors) { expect_plan_is_torchs("plain_w2", Target::replicated(2)); }
TEST(DcpSavePlan, MatchesTorchFsdpRows) { expect_plan_is_torchs("fsdp_w2", Target::rows(2)); }
TEST(DcpSavePlan, MatchesTorchTwoDimensionalMesh) { expect_plan_is_torchs("twod_w4", Target::grid(4, 2)); }
TEST(DcpSavePlan, MatchesTorchFsdpWithOptimizerState) { expect_plan_is_torchs("fsdp_optim_w2", Target::rows(2)); }

// plan_json prints the plan: mesh, entries with their chunks, files with their items in write order.
TEST(DcpSavePlan, JsonOfTheRowsPlan) {
  std::vector<Entry> in{{"w", false, DType::BFloat16, {3, 2}, {}}, {"g", true, DType::Float32, {}, {}}};
  const auto j = nlohmann::json::parse(plan_json(make_save_plan(in, Target::rows(2))));
  EXPECT_EQ(j["mesh"], nlohmann::json::parse("[2]"));
  EXPECT_EQ(j["entries"][0]["dtype"], "bfloat16");
  EXPECT_EQ(j["entries"][0]["chunks"], nlohmann::json::parse(R"([{"offsets": [0, 0], "sizes": [2, 2]},
                                                                {"offsets": [2, 0], "sizes": [1, 2]}])"));
  EXPECT_EQ(j["entries"][1]["bytes"], true);
  // Rank 0 has 8 bytes of w when g comes, rank 1 has none yet (first appearance is on rank 0): g on rank 1.
  EXPECT_EQ(j["files"][0]["items"], nlohmann::json::parse(R"([{"fqn": "w", "offsets": [0, 0]}])"));
  EXPECT_EQ(j["files"][1]["relative_path"], "__1_0.distcp");
  EXPECT_EQ(j["files"][1]["items"], nlohmann::json::parse(R"([{"fqn": "w", "offsets": [2, 0]}, {"fqn": "g", "bytes": true}])"));
}

}  // namespace dcp_save_plan_test
