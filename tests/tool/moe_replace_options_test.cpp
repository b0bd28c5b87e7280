// tool::MoeReplaceOptions::check: moe-replace's rules between options, with the messages the tool
// prints (exit 2), and what they give the planner's request (docs/moe-replace.md, docs/commands.md).
#include <gtest/gtest.h>

#include "refusal.h"
#include "tool/moe_replace.h"

namespace moe_replace_options_test {

using ucpkit::testing::refusal;
using ucpkit::tool::MoeReplaceOptions;

TEST(MoeReplaceOptions, NoOutputReplacesTheLoadsOrThePlan) {
  MoeReplaceOptions o;
  o.req.loads_path = "/tmp/ucpkit-mr/loads.json";
  o.output = "/tmp/ucpkit-mr/loads.json";
  EXPECT_EQ(refusal(o),
            "--output /tmp/ucpkit-mr/loads.json is --loads /tmp/ucpkit-mr/loads.json: writing it would replace the input");
  o.output = "/tmp/ucpkit-mr/plan.json";
  o.svg = "/tmp/ucpkit-mr/plan.json";
  EXPECT_EQ(refusal(o),
            "--svg /tmp/ucpkit-mr/plan.json is --output /tmp/ucpkit-mr/plan.json: writing it would replace the plan");
  o.svg = "/tmp/ucpkit-mr/plan.svg";
  EXPECT_EQ(refusal(o), "accepted");
}

// The engine files (SGLang's expert location, vLLM's EPLB state) are written files too (issue 32, WEAK
// cross-checks: they could overwrite --loads or the plan), and no written file replaces --current or
// --previous, the plans a re-placement reads (but --output may: the plan updated in place).
TEST(MoeReplaceOptions, EngineFilesAndPlansReadAreNeverOverwritten) {
  MoeReplaceOptions o;
  o.req.loads_path = "/tmp/ucpkit-mr/loads.json";
  o.output = "/tmp/ucpkit-mr/plan.json";
  o.sglang_out = "/tmp/ucpkit-mr/loads.json";
  EXPECT_EQ(refusal(o), "--sglang-expert-location /tmp/ucpkit-mr/loads.json is --loads /tmp/ucpkit-mr/loads.json: "
                        "writing it would replace the input");
  o.sglang_out = "/tmp/ucpkit-mr/plan.json";
  EXPECT_EQ(refusal(o), "--sglang-expert-location /tmp/ucpkit-mr/plan.json is --output /tmp/ucpkit-mr/plan.json: "
                        "writing it would replace the plan");
  o.sglang_out = "/tmp/ucpkit-mr/sglang.pt";
  o.vllm_out = "/tmp/ucpkit-mr/sglang.pt";
  EXPECT_EQ(refusal(o), "--vllm-eplb-state /tmp/ucpkit-mr/sglang.pt is --sglang-expert-location /tmp/ucpkit-mr/sglang.pt: "
                        "two outputs into one file");
  o.vllm_out = "/tmp/ucpkit-mr/vllm.json";
  o.req.current_path = "/tmp/ucpkit-mr/plan.json";
  EXPECT_EQ(refusal(o), "accepted");  // the plan updated in place
  o.svg = "/tmp/ucpkit-mr/plan.json";
  EXPECT_EQ(refusal(o), "--svg /tmp/ucpkit-mr/plan.json is --current /tmp/ucpkit-mr/plan.json: "
                        "writing it would replace the input");
  o.svg.clear();
  o.req.current_path.clear();
  o.req.previous_path = "/tmp/ucpkit-mr/vllm.json";
  EXPECT_NE(refusal(o).find("--vllm-eplb-state /tmp/ucpkit-mr/vllm.json is --previous"), std::string::npos);
  o.req.previous_path = "/tmp/ucpkit-mr/old.json";
  EXPECT_EQ(refusal(o), "accepted");
}

TEST(MoeReplaceOptions, MaxFailuresAndNodeIds) {
  MoeReplaceOptions o;
  o.output = "p.json";
  o.req.placement.recovery.max_failures = -1;
  EXPECT_EQ(refusal(o), "--max-failures must not be negative");
  o.req.placement.recovery.max_failures = 2;
  o.failed = "3,x";
  EXPECT_NE(refusal(o).find("--failed-nodes"), std::string::npos);
  o.failed = "3,7";
  o.check();
  EXPECT_EQ(o.req.change.failed, (std::vector<int>{3, 7}));
}

TEST(MoeReplaceOptions, WhatTheRequestGets) {
  MoeReplaceOptions o;
  o.output = "p.json";
  o.svg = "p.svg";
  o.exact_limit = 50;
  o.expert_bytes = 1 << 20;
  o.expert_bytes_given = true;
  o.current_given = true;
  o.check();
  EXPECT_EQ(o.req.placement.recovery.exact_limit, 50);
  EXPECT_EQ(o.req.expert_bytes, 1 << 20);
  EXPECT_TRUE(o.req.want_svg);
  EXPECT_FALSE(o.req.want_sglang);
  EXPECT_FALSE(o.req.node_loss_migration);  // --current alone: no migration model
  o.max_moved_given = true;
  o.check();
  EXPECT_TRUE(o.req.node_loss_migration);   // --current with --max-moved-bytes: node-loss migration
}

}  // namespace moe_replace_options_test
