// formats/dcp/state_keys key_layout: which model tensors are buffers, as ucp-union carries them (issue
// 47): without optimizer state beside parameters with it (a training loop's BatchNorm statistics,
// counters, masks), and in a model-only save those of a dtype no parameter has (torch 1.13's int64
// 'plain'); a save whose model tensors all have optimizer state has none.
#include <gtest/gtest.h>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/state_keys.h"

namespace dcp_state_keys_test {

using namespace ucpkit::formats::dcp;

namespace {

KeyLayout layout_of(const std::string& fixture) {
  const Folder folder = find_folder(ucpkit::testing::kDcpData + "/" + fixture);
  return key_layout(read_folder_metadata(folder));
}

}  // namespace

TEST(DcpKeyLayout, BuffersAreWhatUcpUnionCarriesAsBuffers) {
  const KeyLayout loop = layout_of("t215_loop_torchtitan_w2");
  EXPECT_EQ(loop.layout, "torchtitan");
  EXPECT_EQ(loop.buffers, (std::vector<std::string>{"mask", "scale", "position_ids", "norm.running_mean", "norm.running_var",
                                                    "norm.num_batches_tracked", "train_state.step"}));
  const KeyLayout model_only = layout_of("torch113_w2");
  EXPECT_EQ(model_only.layout, "model only");
  EXPECT_EQ(model_only.buffers, std::vector<std::string>{"plain"});
  EXPECT_TRUE(layout_of("fsdp_optim_w2").buffers.empty());
  EXPECT_TRUE(layout_of("fsdp_w2").buffers.empty());  // model only, every tensor floating
}

}  // namespace dcp_state_keys_test
