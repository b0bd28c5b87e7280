// Plain SVG output, no dependencies.
#include "placement/svg.h"

#include <algorithm>
#include <cstdio>
#include <map>
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

GpuChart plan_gpu_chart(const Plan& plan) {
  GpuChart g;
  g.node_ids = plan.node_ids;
  if (static_cast<int>(g.node_ids.size()) != plan.cluster.nodes) {
    g.node_ids.resize(plan.cluster.nodes);
    for (int n = 0; n < plan.cluster.nodes; ++n) g.node_ids[n] = n;
  }
  g.gpus_per_node = plan.cluster.gpus_per_node;
  g.loads.assign(plan.cluster.gpus(), 0.0);
  for (const auto& m : plan.layer_metrics)
    for (int i = 0; i < plan.cluster.gpus() && i < static_cast<int>(m.gpu_loads.size()); ++i)
      g.loads[i] += m.gpu_loads[i];
  return g;
}

std::string plan_svg(const Plan& plan, const GpuChart& before, const std::string& before_label, int layer) {
  const Cluster& c = plan.cluster;
  const GpuChart after = plan_gpu_chart(plan);
  const bool has_before = !before.loads.empty();

  // Columns: physical nodes, those of `before` first, then nodes only the new plan has.
  struct Column {
    int id, before_index = -1, after_index = -1, gpus = 0;
  };
  std::vector<Column> cols;
  std::map<int, size_t> col_of;
  if (has_before)
    for (size_t i = 0; i < before.node_ids.size(); ++i) {
      col_of[before.node_ids[i]] = cols.size();
      cols.push_back({before.node_ids[i], static_cast<int>(i), -1, before.gpus_per_node});
    }
  for (size_t i = 0; i < after.node_ids.size(); ++i) {
    auto it = col_of.find(after.node_ids[i]);
    if (it == col_of.end()) {
      col_of[after.node_ids[i]] = cols.size();
      cols.push_back({after.node_ids[i], -1, static_cast<int>(i), after.gpus_per_node});
    } else {
      cols[it->second].after_index = static_cast<int>(i);
      cols[it->second].gpus = std::max(cols[it->second].gpus, after.gpus_per_node);
    }
  }
  int positions = 0;
  for (const auto& col : cols) positions += col.gpus;
  positions = std::max(positions, 1);
  double mx = 1e-12;
  for (double v : after.loads) mx = std::max(mx, v);
  for (double v : before.loads) mx = std::max(mx, v);

  const double width = std::max(640.0, std::min(4000.0, 60.0 + positions * 6.0));
  const double chart_h = 220, bar_w = (width - 80) / positions;
  const int slot_cols = c.slots_per_node();
  const double cell = std::clamp((width - 120) / slot_cols, 4.0, 28.0);
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
    << "</tspan>  <tspan fill=\"#1f77b4\">&#9632; after</tspan>  (bars grouped by physical node id)</text>\n";
  const double base = 60 + chart_h;
  const bool label_nodes = cols.size() <= 64;
  auto bar = [&](const char* cls, const char* fill, double x, double w, double v, int id, int g) {
    double h = v / mx * chart_h;
    s << "<rect class=\"" << cls << "\" x=\"" << fmt(x) << "\" y=\"" << fmt(base - h) << "\" width=\""
      << fmt(std::max(0.5, w)) << "\" height=\"" << fmt(h) << "\" fill=\"" << fill << "\"><title>" << cls << ": node "
      << id << " GPU " << g << ": " << v << "</title></rect>\n";
  };
  int pos = 0;
  for (const auto& col : cols) {
    const double x0 = 60 + pos * bar_w;
    for (int g = 0; g < col.gpus; ++g) {
      double x = 60 + (pos + g) * bar_w;
      if (col.before_index >= 0 && g < before.gpus_per_node) {
        size_t i = static_cast<size_t>(col.before_index) * before.gpus_per_node + g;
        if (i < before.loads.size()) bar("before", "#999", x, bar_w * 0.45, before.loads[i], col.id, g);
      }
      if (col.after_index >= 0 && g < after.gpus_per_node) {
        double off = has_before ? bar_w * 0.45 : 0;
        bar("after", "#1f77b4", x + off, bar_w * (has_before ? 0.45 : 0.9),
            after.loads[static_cast<size_t>(col.after_index) * after.gpus_per_node + g], col.id, g);
      }
    }
    const char* mark = !has_before ? nullptr : col.after_index < 0 ? "failed" : col.before_index < 0 ? "new" : nullptr;
    if (mark)
      s << "<text class=\"" << mark << "\" x=\"" << fmt(x0) << "\" y=\"" << fmt(base - 4)
        << "\" font-size=\"10\" fill=\"" << (col.after_index < 0 ? "#d62728" : "#2ca02c") << "\">" << mark
        << "</text>\n";
    if (pos > 0)
      s << "<line x1=\"" << fmt(x0 - bar_w * 0.05) << "\" y1=\"" << fmt(60) << "\" x2=\"" << fmt(x0 - bar_w * 0.05)
        << "\" y2=\"" << fmt(base) << "\" stroke=\"#eee\"/>\n";
    if (label_nodes)
      s << "<text x=\"" << fmt(x0) << "\" y=\"" << fmt(base + 12) << "\" font-size=\"9\">n" << col.id << "</text>\n";
    pos += col.gpus;
  }
  s << "<line x1=\"58\" y1=\"" << fmt(base) << "\" x2=\"" << fmt(width - 10) << "\" y2=\"" << fmt(base)
    << "\" stroke=\"black\"/>\n";
  s << "<text x=\"10\" y=\"" << fmt(base + 28) << "\">" << cols.size() << " nodes, " << positions << " GPU places (max "
    << mx << " tokens)</text>\n";

  s << "<text x=\"10\" y=\"" << fmt(map_top) << "\" font-size=\"14\">Replica map, layer " << layer
    << " (rows: nodes, columns: GPU x slot; colour and label: expert)</text>\n";
  const auto& p2l = plan.layers[layer].phy2log;
  const int E = std::max(1, plan.experts);
  for (int n = 0; n < c.nodes; ++n) {
    double y = map_top + 20 + n * cell;
    int id = n < static_cast<int>(plan.node_ids.size()) ? plan.node_ids[n] : n;
    s << "<text x=\"10\" y=\"" << fmt(y + cell * 0.75) << "\" font-size=\"" << fmt(std::min(12.0, cell)) << "\">n" << id
      << "</text>\n";
    for (int j = 0; j < slot_cols; ++j) {
      int e = p2l[n * slot_cols + j];
      double x = 60 + j * cell;
      int hue = static_cast<int>(360.0 * e / E);
      s << "<rect x=\"" << fmt(x) << "\" y=\"" << fmt(y) << "\" width=\"" << fmt(cell - 1) << "\" height=\""
        << fmt(cell - 1) << "\" fill=\"hsl(" << hue << ",65%,70%)\"><title>node " << id << " GPU "
        << j / c.slots_per_gpu << " slot " << j % c.slots_per_gpu << ": expert " << e << "</title></rect>\n";
      if (cell >= 14)
        s << "<text x=\"" << fmt(x + 2) << "\" y=\"" << fmt(y + cell * 0.7) << "\" font-size=\"" << fmt(cell * 0.45)
          << "\">" << e << "</text>\n";
    }
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace ucpkit::placement
