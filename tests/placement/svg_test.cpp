// The plan's SVG (lib/placement/svg.cpp): plan_gpu_chart's sums, and plan_svg's size, bars, node
// columns aligned by physical id (failed and new nodes marked), escaping and the replica map, on a
// small plan whose numbers are worked out by hand.
#include <gtest/gtest.h>

#include <string>

#include "placement/svg.h"

namespace svg_test {

using namespace ucpkit::placement;

namespace {

// 2 nodes x 1 GPU x 3 slots, two layers: GPU loads {7, 8} (loads {9, 4, 2}) and {3, 1} (loads
// {2, 1, 1}: shares 2/3, 1/2, 1), summed {10, 9}.
Plan small_plan() {
  Plan p;
  p.cluster = {2, 1, 3};
  p.algorithm = "hand";
  p.experts = 3;
  p.layers.push_back({{0, 1, 2, 0, 1, 0}, {0, 0, 0, 1, 1, 2}});
  p.layers.push_back({{0, 1, 2, 0, 1, 0}, {0, 0, 0, 1, 1, 2}});
  p.node_ids = {4, 7};
  compute_metrics(p, LoadMatrix{2, 3, {9, 4, 2, 2, 1, 1}}, RecoveryOptions{});
  return p;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(PlanGpuChart, SumsEveryLayerPerGpu) {
  const GpuChart g = plan_gpu_chart(small_plan());
  EXPECT_EQ(g.node_ids, (std::vector<int>{4, 7}));
  EXPECT_EQ(g.gpus_per_node, 1);
  ASSERT_EQ(g.loads.size(), 2u);
  EXPECT_DOUBLE_EQ(g.loads[0], 7 + 2.0 / 3 + 0.5 + 1);
  EXPECT_DOUBLE_EQ(g.loads[1], 8 + 2.0 / 3 + 0.5 + 2.0 / 3);
}

TEST(PlanGpuChart, NodeIdsOfTheWrongLengthBecomeTheIdentity) {
  Plan p = small_plan();
  p.node_ids = {4};
  EXPECT_EQ(plan_gpu_chart(p).node_ids, (std::vector<int>{0, 1}));
  p.layer_metrics.clear();  // no metrics: zero loads
  EXPECT_EQ(plan_gpu_chart(p).loads, (std::vector<double>{0, 0}));
}

// Width 640 (the least), one slot column per slot of a node: 520 / 3 cells, capped at 28; the map
// starts at 60 + 220 + 60 = 340, so the height is 340 + 30 + 2 * 28 + 20 = 446.
TEST(PlanSvg, PlanAloneHasItsBarsAndReplicaMap) {
  Plan p = small_plan();
  p.layer_metrics[0].gpu_loads = {7, 8};
  p.layer_metrics[1].gpu_loads = {1, 2};  // summed {8, 10}: round heights
  const std::string svg = plan_svg(p, GpuChart{}, "before", 0);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640.0\" height=\"446.0\"", 0), 0u) << svg;
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "class=\"after\""), 2u);
  EXPECT_EQ(count(svg, "class=\"before\""), 0u);
  EXPECT_EQ(count(svg, "class=\"failed\""), 0u);
  EXPECT_EQ(count(svg, "class=\"new\""), 0u);
  // Bars 0.9 of (640 - 80) / 2 wide; the most loaded GPU's is the chart's full 220 high (from y = 60), the
  // other 8 / 10 of it.
  EXPECT_NE(
      svg.find("y=\"60.0\" width=\"252.0\" height=\"220.0\" fill=\"#1f77b4\"><title>after: node 7 GPU 0: 10</title>"),
      std::string::npos)
      << svg;
  EXPECT_NE(
      svg.find("y=\"104.0\" width=\"252.0\" height=\"176.0\" fill=\"#1f77b4\"><title>after: node 4 GPU 0: 8</title>"),
      std::string::npos)
      << svg;
  EXPECT_NE(svg.find("2 nodes, 2 GPU places (max 10 tokens)"), std::string::npos);
  EXPECT_NE(svg.find("hand: " + p.cluster.describe() + ", GPU load summed over 2 layers"), std::string::npos);
  // The replica map: 6 cells, labelled with the experts (cells of 28 >= 14), rows named by node id.
  EXPECT_NE(svg.find("Replica map, layer 0 "), std::string::npos);
  EXPECT_EQ(count(svg, "<rect x=\""), 6u);
  EXPECT_NE(svg.find("<title>node 7 GPU 0 slot 2: expert 0</title>"), std::string::npos);
  EXPECT_NE(svg.find("<title>node 4 GPU 0 slot 1: expert 1</title>"), std::string::npos);
  EXPECT_NE(svg.find("font-size=\"12.0\">n7</text>"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"hsl(120,65%,70%)\""), std::string::npos);  // expert 1 of 3: hue 120
}

