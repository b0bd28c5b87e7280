// ucp-union on DeepSpeed ZeRO-3 checkpoints in the byte form torch >= 2.0 writes (issue 13: with
// torch >= 2.0 every fp32_flat_groups entry is a _rebuild_from_type_v2 record carrying {'ds_id': ...},
// and ucp-union used to stop with "fp32 of group 0 is not a tensor"). The checkpoint comes from
// tests/generator/gen_ds_checkpoint.py --zero 3 rewritten by tests/generator/dsgen/torch2.py; the universal output
// is checked bit for bit against the generator's ground truth by tests/to_universal/check_universal.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/paths.h"
#include "support/process.h"

namespace torch2_test {

namespace fs = std::filesystem;

namespace {

struct Result {
  int rc;
  std::string out;
};

Result run(const std::string& cmd) {
  Result r{0, ""};
  r.rc = ucpkit::testing::run_command(cmd, &r.out);
  return r;
}

std::string q(const fs::path& p) { return ucpkit::testing::quote(p.string()); }

fs::path fresh(const std::string& name) { return ucpkit::testing::scratch_dir("Torch2." + name); }

// A small ZeRO-3 checkpoint (2 dp ranks, 2 layers, sub-groups) in torch 2.x byte form.
fs::path torch2_zero3(const fs::path& d, const std::string& dtype) {
  const fs::path ck = d / ("zero3_" + dtype);
  auto g = run(kPy + " " + kSrc + "/tests/generator/gen_ds_checkpoint.py --output " + q(ck) +
               " --zero 3 --dp 2 --layers 2 --sub-group-size 3000 --dtype " + dtype);
  EXPECT_EQ(g.rc, 0) << g.out;
  auto t = run(kPy + " " + kSrc + "/tests/generator/dsgen/torch2.py " + q(ck));
  EXPECT_EQ(t.rc, 0) << t.out;
  return ck;
}

class Torch2Zero3 : public ::testing::TestWithParam<std::string> {};

TEST_P(Torch2Zero3, UnionBitExact) {
  auto d = fresh(GetParam());
  auto ck = torch2_zero3(d, GetParam());
  const std::string prefix = GetParam() == "bf16" ? "bf16_" : "";
  // the rewritten file really carries the torch 2.x records
  auto dis = run(kPy + " -c \"import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); n=z.namelist(); "
                 "p=z.read([x for x in n if x.endswith('/data.pkl')][0]); "
                 "print(b'_rebuild_from_type_v2' in p, b'ds_id' in p, [x.split('/',1)[1] for x in n if '/.' in x])\" " +
                 q(ck / "global_step100" / (prefix + "zero_pp_rank_0_mp_rank_00_optim_states.pt")));
  EXPECT_NE(dis.out.find("True True ['.format_version', '.storage_alignment', '.data/serialization_id']"),
            std::string::npos) << dis.out;
  auto r = run(kBin + "/ucp-union -q --input " + q(ck) + " --output " + q(d / "universal"));
  ASSERT_EQ(r.rc, 0) << r.out;
  auto c = run(kPy + " " + kSrc + "/tests/to_universal/check_universal.py " + q(d / "universal") + " " + q(ck));
  EXPECT_EQ(c.rc, 0) << c.out;
}

INSTANTIATE_TEST_SUITE_P(Ucp, Torch2Zero3, ::testing::Values("bf16", "fp16", "fp32"));

// A tensor ucpkit cannot represent (a sparse tensor record, torch._utils._rebuild_sparse_tensor) in
// an optimizer file: one-line error naming the file and the construct, exit 1, nothing written.
TEST(Torch2, SparseTensorRefused) {
  auto d = fresh("sparse");
  auto ck = torch2_zero3(d, "bf16");
  const fs::path f = ck / "global_step100" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt";
  auto s = run(kPy + " -c \"import sys; sys.path.insert(0, sys.argv[2]); from dsgen import stubs; import torch; "
               "o=torch.load(sys.argv[1], weights_only=False); g=o['optimizer_state_dict']['fp32_flat_groups']; "
               "g[0]=torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (g[0].numel(),)); torch.save(o, sys.argv[1])\" " +
               q(f) + " " + q(fs::path(kSrc) / "tests" / "generator"));
  ASSERT_EQ(s.rc, 0) << s.out;
  auto r = run(kBin + "/ucp-union -q --input " + q(ck) + " --output " + q(d / "universal"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find(f.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sparse tensor (torch._utils._rebuild_sparse_tensor)"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "universal"));
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename().string().find(".ucp-tmp-"), std::string::npos) << e.path();
}

}  // namespace

}  // namespace torch2_test
