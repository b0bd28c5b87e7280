// lib/formats/dcp/metadata_direct: the one-pass reader gives what the general unpickler's parse gives, on every
// `.metadata` in the repository (torch's own saves, 1.13 to 2.15), takes torch's protocol-4 saves, and leaves
// every other shape to the general unpickler (memo'd containers fetched, older protocols, damage, non-ASCII
// text), whose errors parse_metadata then gives. The damaged and foreign DCP classes: metadata_test.cpp
// (its pickles are written at protocols 2 and 4).
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/dcp/dcp_data.h"
#include "formats/dcp/metadata.h"
#include "formats/dcp/metadata_direct.h"
#include "support/errors.h"
#include "support/files.h"

namespace dcp_metadata_direct_test {

using namespace ucpkit;
using namespace ucpkit::formats::dcp;
using pickle::Kind;
using pickle::ValuePtr;

namespace {

std::span<const uint8_t> span_of(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

// A custom planner's planner_data as the general unpickler builds it.
bool same(const ValuePtr& a, const ValuePtr& b) {
  if (!a || !b) return !a && !b;
  if (a->kind != b->kind || a->s != b->s || a->i != b->i || a->items.size() != b->items.size() ||
      a->entries.size() != b->entries.size())
    return false;
  for (size_t k = 0; k < a->items.size(); ++k)
    if (!same(a->items[k], b->items[k])) return false;
  for (size_t k = 0; k < a->entries.size(); ++k)
    if (!same(a->entries[k].first, b->entries[k].first) || !same(a->entries[k].second, b->entries[k].second))
      return false;
  return true;
}

// The general parse's error, or "" when it reads the bytes.
std::string general_error(const std::string& bytes) {
  return ucpkit::testing::error_of([&] { parse_metadata_general(span_of(bytes), "m"); }, "");
}

}  // namespace

TEST(DcpMetadataDirect, EveryMetadataFileReadsAsTheGeneralUnpicklerReadsIt) {
  std::vector<std::string> taken;
  size_t files = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(std::string(UCPKIT_SOURCE_DIR) + "/tests")) {
    const std::string name = f.path().filename().string();
    if (!f.is_regular_file() || !name.ends_with(".metadata")) continue;
    ++files;
    SCOPED_TRACE(f.path().string());
    const std::string bytes = ucpkit::testing::file_bytes(f.path().string());
    const std::optional<Metadata> direct = parse_metadata_direct(span_of(bytes), f.path().string());
    if (!general_error(bytes).empty()) {
      EXPECT_FALSE(direct) << "the one-pass reader took a file the general unpickler refuses";
      continue;
    }
    if (!direct) continue;
    taken.push_back(std::filesystem::relative(f.path(), ucpkit::testing::kDcpData).string());
    const Metadata general = parse_metadata_general(span_of(bytes), f.path().string());
    EXPECT_EQ(ucpkit::testing::describe_metadata(*direct), ucpkit::testing::describe_metadata(general));
    EXPECT_EQ(direct->era, general.era);
    EXPECT_EQ(direct->path, general.path);
    EXPECT_EQ(!direct->planner, !general.planner);
    if (direct->planner && general.planner) EXPECT_TRUE(*direct->planner == *general.planner);
    EXPECT_TRUE(same(direct->other_planner_data, general.other_planner_data));
    for (const Entry& e : general.entries) {
      EXPECT_EQ(direct->find(e.fqn) - direct->entries.data(), general.find(e.fqn) - general.entries.data());
      EXPECT_EQ(direct->items_of(e.fqn), general.items_of(e.fqn));
    }
  }
  EXPECT_GE(files, 20u);
  // torch's own dcp.save (protocol 4): 2.6 (both TensorProperties eras), 2.14 and 2.15.
  for (const std::string want :
       {"plain_w2/.metadata", "fsdp_optim_w2/.metadata", "fsdp_tp_optim_w4/.metadata", "t26_shardprops_w2/.metadata",
        "t214_plain_w2/.metadata", "t214_zstd_w2/.metadata", "t215_loop_torchtitan_w2/.metadata",
        "t215_loop_gsd_bf16_w2/.metadata", "t215_metadata_2200/.metadata"})
    EXPECT_NE(std::find(taken.begin(), taken.end(), want), taken.end()) << want << " went to the general unpickler";
}

TEST(DcpMetadataDirect, ContainersFilledInSeveralBatchesReadAsTheGeneralUnpicklerReadsThem) {
  // 2,200 tensors saved by torch 2.15's dcp.save (data/README.md): state_dict_metadata and storage_data filled by three
  // SETITEMS each with other containers filled between them (the machine's runs after a container's first fill),
  // planner_data's dict by three in a row (one row of items).
  const std::string path = ucpkit::testing::kDcpData + "/t215_metadata_2200/.metadata";
  const std::string bytes = ucpkit::testing::file_bytes(path);
  const std::optional<Metadata> direct = parse_metadata_direct(span_of(bytes), path);
  ASSERT_TRUE(direct) << "went to the general unpickler";
  const Metadata general = parse_metadata_general(span_of(bytes), path);
  ASSERT_EQ(direct->entries.size(), 2203u);  // and three of param_groups (lr, betas, params)
  EXPECT_EQ(ucpkit::testing::describe_metadata(*direct), ucpkit::testing::describe_metadata(general));
  ASSERT_TRUE(direct->planner && general.planner);
  EXPECT_TRUE(*direct->planner == *general.planner);
  EXPECT_EQ(direct->planner->size(), 2203u);
}

TEST(DcpMetadataDirect, ASizesTuplesFetchedAgainGoToTheGeneralUnpickler) {
  // One tuple object as the arguments of both torch.Size reductions (data/README.md): the one-pass reader folds a
  // Size's two tuples into its node and drops the arguments' node, so a later fetch of them would name whatever node
  // came next; it leaves the file to the general unpickler instead.
  const std::string path = ucpkit::testing::kDcpData + "/size_args_shared/.metadata";
  const std::string bytes = ucpkit::testing::file_bytes(path);
  EXPECT_FALSE(parse_metadata_direct(span_of(bytes), path));
  const Metadata md = parse_metadata(span_of(bytes), path);
  ASSERT_EQ(md.entries.size(), 1u);
  EXPECT_EQ(md.entries[0].size, std::vector<int64_t>{4});
  ASSERT_EQ(md.entries[0].chunks.size(), 1u);
  EXPECT_EQ(md.entries[0].chunks[0].sizes, std::vector<int64_t>{4});
  ASSERT_TRUE(md.planner);
  EXPECT_EQ(md.planner->size(), 1u);
}

TEST(DcpMetadataDirect, OtherShapesGoToTheGeneralUnpicklerAndItsErrors) {
  const std::string real = ucpkit::testing::file_bytes(ucpkit::testing::kDcpData + "/plain_w2/.metadata");
  ASSERT_TRUE(parse_metadata_direct(span_of(real), "m"));
  std::string non_ascii = real;  // one letter of a tensor name made a byte UTF-8 never has
  const size_t at = non_ascii.find("weight");
  ASSERT_NE(at, std::string::npos);
  non_ascii[at] = '\xff';
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"memo'd list fetched into itself", std::string("\x80\x04]\x94h\x00" "a.", 8)},
      {"protocol 2 (BINPUT)", std::string("\x80\x02]q\x00.", 6)},
      {"truncated", real.substr(0, real.size() - 9)},
      {"no STOP", real.substr(0, real.size() - 1)},
      {"non-ASCII text", non_ascii},
      {"a float", std::string("\x80\x04G\x3f\xf0\0\0\0\0\0\0.", 12)},
  };
  for (const auto& [what, bytes] : cases) {
    SCOPED_TRACE(what);
    EXPECT_FALSE(parse_metadata_direct(span_of(bytes), "m"));
    const std::string general = general_error(bytes);
    EXPECT_FALSE(general.empty());
    EXPECT_EQ(ucpkit::testing::error_of([&] { parse_metadata(span_of(bytes), "m"); }, ""), general);
  }
  EXPECT_NE(general_error(cases[0].second).find("reference cycle"), std::string::npos);
  EXPECT_NE(general_error(non_ascii).find("invalid UTF-8"), std::string::npos);
}

}  // namespace dcp_metadata_direct_test
