// to_universal/from_dcp plan_dcp (issue 47), plan only (the fixtures' .metadata, no data read): what a
// training loop's DCP (torch 2.15's dcp.save, tests/formats/dcp/data/README.md) puts into the universal
// form besides its tensors:
//  * every bytes entry that is neither a step nor a nested param_groups value is an item, carried
//    verbatim under its key and path: the LR scheduler, the dataloader position, train_state's bytes,
//    torchtitan's flattened param_groups.<fqn>.<key>; no entry is left "not carried";
//  * the keys it was saved under where they are not get_state_dict's (torchtitan's top-level model keys
//    and optimizer.*, train_state.step beside the model, a plain model.state_dict()'s top-level keys) in
//    source.dcp.keys, with the layout; a DCP saved in get_state_dict's keys records none (its union keeps
//    the bytes it had).
#include <gtest/gtest.h>

#include <algorithm>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/folder.h"
#include "to_universal/from_dcp.h"

namespace from_dcp_test {

using namespace ucpkit;
using nlohmann::json;

namespace {

to_universal::DcpPlan plan_of(const std::string& fixture) {
  const formats::dcp::Folder folder = formats::dcp::find_folder(ucpkit::testing::kDcpData + "/" + fixture);
  return to_universal::plan_dcp(formats::dcp::read_folder_metadata(folder), folder);
}

const to_universal::DcpItem* item(const to_universal::DcpPlan& plan, const std::string& fqn) {
  const auto it = std::find_if(plan.items.begin(), plan.items.end(), [&](const auto& i) { return i.fqn == fqn; });
  return it == plan.items.end() ? nullptr : &*it;
}

}  // namespace

TEST(DcpUnionPlan, TorchtitansBytesEntriesAreItemsAndItsKeysAreRecorded) {
  const auto plan = plan_of("t215_loop_torchtitan_w2");
  EXPECT_TRUE(plan.not_carried.empty());
  EXPECT_TRUE(plan.param_groups.empty());  // flattened: per parameter, carried as items
  EXPECT_EQ(plan.items.size(), 94u);       // 7 x 12 param_groups values, 7 scheduler, 2 dataloader, 1 train_state
  for (const std::string k : {"lr_scheduler.last_epoch", "lr_scheduler._last_lr", "dataloader.position",
                              "train_state.losses", "optimizer.param_groups.emb.weight.lr"})
    EXPECT_NE(item(plan, k), nullptr) << k;
  EXPECT_EQ(item(plan, "optimizer.param_groups.emb.weight.lr")->path, json::array({"optimizer", "param_groups.emb.weight.lr"}));
  EXPECT_EQ(item(plan, "dataloader.position")->path, json::array({"dataloader", "position"}));
  EXPECT_GT(item(plan, "train_state.losses")->bytes, 0u);
  const json& dcp = plan.source.facts.at("dcp");
  EXPECT_EQ(dcp.at("layout"), "torchtitan");
  const json& keys = dcp.at("keys");
  EXPECT_EQ(keys.size(), 7u * 4 + 7);  // each parameter's model tensor, 2 states and step; 7 buffers
  EXPECT_EQ(keys.at("model.emb.weight"), json::array({"emb.weight"}));
  EXPECT_EQ(keys.at("optim.state.emb.weight.exp_avg"), json::array({"optimizer", "state.emb.weight.exp_avg"}));
  EXPECT_EQ(keys.at("optim.state.out.bias.step"), json::array({"optimizer", "state.out.bias.step"}));
  EXPECT_EQ(keys.at("model.train_state.step"), json::array({"train_state", "step"}));
  EXPECT_EQ(keys.at("model.norm.num_batches_tracked"), json::array({"norm.num_batches_tracked"}));
}

TEST(DcpUnionPlan, GetStateDictsKeysNeedNoRecordButTheTrainStateBesideTheModel) {
  const auto plan = plan_of("t215_loop_gsd_bf16_w2");
  EXPECT_TRUE(plan.not_carried.empty());
  EXPECT_EQ(plan.param_groups.size(), 13u);  // nested: into zero/optimizer_state.pt as before
  EXPECT_EQ(plan.items.size(), 10u);         // 7 scheduler, 2 dataloader, train_state.losses
  EXPECT_NE(item(plan, "sched.last_epoch"), nullptr);
  const json& dcp = plan.source.facts.at("dcp");
  EXPECT_EQ(dcp.at("layout"), "get_state_dict");
  EXPECT_EQ(dcp.at("keys"), json({{"model.train_state.step", json::array({"train_state", "step"})}}));
  for (const auto& p : plan.params) EXPECT_EQ(p.dtype, DType::BFloat16) << p.name;
}

TEST(DcpUnionPlan, ASaveInDefaultKeysWithoutBytesEntriesKeepsItsFacts) {
  const json dcp = plan_of("fsdp_optim_w2").source.facts.at("dcp");  // {"model": ..., "optim": ...}
  EXPECT_FALSE(dcp.contains("keys")) << dcp.dump();
  EXPECT_FALSE(dcp.contains("layout"));
  // A plain model.state_dict() save: its top-level keys are recorded (ucp-load --format dcp wrote them as
  // model.<fqn> before, which dcp.load(model.state_dict()) does not find).
  const json model_only = plan_of("fsdp_w2").source.facts.at("dcp");
  EXPECT_EQ(model_only.at("layout"), "model only");
  EXPECT_EQ(model_only.at("keys").size(), 12u);
  EXPECT_EQ(model_only.at("keys").at("model.norm.weight"), json::array({"norm.weight"}));
}

}  // namespace from_dcp_test
