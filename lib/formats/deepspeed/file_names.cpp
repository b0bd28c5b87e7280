// DeepSpeed checkpoint discovery.
#include "formats/deepspeed/file_names.h"

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>

#include "formats/looked_for.h"
#include "core/error.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/deepspeed/version_line.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::deepspeed {

std::optional<FileName> parse_file_name(std::string_view name_view) {
  static const std::regex model(R"(mp_rank_(\d+)_model_states\.pt)");
  static const std::regex zero3_model(R"((bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt)");
  static const std::regex optim(R"((bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt)");
  static const std::regex layer(R"(layer_(\d+)(-model_(\d+))?-model_states\.pt)");
  static const std::regex expert(R"(layer_(\d+)_expert_(\d+)_mp_rank_(\d+)_model_states\.pt)");
  static const std::regex expp(R"(expp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt)");
  const std::string name(name_view);
  std::smatch m;
  auto num = [&](int i) { return std::stoi(m[i].str()); };
  FileName f{};
  if (std::regex_match(name, m, model)) {
    f.kind = FileKind::ModelStates;
    f.mp = num(1);
  } else if (std::regex_match(name, m, zero3_model)) {
    f.kind = FileKind::Zero3ModelStates;
    f.bf16 = m[1].matched;
    f.dp = num(2);
    f.mp = num(3);
  } else if (std::regex_match(name, m, optim)) {
    f.kind = FileKind::OptimStates;
    f.bf16 = m[1].matched;
    f.dp = num(2);
    f.mp = num(3);
  } else if (std::regex_match(name, m, expert)) {
    f.kind = FileKind::ExpertStates;
    f.moe_layer = num(1);
    f.expert = num(2);
    f.mp = num(3);
  } else if (std::regex_match(name, m, layer)) {
    f.kind = FileKind::LayerStates;
    f.layer = num(1);
    f.tp = m[3].matched ? num(3) : -1;
  } else if (std::regex_match(name, m, expp)) {
    f.kind = FileKind::ExpertOptim;
    f.ep_rank = num(1);
    f.mp = num(2);
  } else {
    return std::nullopt;
  }
  return f;
}

namespace {
std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

template <typename T>
int count_dense(const std::set<T>& s) { return s.empty() ? 0 : static_cast<int>(*s.rbegin()) + 1; }
}  // namespace

namespace {
std::string two(int v) {
  char b[16];
  std::snprintf(b, sizeof b, "%02d", v);
  return std::string(b);
}

}  // namespace

std::string model_states_name(int mp) { return "mp_rank_" + two(mp) + "_model_states.pt"; }
std::string zero3_model_states_name(int dp, int mp) {
  return "zero_pp_rank_" + std::to_string(dp) + "_mp_rank_" + two(mp) + "_model_states.pt";
}
std::string optim_states_name(int dp, int mp, bool bf16) {
  return std::string(bf16 ? "bf16_" : "") + "zero_pp_rank_" + std::to_string(dp) + "_mp_rank_" + two(mp) +
         "_optim_states.pt";
}
std::string layer_states_name(int layer, int tp, bool model_axis) {
  return "layer_" + two(layer) + (model_axis ? "-model_" + two(tp) : std::string()) + "-model_states.pt";
}
std::string expert_states_name(int moe_layer, int expert, int mp) {
  return "layer_" + std::to_string(moe_layer) + "_expert_" + std::to_string(expert) + "_mp_rank_" + two(mp) +
         "_model_states.pt";
}
std::string expert_optim_name(int ep_rank, int mp) {
  return "expp_rank_" + std::to_string(ep_rank) + "_mp_rank_" + two(mp) + "_optim_states.pt";
}

std::vector<std::string> expected_expert_optim_files(int ep, int mp, const VersionLine* line) {
  std::vector<std::string> out;
  if (line && line->expp_files)
    for (int r = 0; r < ep; ++r) out.push_back(expert_optim_name(r, mp));
  return out;
}

std::vector<std::string> expected_model_files(const TargetFiles& t, int mp, const VersionLine* line) {
  std::vector<std::string> out;
  // ZeRO-3 targets have no model job: the model states are in every DP rank's zero_pp_rank file,
  // there are no layer files (PP = 1) and no expert files (AutoEP, engine.py v0.19.5:5025-5027).
  if (t.zero3) return out;
  out.push_back(model_states_name(mp));
  const auto& r = t.mp_ranks.at(static_cast<size_t>(mp));
  for (int layer : r.layers) out.push_back(layer_states_name(layer, mp % t.tp, t.layer_model_axis));
  for (const auto& [moe_layer, expert] : r.experts) out.push_back(expert_states_name(moe_layer, expert, mp));
  if (t.native_moe)
    for (auto& f : expected_expert_optim_files(t.ep, mp, line)) out.push_back(std::move(f));
  return out;
}

