// Plain SVG output, no dependencies.
#include "placement/svg.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace ucpkit::placement {
namespace {

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

}  // namespace

std::string plan_svg(const Plan& plan, const std::vector<double>& before, const std::string& before_label, int layer) {
  const Cluster& c = plan.cluster;
  const int D = c.gpus();
  std::vector<double> after(D, 0.0);
  for (const auto& m : plan.layer_metrics)
    for (int g = 0; g < D && g < static_cast<int>(m.gpu_loads.size()); ++g) after[g] += m.gpu_loads[g];
  double mx = 1e-12;
  for (double v : after) mx = std::max(mx, v);
  for (double v : before) mx = std::max(mx, v);

  const double width = std::max(640.0, std::min(4000.0, 60.0 + D * 6.0));
  const double chart_h = 220, bar_w = (width - 80) / D;
  const int cols = c.slots_per_node();
  const double cell = std::clamp((width - 120) / cols, 4.0, 28.0);
  const double map_top = 60 + chart_h + 60;
  const double height = map_top + 30 + c.nodes * cell + 20;
  layer = std::clamp(layer, 0, static_cast<int>(plan.layers.size()) - 1);

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << fmt(width) << "\" height=\"" << fmt(height)
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"10\" y=\"20\" font-size=\"14\">" << escape(plan.algorithm) << ": " << escape(c.describe())
    << ", GPU load summed over " << plan.layers.size() << " layers; balancedness " << plan.metrics.balancedness
    << "</text>\n";
  s << "<text x=\"10\" y=\"38\"><tspan fill=\"#999\">&#9632; " << escape(before_label)
    << "</tspan>  <tspan fill=\"#1f77b4\">&#9632; after</tspan></text>\n";
  const double base = 60 + chart_h;
  for (int g = 0; g < D; ++g) {
    double x = 60 + g * bar_w;
    if (!before.empty() && g < static_cast<int>(before.size())) {
      double h = before[g] / mx * chart_h;
      s << "<rect x=\"" << fmt(x) << "\" y=\"" << fmt(base - h) << "\" width=\"" << fmt(std::max(0.5, bar_w * 0.45))
        << "\" height=\"" << fmt(h) << "\" fill=\"#999\"/>\n";
    }
    double h = after[g] / mx * chart_h;
    double off = before.empty() ? 0 : bar_w * 0.45;
    s << "<rect x=\"" << fmt(x + off) << "\" y=\"" << fmt(base - h) << "\" width=\""
      << fmt(std::max(0.5, bar_w * (before.empty() ? 0.9 : 0.45))) << "\" height=\"" << fmt(h)
      << "\" fill=\"#1f77b4\"><title>GPU " << g << ": " << after[g] << "</title></rect>\n";
  }
  s << "<line x1=\"58\" y1=\"" << fmt(base) << "\" x2=\"" << fmt(width - 10) << "\" y2=\"" << fmt(base)
    << "\" stroke=\"black\"/>\n";
  s << "<text x=\"10\" y=\"" << fmt(base + 20) << "\">GPU 0.." << D - 1 << " (max " << mx << " tokens)</text>\n";

  s << "<text x=\"10\" y=\"" << fmt(map_top) << "\" font-size=\"14\">Replica map, layer " << layer
    << " (rows: nodes, columns: GPU x slot; colour and label: expert)</text>\n";
  const auto& p2l = plan.layers[layer].phy2log;
  const int E = std::max(1, plan.experts);
  for (int n = 0; n < c.nodes; ++n) {
    double y = map_top + 20 + n * cell;
    int id = n < static_cast<int>(plan.node_ids.size()) ? plan.node_ids[n] : n;
    s << "<text x=\"10\" y=\"" << fmt(y + cell * 0.75) << "\" font-size=\"" << fmt(std::min(12.0, cell)) << "\">n" << id
      << "</text>\n";
    for (int j = 0; j < cols; ++j) {
      int e = p2l[n * cols + j];
      double x = 60 + j * cell;
      int hue = static_cast<int>(360.0 * e / E);
      s << "<rect x=\"" << fmt(x) << "\" y=\"" << fmt(y) << "\" width=\"" << fmt(cell - 1) << "\" height=\"" << fmt(cell - 1)
        << "\" fill=\"hsl(" << hue << ",65%,70%)\"><title>node " << id << " GPU " << j / c.slots_per_gpu << " slot "
        << j % c.slots_per_gpu << ": expert " << e << "</title></rect>\n";
      if (cell >= 14)
        s << "<text x=\"" << fmt(x + 2) << "\" y=\"" << fmt(y + cell * 0.7) << "\" font-size=\"" << fmt(cell * 0.45)
          << "\">" << e << "</text>\n";
    }
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace ucpkit::placement