// Before on physical nodes {0, 4}, the plan on {4, 7}: columns 0, 4, 7; node 0 failed, node 7 new.
TEST(PlanSvg, ColumnsAlignByPhysicalNodeWithFailedAndNewMarked) {
  const Plan p = small_plan();
  GpuChart before;
  before.node_ids = {0, 4};
  before.gpus_per_node = 1;
  before.loads = {5, 6};
  const std::string svg = plan_svg(p, before, "before: <current> & co", 0);
  EXPECT_EQ(count(svg, "class=\"before\""), 2u);
  EXPECT_EQ(count(svg, "class=\"after\""), 2u);
  EXPECT_EQ(count(svg, "class=\"failed\""), 1u);
  EXPECT_EQ(count(svg, "class=\"new\""), 1u);
  const size_t n0 = svg.find(">n0</text>"), n4 = svg.find(">n4</text>"), n7 = svg.find(">n7</text>");
  ASSERT_NE(n0, std::string::npos);
  EXPECT_LT(n0, n4);
  EXPECT_LT(n4, n7);
  EXPECT_NE(svg.find("<title>before: node 0 GPU 0: 5</title>"), std::string::npos);
  EXPECT_NE(svg.find("3 nodes, 3 GPU places"), std::string::npos);
  EXPECT_NE(svg.find("&#9632; before: &lt;current&gt; &amp; co</tspan>"), std::string::npos) << svg;
}

TEST(PlanSvg, EscapesTheAlgorithmAndClampsTheLayer) {
  Plan p = small_plan();
  p.algorithm = "a<b&c>";
  const std::string svg = plan_svg(p, GpuChart{}, "x", 99);
  EXPECT_NE(svg.find(">a&lt;b&amp;c&gt;: "), std::string::npos);
  EXPECT_NE(svg.find("Replica map, layer 1 "), std::string::npos);
  EXPECT_NE(plan_svg(p, GpuChart{}, "x", -5).find("Replica map, layer 0 "), std::string::npos);
}

// 16 slots per node: cells of 520 / 16 = 32.5, capped at 28; 48 per node: 10.8, too small for labels.
TEST(PlanSvg, SmallCellsHaveNoLabels) {
  Plan p;
  p.cluster = {1, 1, 48};
  p.experts = 48;
  std::vector<int> phy(48);
  for (int i = 0; i < 48; ++i) phy[i] = i;
  p.layers.push_back({phy, std::vector<int>(48, 0)});
  p.node_ids = {0};
  compute_metrics(p, LoadMatrix{1, 48, std::vector<double>(48, 1)}, RecoveryOptions{});
  const std::string svg = plan_svg(p, GpuChart{}, "x", 0);
  EXPECT_EQ(count(svg, "<rect x=\""), 48u);
  EXPECT_NE(svg.find("width=\"9.8\" height=\"9.8\""), std::string::npos);  // cell 520 / 48 = 10.83, minus 1
  EXPECT_EQ(svg.find(">47</text>"), std::string::npos);
}

}  // namespace svg_test