std::vector<std::string> expected_rank_files(const TargetFiles& t, int dp, int mp) {
  std::vector<std::string> out;
  if (t.zero3) out.push_back(zero3_model_states_name(dp, mp));
  out.push_back(optim_states_name(dp, mp, t.bf16));
  return out;
}

std::vector<std::string> expected_files(const TargetFiles& t, const VersionLine* line) {
  std::vector<std::string> out;
  for (size_t mp = 0; mp < t.mp_ranks.size(); ++mp) {
    for (auto& f : expected_model_files(t, static_cast<int>(mp), line)) out.push_back(std::move(f));
    for (int d = 0; d < t.dp; ++d)
      for (auto& f : expected_rank_files(t, d, static_cast<int>(mp))) out.push_back(std::move(f));
  }
  return out;
}

namespace {

// The shard files of a checkpoint folder, by kind and ranks.
struct FoundFiles {
  std::map<int, std::string> model;
  std::map<std::pair<int, int>, std::string> optim, zero3_model;  // (mp, dp)
  std::map<std::pair<int, int>, std::string> layers;              // (layer, tp)
  std::map<std::pair<int, int>, std::string> expp;                // (ep_rank, mp)
  std::set<int> layer_tps;
  bool layer_with_axis = false, layer_without_axis = false;  // -model_TT- in the name or not
  bool bf16_seen = false, plain_seen = false;
};

FoundFiles classify_files(const std::vector<std::string>& names, DeepSpeedLayout& L) {
  const std::string& dir = L.dir;
  FoundFiles F;
  for (const auto& n : names) {
    auto f = parse_file_name(n);
    if (!f) {
      L.ignored.push_back(n);
      continue;
    }
    auto dup = [&](bool inserted) {
      if (!inserted) throw Error(join(dir, n) + ": duplicate shard");
    };
    switch (f->kind) {
      case FileKind::ModelStates: dup(F.model.emplace(f->mp, n).second); break;
      case FileKind::Zero3ModelStates: dup(F.zero3_model.emplace(std::pair{f->mp, f->dp}, n).second); break;
      case FileKind::OptimStates:
        (f->bf16 ? F.bf16_seen : F.plain_seen) = true;
        dup(F.optim.emplace(std::pair{f->mp, f->dp}, n).second);
        break;
      case FileKind::LayerStates:
        dup(F.layers.emplace(std::pair{f->layer, std::max(f->tp, 0)}, n).second);
        F.layer_tps.insert(std::max(f->tp, 0));
        (f->tp < 0 ? F.layer_without_axis : F.layer_with_axis) = true;
        break;
      case FileKind::ExpertStates: L.expert_files.push_back({f->moe_layer, f->expert, f->mp, join(dir, n)}); break;
      case FileKind::ExpertOptim: dup(F.expp.emplace(std::pair{f->ep_rank, f->mp}, n).second); break;
    }
  }
  return F;
}

// World sizes from the ranks found: returns the number of model-parallel ranks.
int set_world_sizes(DeepSpeedLayout& L, const FoundFiles& F) {
  std::set<int> mps, dps;
  for (const auto& [k, v] : F.optim) {
    mps.insert(k.first);
    dps.insert(k.second);
  }
  int mp_count = count_dense(mps);
  L.dp = count_dense(dps);
  if (!F.zero3_model.empty()) {
    L.zero3 = true;
  } else {
    for (const auto& [k, v] : F.model) mps.insert(k);
    mp_count = count_dense(mps);
  }
  L.pipeline = !F.layers.empty();
  if (L.pipeline) {
    if (F.layer_with_axis && F.layer_without_axis)
      throw Error(L.dir + ": layer files named both with and without a -model_NN part (one save writes one form)");
    L.layer_model_axis = !F.layer_without_axis;
    L.tp = count_dense(F.layer_tps);
    if (mp_count % L.tp)
      throw Error(L.dir + ": " + std::to_string(mp_count) + " model-parallel ranks do not divide by tp=" +
                  std::to_string(L.tp) + " (from the layer files)");
    L.pp = mp_count / L.tp;
  } else {
    L.tp = mp_count;
    L.pp = 1;
  }
  return mp_count;
}

// A missing rank: say which ranks are there, so that a stray file of a bigger run (ranks 0, 1, 3)
// reads as what it is, not only as a lost shard.
[[noreturn]] void missing(const std::string& dir, const std::string& what, const std::string& kind = {},
                          const std::set<int>& found = {}) {
  std::string msg = join(dir, what) + ": missing shard";
  if (!kind.empty()) {
    msg += " (found " + kind + " ranks";
    int shown = 0;
    for (int r : found) {
      if (++shown > 8) {
        msg += " ...";
        break;
      }
      msg += (shown == 1 ? " " : ", ") + std::to_string(r);
    }
    msg += found.size() > 0 && *found.rbegin() + 1 > static_cast<int>(found.size())
               ? "; a stray file of another run, or this one lost?)"
               : ")";
  }
  throw Error(msg);
}

std::set<int> dp_ranks_of(const std::map<std::pair<int, int>, std::string>& m, int mp) {
  std::set<int> out;
  for (const auto& [k, v] : m)
    if (k.first == mp) out.insert(k.second);
  return out;
}

// Model and optimizer files of every model-parallel rank (and DP rank), each one required.
void assign_rank_files(DeepSpeedLayout& L, const FoundFiles& F, int mp_count) {
  const std::string& dir = L.dir;
  L.model_files.resize(mp_count);
  L.optim_files.assign(mp_count, std::vector<std::string>(L.dp));
  for (int mp = 0; mp < mp_count; ++mp) {
    if (!L.zero3) {
      auto it = F.model.find(mp);
      if (it == F.model.end()) {
        std::set<int> found;
        for (const auto& [k, v] : F.model) found.insert(k);
        missing(dir, model_states_name(mp), "model-parallel", found);
      }
      L.model_files[mp] = join(dir, it->second);
    } else {
      L.zero3_model_files.resize(mp_count);
      for (int d = 0; d < L.dp; ++d) {
        auto it = F.zero3_model.find({mp, d});
        if (it == F.zero3_model.end())
          missing(dir, zero3_model_states_name(d, mp), "DP",
                  dp_ranks_of(F.zero3_model, mp));
        L.zero3_model_files[mp].push_back(join(dir, it->second));
      }
      L.model_files[mp] = L.zero3_model_files[mp][0];
    }
    for (int d = 0; d < L.dp; ++d) {
      auto it = F.optim.find({mp, d});
      if (it == F.optim.end())
        missing(dir, optim_states_name(d, mp, L.bf16_prefix), "DP",
                dp_ranks_of(F.optim, mp));
      L.optim_files[mp][d] = join(dir, it->second);
    }
  }
}

// Pipeline layer files (every TP rank of every layer) and native-MoE expert files.
void assign_layer_and_expert_files(DeepSpeedLayout& L, const FoundFiles& F) {
  const std::string& dir = L.dir;
  for (const auto& [k, v] : F.layers) {
    auto& row = L.layer_files[k.first];
    row.resize(L.tp);
    row[k.second] = join(dir, v);
  }
  for (const auto& [layer, row] : L.layer_files)
    for (int t = 0; t < L.tp; ++t)
      if (row[t].empty()) missing(dir, layer_states_name(layer, t));
  std::sort(L.expert_files.begin(), L.expert_files.end(), [](const ExpertFile& a, const ExpertFile& b) {
    return std::tie(a.moe_layer, a.expert, a.mp) < std::tie(b.moe_layer, b.expert, b.mp);
  });
  if (!F.expp.empty()) {
    // One expp_rank_R_mp_rank_TT file per EP rank and model-parallel rank; the plan reads mp 0's
    // (native MoE is planned for tp = pp = 1 only, and refused otherwise).
    std::set<int> eps;
    for (const auto& [k, n] : F.expp) eps.insert(k.first);
    L.ep = count_dense(eps);
    for (int r = 0; r < L.ep; ++r) {
      auto it = F.expp.find({r, 0});
      if (it == F.expp.end()) missing(dir, expert_optim_name(r, 0));
      L.expert_optim_files.push_back(join(dir, it->second));
    }
  }
}

}  // namespace

