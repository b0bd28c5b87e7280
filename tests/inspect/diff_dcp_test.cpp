// ucp-diff on universal folders ucp-union made from PyTorch DCP checkpoints (no DeepSpeed model files:
// read from manifest.json alone) and on DCP folders themselves, run as users run it: from another
// working folder, relative paths, defaults left out. The expected answers come from the saving
// script's own truth (tests/formats/dcp/data/<variant>.truth/tensors.safetensors): fsdp_w2 (FSDP2
// Shard(0) over 2 ranks) and ranklocal_w2 (a rank-local save_state_dict of 2 ranks) hold the same
// seeded model, byte for byte in their truths; fsdp_optim_w2 adds Adam state.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/dcp/dcp_data.h"
#include "io/safetensors_file.h"
#include "support/paths.h"
#include "support/process.h"

namespace diff_dcp_test {

namespace fs = std::filesystem;
using namespace ucpkit;

namespace {

const std::string& kData = ucpkit::testing::kDcpData;

struct Room {
  std::string root, work;
};

// <scratch>/work (the tools' working folder) and <scratch>/<v>: ucp-union of each DCP variant.
Room room_with(const std::string& name, const std::vector<std::string>& variants) {
  Room r;
  r.root = ucpkit::testing::scratch_dir("diff_dcp_" + name);
  r.work = r.root + "/work";
  fs::create_directories(r.work);
  for (const auto& v : variants) {
    fs::copy(kData + "/" + v, r.root + "/" + v + ".dcp", fs::copy_options::recursive);
    const auto u = ucpkit::testing::run_split_in(r.work, kBin + "/ucp-union -q --input ../" + v + ".dcp --output ../" + v, r.root);
    EXPECT_EQ(u.rc, 0) << u.err;
  }
  return r;
}

ucpkit::testing::SplitResult diff(const Room& r, const std::string& args) {
  return ucpkit::testing::run_split_in(r.work, kBin + "/ucp-diff " + args, r.root);
}

std::string slurp_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::map<std::string, SafetensorsTensor> truth_of(const std::string& v) {
  const std::string p = kData + "/" + v + ".truth/tensors.safetensors";
  return parse_safetensors(slurp_file(p), p);
}

}  // namespace

TEST(DiffDcp, SameModelSavedTwoWaysIsEqual) {
  // The truths are equal byte for byte (the premise: a test of the fixtures, not of ucp-diff).
  ASSERT_EQ(slurp_file(kData + "/fsdp_w2.truth/tensors.safetensors"), slurp_file(kData + "/ranklocal_w2.truth/tensors.safetensors"));
  const Room r = room_with("equal", {"fsdp_w2", "ranklocal_w2"});
  const auto d = diff(r, "../fsdp_w2 ../ranklocal_w2 --json");
  ASSERT_EQ(d.rc, 0) << d.err;
  const auto j = nlohmann::json::parse(d.out);
  EXPECT_TRUE(j.value("equal", false));
  EXPECT_EQ(j["a"].value("form", ""), "universal");
  EXPECT_EQ(j.value("tensors", 0u), truth_of("fsdp_w2").size());  // one fp32 state per model tensor
  // A DCP folder itself is converted (as ucp-union converts it) and compares equal to its universal form.
  const auto n = diff(r, "../fsdp_w2.dcp ../ranklocal_w2 --json");
  ASSERT_EQ(n.rc, 0) << n.err;
  EXPECT_EQ(nlohmann::json::parse(n.out)["a"].value("form", ""), "native");
}

TEST(DiffDcp, OptimizerStatesInOneOnlyAndDifferingValuesAreListed) {
  const auto plain = truth_of("fsdp_w2"), optim = truth_of("fsdp_optim_w2");
  // Expected from the truths: model tensors (the fsdp_w2 keys; fsdp_optim_w2 keeps them under
  // model.<fqn> or <fqn>) equal or not, and every exp_avg / exp_avg_sq state in fsdp_optim_w2 only.
  size_t equal = 0, states_only_b = 0;
  for (const auto& [k, t] : plain) {
    const auto it = optim.count("model." + k) ? optim.find("model." + k) : optim.find(k);
    ASSERT_NE(it, optim.end()) << k;
    if (it->second.bytes == t.bytes && it->second.dtype == t.dtype && it->second.shape == t.shape) ++equal;
    for (const char* s : {"exp_avg", "exp_avg_sq"})
      for (const auto& key : {"optim.state." + k + "." + s, "state." + k + "." + s})
        if (optim.count(key)) ++states_only_b;
  }
  ASSERT_GT(states_only_b, 0u);
  const Room r = room_with("differ", {"fsdp_w2", "fsdp_optim_w2"});
  const auto d = diff(r, "../fsdp_w2 ../fsdp_optim_w2 --json --max-listed 1000");
  ASSERT_EQ(d.rc, 3) << d.err;
  const auto j = nlohmann::json::parse(d.out);
  EXPECT_FALSE(j.value("equal", true));
  EXPECT_EQ(j.value("tensors_equal", 0u), equal);
  size_t only_b = 0, steps_only_b = 0;
  for (const auto& l : j["listed"])
    if (l.value("kind", "") == "only_in_b") ++(l["state"] == "step" ? steps_only_b : only_b);
  EXPECT_EQ(only_b, states_only_b);
  // the optimizer's steps too (issue 47: non-tensor items of the universal form compared): one per
  // parameter with Adam state, and param_groups (only b has them) one more difference
  EXPECT_EQ(steps_only_b, states_only_b / 2);
  EXPECT_EQ(j.value("non_tensor_items", 0u), steps_only_b + 1);
}

TEST(DiffDcp, DamagedStateFileIsRefusedByChecksumAndComparedWithoutIt) {
  const Room r = room_with("damaged", {"fsdp_w2"});
  fs::copy(r.root + "/fsdp_w2", r.root + "/copy", fs::copy_options::recursive);
  // Flip one bit of the last element of tok_embeddings.weight's fp32.pt data record (the record's
  // bytes end where the zip's trailing records begin: find the element by value).
  const auto t = truth_of("fsdp_w2").at("tok_embeddings.weight");
  const std::string file = r.root + "/copy/zero/tok_embeddings.weight/fp32.pt";
  std::string bytes = slurp_file(file);
  const size_t at = bytes.find(t.bytes.substr(t.bytes.size() - 64));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 60] ^= 0x01;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  const auto d = diff(r, "../fsdp_w2 ../copy");
  EXPECT_EQ(d.rc, 1) << d.out;
  EXPECT_NE(d.err.find("copy/zero/tok_embeddings.weight/fp32.pt"), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("mismatch"), std::string::npos) << d.err;  // the file's zip CRC-32 (or the manifest's crc32)
  EXPECT_EQ(d.err.find('\n'), d.err.size() - 1) << d.err;
  const auto n = diff(r, "../fsdp_w2 ../copy --no-verify --json");
  ASSERT_EQ(n.rc, 3) << n.err;
  const auto j = nlohmann::json::parse(n.out);
  ASSERT_EQ(j["listed"].size(), 1u);
  EXPECT_EQ(j["listed"][0].value("param", ""), "tok_embeddings.weight");
  EXPECT_EQ(j["listed"][0].value("differing", 0), 1);
}

}  // namespace diff_dcp_test
