// formats/megatron_core/swiglu: the stored SwiGLU fc1 [W_all; V_all] vs the TP-local [W_r; V_r]
// Megatron held in memory, checked on the real TP 2 x DP 2 Llama fixture: the two chunks of each
// TP rank's piece (one in each half, transformer/mlp.py apply_swiglu_sharded_factory) were written
// by ranks of that TP rank (file __{rank}_*.distcp, rank = tp + 2 * dp in Megatron's default
// tp-cp-ep-dp-pp order), and swiglu_tp_local gives exactly their concatenation.
#include <gtest/gtest.h>

#include "formats/megatron_core/mcore_data.h"
#include "formats/megatron_core/reader.h"
#include "formats/megatron_core/swiglu.h"
#include "support/errors.h"

namespace megatron_core_swiglu_test {

using namespace ucpkit;
using namespace ucpkit::formats::megatron_core;

namespace {

int writer_rank(const formats::dcp::Metadata& md, const std::string& fqn, const std::vector<int64_t>& offsets) {
  const std::string& f = md.item_of(fqn, &offsets).storage.relative_path;  // __{rank}_{k}.distcp
  return std::stoi(f.substr(2, f.find('_', 2) - 2));
}

}  // namespace

TEST(McoreSwiglu, TpLocalIsTheRankPiecesOfBothHalves) {
  const Checkpoint ck(ucpkit::testing::kMcoreData + "/llama_gqa_tp2_dp2_v016/fully_reshardable");
  const std::string fqn = "decoder.layers.mlp.linear_fc1.weight";
  const auto& md = ck.dcp().metadata();
  const auto* e = md.find(fqn);
  ASSERT_NE(e, nullptr);
  const int64_t tp = 2, half = e->size[1] / 2, part = half / tp;
  for (int64_t layer = 0; layer < 2; ++layer) {
    const Tensor param = ck.read_param(ck.param("decoder.layers." + std::to_string(layer) + ".mlp.linear_fc1.weight"));
    std::vector<Tensor> locals;
    for (int64_t r = 0; r < tp; ++r) {
      const std::vector<int64_t> w_at{layer, r * part, 0}, v_at{layer, half + r * part, 0};
      EXPECT_EQ(writer_rank(md, fqn, w_at) % tp, r);
      EXPECT_EQ(writer_rank(md, fqn, v_at) % tp, r);
      size_t kw = e->chunks.size(), kv = e->chunks.size();
      for (size_t k = 0; k < e->chunks.size(); ++k) {
        if (e->chunks[k].offsets == w_at) kw = k;
        if (e->chunks[k].offsets == v_at) kv = k;
      }
      ASSERT_LT(kw, e->chunks.size());
      ASSERT_LT(kv, e->chunks.size());
      const Tensor w = ck.dcp().read_chunk(fqn, kw), v = ck.dcp().read_chunk(fqn, kv);
      const Tensor want = cat({w.reshape({part, w.shape()[2]}), v.reshape({part, v.shape()[2]})}, 0);
      locals.push_back(swiglu_tp_local(param, tp, r));
      EXPECT_TRUE(locals.back().equal(want)) << "layer " << layer << " rank " << r;
    }
    EXPECT_TRUE(swiglu_from_tp_locals(locals).equal(param));
  }
  EXPECT_NE(ucpkit::testing::error_of([&] { swiglu_tp_local(Tensor::zeros(DType::Float32, {6, 2}), 2, 0); })
                .find("do not split into [W; V] over TP 2"),
            std::string::npos);
}

}  // namespace megatron_core_swiglu_test