DeepSpeedLayout infer_layout(const std::vector<std::string>& names, const std::string& dir) {
  DeepSpeedLayout L;
  L.dir = dir;
  L.tag = tag_of_dir(dir);
  const FoundFiles F = classify_files(names, L);
  if (F.bf16_seen && F.plain_seen) throw Error(dir + ": both bf16_ and plain ZeRO optimizer shards are present");
  L.bf16_prefix = F.bf16_seen;
  if (F.optim.empty() && F.model.empty() && F.layers.empty() && F.zero3_model.empty())
    throw Error(formats::not_a_checkpoint(dir));
  if (F.optim.empty()) throw Error(dir + ": no ZeRO optimizer shards (*_optim_states.pt) found");
  const int mp_count = set_world_sizes(L, F);
  assign_rank_files(L, F, mp_count);
  assign_layer_and_expert_files(L, F);
  return L;
}

DeepSpeedLayout discover(const std::string& path) {
  const std::string dir = resolve_checkpoint_dir(path);
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code e2;
    if (e.is_regular_file(e2)) {
      names.push_back(name);
    } else if (parse_file_name(name)) {  // a shard's name on a folder (or a device, a dangling link)
      throw Error(e.path().string() + ": is " + (e.is_directory(e2) ? "a folder" : "not a regular file") +
                  ", not a shard file");
    }
  }
  if (ec) throw Error(dir + ": cannot list: " + ec.message());
  std::sort(names.begin(), names.end());
  return infer_layout(names, dir);
}

}  // namespace ucpkit::formats::deepspeed
