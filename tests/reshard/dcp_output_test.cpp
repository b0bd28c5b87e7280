// ucp-load --format dcp through the tool, run from another working folder with relative paths, on the
// GPT load fixture (dsgen source, its ground truth recorded by the generator):
//  * our DCP reader reads back every model tensor and every optimizer state equal, bit for bit, to the
//    generator's universal truth (fp32 master, exp_avg, exp_avg_sq), whole and FSDP2 rows (--world-size 2);
//  * the round trip: ucp-union --input <our DCP> gives back the universal folder's state files bit for
//    bit, the steps and param_groups (keys other than "params") equal, "params" the group's fqns;
//  * direct mode (the DeepSpeed source read directly) writes the same checkpoint;
//  * --dtype bf16: model tensors bf16 (torch's rounding of the truth), optimizer states fp32;
//  * --plan lists the files and items written; the plan's keys, order, dtypes and planner_data paths
//    (a tensor step as a 0-d tensor item, an int step as a bytes item) without I/O;
//  * an existing output without --overwrite, or an output that cannot be created: exit 1, one line,
//    nothing written or left behind.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "formats/dcp/reader.h"
#include "reshard/dcp_output.h"
#include "reshard/target_defaults.h"
#include "formats/universal/manifest.h"
#include "formats/universal/state_file.h"
#include "io/torch/torch_file.h"
#include "reshard/universal_fixture.h"
#include "reshard/universal_reader.h"
#include "support/paths.h"
#include "support/process.h"

namespace dcp_output_test {

namespace fs = std::filesystem;
using namespace ucpkit;

namespace {

// <scratch>/work (the tools' working folder) and <scratch>/u, a copy of the unioned GPT fixture.
struct Case {
  std::string root, work;
};

Case case_of(const std::string& name) {
  const auto& g = loadtest::gpt_case();
  Case c;
  c.root = ucpkit::testing::scratch_dir("dcp_output_" + name);
  c.work = c.root + "/work";
  fs::create_directories(c.work);
  fs::copy(g.universal, c.root + "/u", fs::copy_options::recursive);
  return c;
}

ucpkit::testing::SplitResult run_in(const Case& c, const std::string& tool, const std::string& args) {
  return ucpkit::testing::run_split_in(c.work, kBin + "/" + tool + " " + args, c.root);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const auto x = a.contiguous().contiguous_bytes(), y = b.contiguous().contiguous_bytes();
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size()) == 0);
}

Tensor state_tensor(const std::string& path) { return formats::universal::read_state_file(load_torch(path), path).param; }

// The generator's truth of `state` of parameter `name` (fp32).
Tensor truth_of(const std::string& name, const std::string& state) {
  return state_tensor((loadtest::gpt_case().truth / "universal" / "zero" / name / (state + ".pt")).string());
}

Tensor to_bf16(const Tensor& f32) {
  const Tensor c = f32.contiguous();
  const auto b = c.contiguous_bytes();
  std::vector<uint8_t> out(b.size() / 2);
  reshard::convert_from_fp32(reinterpret_cast<const float*>(b.data()), b.size() / 4, DType::BFloat16, out.data());
  return Tensor::from_bytes(DType::BFloat16, c.shape(), std::move(out));
}

// Every model tensor and optimizer state of the DCP folder `dir` equal to the truth (model tensors in
// `dtype`); returns the number of tensors compared.
size_t expect_reads_back_truth(const std::string& dir, DType dtype) {
  const formats::dcp::Reader r(dir);
  const auto manifest = formats::universal::read_universal_manifest((loadtest::gpt_case().universal / "manifest.json").string());
  size_t n = 0;
  for (const auto& p : manifest.params) {
    SCOPED_TRACE(p.name);
    const Tensor fp32 = truth_of(p.name, "fp32");
    const Tensor model = r.read_tensor("model." + p.name);
    EXPECT_TRUE(same_bits(model, dtype == DType::Float32 ? fp32 : to_bf16(fp32))) << "model tensor";
    ++n;
    for (const char* s : {"exp_avg", "exp_avg_sq"}) {
      EXPECT_TRUE(same_bits(r.read_tensor("optim.state." + p.name + "." + s), truth_of(p.name, s))) << s;
      ++n;
    }
    const auto step = load_torch((loadtest::gpt_case().truth / "universal" / "zero" / p.name / "step.pt").string());
    if (step->is(pickle::Kind::Tensor)) EXPECT_TRUE(same_bits(r.read_tensor("optim.state." + p.name + ".step"), step->as_tensor()));
    else EXPECT_EQ(r.read_object("optim.state." + p.name + ".step")->repr(), step->repr());
  }
  EXPECT_EQ(n, 3 * manifest.params.size());
  return n;
}

// ucp-union of our DCP (`out`) against the universal folder it was written from (`u`): every state
// file bit for bit, the steps, and param_groups.
void expect_round_trip(const std::string& u, const std::string& back) {
  const auto a = formats::universal::read_universal_manifest(u + "/manifest.json");
  const auto b = formats::universal::read_universal_manifest(back + "/manifest.json");
  ASSERT_EQ(a.params.size(), b.params.size());
  std::map<std::string, const formats::universal::UniversalParam*> by_name;
  for (const auto& p : b.params) by_name[p.name] = &p;
  for (const auto& p : a.params) {
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(by_name.count(p.name));
    const auto& q = *by_name[p.name];
    EXPECT_EQ(p.shape, q.shape);
    ASSERT_EQ(p.states.size(), q.states.size());
    for (const auto& [state, f] : p.states) {
      ASSERT_TRUE(q.states.count(state)) << state;
      EXPECT_TRUE(same_bits(state_tensor(u + "/" + f.file), state_tensor(back + "/" + q.states.at(state).file))) << state;
      EXPECT_EQ(f.crc32, q.states.at(state).crc32) << state;
    }
    EXPECT_EQ(p.step, q.step);
    if (p.step) {
      const auto s1 = load_torch(u + "/zero/" + p.name + "/step.pt"), s2 = load_torch(back + "/zero/" + p.name + "/step.pt");
      if (s1->is(pickle::Kind::Tensor)) EXPECT_TRUE(s2->is(pickle::Kind::Tensor) && same_bits(s1->as_tensor(), s2->as_tensor()));
      else EXPECT_EQ(s1->repr(), s2->repr());
    }
  }
  const auto g1 = load_torch(u + "/zero/optimizer_state.pt")->at("param_groups");
  const auto g2 = load_torch(back + "/zero/optimizer_state.pt")->at("param_groups");
  ASSERT_EQ(g1->items.size(), g2->items.size());
  for (size_t g = 0; g < g1->items.size(); ++g) {
    for (const auto& [k, v] : g1->items[g]->entries) {
      if (k->s == "params") continue;
      ASSERT_TRUE(g2->items[g]->contains(k->s)) << "group " << g << " " << k->s;
      EXPECT_EQ(v->repr(), g2->items[g]->at(k->s)->repr()) << "group " << g << " " << k->s;
    }
    std::set<std::string> names;
    for (const auto& n : g2->items[g]->at("params")->items) names.insert(n->as_str());
    EXPECT_FALSE(names.empty()) << "group " << g;
    for (const auto& n : names) EXPECT_TRUE(by_name.count(n)) << n;
  }
}

// ucp-union of <work>/out into <work>/back, checked against the universal folder <root>/u.
void union_round_trip(const Case& c) {
  const auto u = run_in(c, "ucp-union", "--input out --output back");
  ASSERT_EQ(u.rc, 0) << u.err;
  expect_round_trip(c.root + "/u", c.work + "/back");
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

}  // namespace

TEST(DcpOutput, Fp32ReadsBackTheTruthAndRoundTripsThroughUnion) {
  const Case c = case_of("fp32");
  const auto r = run_in(c, "ucp-load", "--input ../u --output out --format dcp --dtype fp32 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.value("format", ""), "dcp");
  EXPECT_EQ(j.value("files_written", 0), 2);
  EXPECT_EQ(j["target"].value("dtype", ""), "fp32");
  EXPECT_EQ(j["target"].value("optimizer_dtype", ""), "fp32");
  EXPECT_EQ(names_in(c.work + "/out"), (std::set<std::string>{".metadata", "__0_0.distcp"}));
  EXPECT_GT(expect_reads_back_truth(c.work + "/out", DType::Float32), 0u);
  union_round_trip(c);
}

TEST(DcpOutput, RowsOverTwoRanksReadBackTheTruth) {
  const Case c = case_of("rows");
  const auto r = run_in(c, "ucp-load", "--input ../u --output out --format dcp --dtype fp32 --world-size 2 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["target"].value("mesh", ""), "rows");
  EXPECT_EQ(names_in(c.work + "/out"), (std::set<std::string>{".metadata", "__0_0.distcp", "__1_0.distcp"}));
  const formats::dcp::Reader rd(c.work + "/out");
  size_t split = 0;
  for (const auto& e : rd.metadata().entries) split += !e.is_bytes && e.chunks.size() == 2;
  EXPECT_GT(split, 0u) << "no tensor cut into two rows";
  expect_reads_back_truth(c.work + "/out", DType::Float32);
  union_round_trip(c);
}

TEST(DcpOutput, Bf16ModelTensorsFp32OptimizerStates) {
  const Case c = case_of("bf16");
  const auto r = run_in(c, "ucp-load", "--input ../u --output out --format dcp --dtype bf16");
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_reads_back_truth(c.work + "/out", DType::BFloat16);
}

TEST(DcpOutput, DirectModeWritesTheSameCheckpoint) {
  const Case c = case_of("direct");
  fs::copy(loadtest::gpt_case().src, c.root + "/src", fs::copy_options::recursive);
  const auto r = run_in(c, "ucp-load", "--input ../src --output out --format dcp --dtype fp32");
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_reads_back_truth(c.work + "/out", DType::Float32);
  union_round_trip(c);
}

TEST(DcpOutput, PlanListsTheFilesAndItemsWritten) {
  const Case c = case_of("plan");
  const auto p = run_in(c, "ucp-load", "--input ../u --output out --format dcp --world-size 2 --plan");
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_FALSE(fs::exists(c.work + "/out"));
  const auto j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j.value("format", ""), "dcp");
  const auto r = run_in(c, "ucp-load", "--input ../u --output out --format dcp --world-size 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::set<std::string> planned;
  for (const auto& f : j["files"]) planned.insert(f.value("file", ""));
  EXPECT_EQ(planned, names_in(c.work + "/out"));
  const formats::dcp::Reader rd(c.work + "/out");
  EXPECT_EQ(j.value("items", size_t{0}), rd.metadata().items.size());
  EXPECT_EQ(j.value("entries", size_t{0}), rd.metadata().entries.size());
}

// --dry-run describes the DCP output (not a DeepSpeed layout of '?'s) with the counts the real run
// then writes, and writes nothing.
TEST(DcpOutput, DryRunDescribesTheDcpOutput) {
  const Case c = case_of("dry_run");
  const auto d = run_in(c, "ucp-load", "--input ../u --output out --format dcp --world-size 2 --dry-run --json");
  ASSERT_EQ(d.rc, 0) << d.err;
  EXPECT_FALSE(fs::exists(c.work + "/out"));
  const auto j = nlohmann::json::parse(d.out);
  EXPECT_EQ(j.value("format", ""), "dcp");
  EXPECT_EQ(j["target"].value("mesh", ""), "rows");
  EXPECT_EQ(j["target"].value("world", 0), 2);
  const auto t = run_in(c, "ucp-load", "--input ../u --output out --format dcp --world-size 2 --dry-run");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("a DCP checkpoint of " + std::to_string(j.value("entries", 0)) + " entries"), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("deepspeed layout"), std::string::npos) << t.out;
  ASSERT_EQ(run_in(c, "ucp-load", "--input ../u --output out --format dcp --world-size 2").rc, 0);
  EXPECT_EQ(static_cast<size_t>(j.value("entries", 0)), formats::dcp::Reader(c.work + "/out").metadata().entries.size());
}

TEST(DcpOutput, BadOutputsLeaveNothing) {
  const Case c = case_of("bad");
  fs::create_directories(c.work + "/out");
  std::ofstream(c.work + "/out/keep") << "x";
  auto r = run_in(c, "ucp-load", "--input ../u --output out --format dcp");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("out"), std::string::npos) << r.err;
  EXPECT_EQ(names_in(c.work + "/out"), (std::set<std::string>{"keep"}));
  EXPECT_EQ(names_in(c.work), (std::set<std::string>{"out"})) << "staging left behind";
  // The parent of the output is a file: nothing can be created.
  std::ofstream(c.work + "/afile") << "x";
  r = run_in(c, "ucp-load", "--input ../u --output afile/out --format dcp");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("afile"), std::string::npos) << r.err;
  EXPECT_EQ(names_in(c.work), (std::set<std::string>{"out", "afile"}));
  // --overwrite replaces a checkpoint, not a folder of other files (issue 45): that one is kept.
  r = run_in(c, "ucp-load", "--input ../u --output out --format dcp --overwrite");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("holds no checkpoint (1 entry: keep)"), std::string::npos) << r.err;
  EXPECT_EQ(names_in(c.work + "/out"), (std::set<std::string>{"keep"}));
  // An earlier DCP output there is replaced by the checkpoint.
  std::ofstream(c.work + "/out/.metadata") << "x";
  r = run_in(c, "ucp-load", "--input ../u --output out --format dcp --overwrite");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(names_in(c.work + "/out"), (std::set<std::string>{".metadata", "__0_0.distcp"}));
}

// ucp-load --input <a DCP checkpoint> (no DeepSpeed model files): re-chunked for another world size,
// also from the universal folder ucp-union makes of it. Into DCP it is rewritten whole since issue 47
// (every tensor in the dtype it has, nothing through a scratch universal folder; dcp_whole_rewrite_test).
TEST(DcpOutput, ADcpSourceIsRechunkedForAnotherWorldSize) {
  const Case c = case_of("from_dcp");
  ASSERT_EQ(run_in(c, "ucp-load", "--input ../u --output one --format dcp --dtype fp32").rc, 0);
  auto r = run_in(c, "ucp-load", "--input one --output two --format dcp --world-size 2 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.value("route", ""), "whole");
  EXPECT_EQ(j["target"].value("dtype", ""), "as stored");
  EXPECT_EQ(j["target"].value("world", 0), 2);
  EXPECT_EQ(names_in(c.work), (std::set<std::string>{"one", "two"})) << "scratch folder left behind";
  EXPECT_EQ(names_in(c.work + "/two"), (std::set<std::string>{".metadata", "__0_0.distcp", "__1_0.distcp"}));
  const formats::dcp::Reader rd(c.work + "/two");
  size_t split = 0;
  for (const auto& e : rd.metadata().entries) split += !e.is_bytes && e.chunks.size() == 2;
  EXPECT_GT(split, 0u) << "no tensor cut into two rows";
  expect_reads_back_truth(c.work + "/two", DType::Float32);
  // From the DCP-made universal folder, the same.
  ASSERT_EQ(run_in(c, "ucp-union", "--input one --output u1").rc, 0);
  r = run_in(c, "ucp-load", "--input u1 --output three --format dcp --world-size 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_reads_back_truth(c.work + "/three", DType::Float32);
  // And back through ucp-union: the first universal folder's state files bit for bit.
  ASSERT_EQ(run_in(c, "ucp-union", "--input three --output back").rc, 0);
  expect_round_trip(c.root + "/u", c.work + "/back");
}

// Safetensors from a DCP source holds the same bytes as from the universal folder it was made from.
TEST(DcpOutput, ADcpSourceToSafetensorsEqualsTheUniversalSources) {
  const Case c = case_of("dcp_safetensors");
  ASSERT_EQ(run_in(c, "ucp-load", "--input ../u --output one --format dcp --dtype fp32").rc, 0);
  auto a = run_in(c, "ucp-load", "--input ../u --output st_u --format safetensors --dtype bf16");
  ASSERT_EQ(a.rc, 0) << a.err;
  auto b = run_in(c, "ucp-load", "--input one --output st_dcp --format safetensors --dtype bf16");
  ASSERT_EQ(b.rc, 0) << b.err;
  const auto files = names_in(c.work + "/st_u");
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files, names_in(c.work + "/st_dcp"));
  for (const auto& f : files) {
    if (f.size() < 12 || f.substr(f.size() - 12) != ".safetensors") continue;
    std::ifstream x(c.work + "/st_u/" + f, std::ios::binary), y(c.work + "/st_dcp/" + f, std::ios::binary);
    const std::string bx((std::istreambuf_iterator<char>(x)), {}), by((std::istreambuf_iterator<char>(y)), {});
    EXPECT_TRUE(bx == by) << f << " differs";
  }
}

// --format deepspeed needs DeepSpeed model files: from a DCP checkpoint the input is named before any
// work, from a DCP-made universal folder its manifest; exit 1, nothing written or left.
TEST(DcpOutput, ADcpSourceToDeepSpeedIsRefusedByName) {
  const Case c = case_of("dcp_deepspeed");
  ASSERT_EQ(run_in(c, "ucp-load", "--input ../u --output one --format dcp --dtype fp32").rc, 0);
  auto r = run_in(c, "ucp-load", "--input one --output ds --format deepspeed --dp 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("one: a dcp checkpoint has no DeepSpeed model files"), std::string::npos) << r.err;
  EXPECT_EQ(names_in(c.work), (std::set<std::string>{"one"}));
  ASSERT_EQ(run_in(c, "ucp-union", "--input one --output u1").rc, 0);
  r = run_in(c, "ucp-load", "--input u1 --output ds --dp 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("u1/manifest.json: no DeepSpeed model files"), std::string::npos) << r.err;
  EXPECT_EQ(names_in(c.work), (std::set<std::string>{"one", "u1"}));
}

// The plan alone: torch's keys in state-dict order (model tensors, then per parameter its step and
// states, then param_groups with "params" last), dtypes (model in the target dtype, states fp32, a
// tensor step as its own 0-d tensor entry, an int step as bytes), and planner_data's nested paths
// (DefaultSavePlanner's: ("model", fqn), ("optim", "state", fqn, name), ("optim", "param_groups", i, key)).
TEST(DcpOutput, PlanKeysOrderAndNesting) {
  reshard::ModelInfo m;
  m.states = {"fp32", "exp_avg", "exp_avg_sq"};
  for (const char* n : {"a.weight", "b.bias"}) {
    reshard::ParamInfo p;
    p.name = n;
    p.shape = std::string(n) == "a.weight" ? std::vector<int64_t>{4, 2} : std::vector<int64_t>{3};
    p.step = true;
    p.group = std::string(n) == "a.weight" ? 0 : 1;
    m.params.push_back(p);
  }
  auto group = [](double lr) {
    auto g = pickle::Value::dict();
    g->set_item("lr", pickle::Value::real(lr));
    g->set_item("params", pickle::Value::list({pickle::Value::integer(0)}));
    g->set_item("eps", pickle::Value::real(1e-8));
    return g;
  };
  m.optimizer_state = pickle::Value::dict();
  m.optimizer_state->set_item("param_groups", pickle::Value::list({group(0.1), group(0.2)}));
  const auto out = reshard::plan_dcp_output(m, DType::BFloat16, formats::dcp::Target::whole(), [](int i) {
    return i == 0 ? pickle::Value::of_tensor(Tensor::from_vector<float>(DType::Float32, {}, {7.0f})) : pickle::Value::integer(7);
  });
  const std::vector<std::string> want = {
      "model.a.weight", "model.b.bias",
      "optim.state.a.weight.step", "optim.state.a.weight.exp_avg", "optim.state.a.weight.exp_avg_sq",
      "optim.state.b.bias.step", "optim.state.b.bias.exp_avg", "optim.state.b.bias.exp_avg_sq",
      "optim.param_groups.0.lr", "optim.param_groups.0.eps", "optim.param_groups.0.params",
      "optim.param_groups.1.lr", "optim.param_groups.1.eps", "optim.param_groups.1.params"};
  std::vector<std::string> got;
  for (const auto& e : out.plan.entries) got.push_back(e.fqn);
  ASSERT_EQ(got, want);
  const auto& e = out.plan.entries;
  EXPECT_EQ(e[0].dtype, DType::BFloat16);
  EXPECT_EQ(e[0].size, (std::vector<int64_t>{4, 2}));
  EXPECT_FALSE(e[2].is_bytes);  // tensor step
  EXPECT_EQ(e[2].dtype, DType::Float32);
  EXPECT_TRUE(e[2].size.empty());
  EXPECT_EQ(e[3].dtype, DType::Float32);
  EXPECT_TRUE(e[5].is_bytes);  // int step
  for (size_t k = 8; k < e.size(); ++k) EXPECT_TRUE(e[k].is_bytes) << e[k].fqn;
  EXPECT_EQ(out.planner->value()->at("model.a.weight")->repr(), "('model', 'a.weight')");
  EXPECT_EQ(out.planner->value()->at("optim.state.b.bias.exp_avg")->repr(), "('optim', 'state', 'b.bias', 'exp_avg')");
  EXPECT_EQ(out.planner->value()->at("optim.param_groups.1.params")->repr(), "('optim', 'param_groups', 1, 'params')");
  ASSERT_EQ(out.plan.files.size(), 1u);
  EXPECT_EQ(out.plan.files[0].items.size(), want.size());
}

// A DCP source's record through the universal form (issue 47), without I/O: the keys it was saved under
// (ModelInfo::dcp_keys: torchtitan's top-level model key, its optimizer.* state, a buffer saved beside
// the model), its bytes items verbatim under their own paths, its bf16 optimizer states written bf16.
TEST(DcpOutput, PlanKeepsTheSourcesKeysItemsAndStateDtypes) {
  reshard::ModelInfo m;
  m.states = {"fp32", "exp_avg"};
  reshard::ParamInfo p;
  p.name = "emb.weight";
  p.shape = {4, 2};
  p.source_dtypes["fp32"] = DType::BFloat16;
  p.source_dtypes["exp_avg"] = DType::BFloat16;
  m.params.push_back(p);
  m.buffers.push_back({"train_state.step", {}, "int32", {"zero/train_state.step/fp32.pt", 0u, std::nullopt}});
  m.dcp_keys = {{"model.emb.weight", {"emb.weight"}},
                {"optim.state.emb.weight.exp_avg", {"optimizer", "state.emb.weight.exp_avg"}},
                {"model.train_state.step", {"train_state", "step"}}};
  m.items.push_back({"lr_scheduler.last_epoch", {"lr_scheduler", "last_epoch"}, {"items/0.pt", 1u, std::nullopt}});
  m.items.push_back({"optimizer.param_groups.emb.weight.lr", {"optimizer", "param_groups.emb.weight.lr"}, {"items/1.pt", 2u, std::nullopt}});
  const auto out = reshard::plan_dcp_output(m, DType::BFloat16, formats::dcp::Target::whole(), [](int) { return nullptr; });
  std::vector<std::string> got;
  for (const auto& e : out.plan.entries) got.push_back(e.fqn);
  EXPECT_EQ(got, (std::vector<std::string>{"emb.weight", "train_state.step", "optimizer.state.emb.weight.exp_avg",
                                           "lr_scheduler.last_epoch", "optimizer.param_groups.emb.weight.lr"}));
  const auto& e = out.plan.entries;
  EXPECT_EQ(e[0].dtype, DType::BFloat16);
  EXPECT_EQ(e[1].dtype, DType::Int32);
  EXPECT_EQ(e[2].dtype, DType::BFloat16);  // the state as the source stored it
  EXPECT_TRUE(e[3].is_bytes);
  EXPECT_TRUE(e[4].is_bytes);
  EXPECT_EQ(out.sources[3].kind, reshard::DcpSource::Item);
  EXPECT_EQ(out.sources[4].param, 1);
  EXPECT_EQ(out.optimizer_dtype, "bf16");
  EXPECT_EQ(out.planner->value()->at("emb.weight")->repr(), "('emb.weight')");  // a 1-tuple
  EXPECT_EQ(out.planner->value()->at("optimizer.state.emb.weight.exp_avg")->repr(),
            "('optimizer', 'state.emb.weight.exp_avg')");
  EXPECT_EQ(out.planner->value()->at("train_state.step")->repr(), "('train_state', 'step')");
  EXPECT_EQ(out.planner->value()->at("lr_scheduler.last_epoch")->repr(), "('lr_scheduler', 'last_epoch')");
}

// A DCP whose parameters differ in dtype (a bf16 layer beside an fp32 norm) has no one precision to
// default to: without --dtype each model tensor keeps the dtype its source stored it in (issue 47;
// before: "give --dtype").
TEST(DcpOutput, OwnDtypesKeepEachParametersStoredDtype) {
  reshard::ModelInfo m;
  m.manifest_only = true;
  m.states = {"fp32"};
  for (const char* n : {"0.weight", "1.weight"}) {
    reshard::ParamInfo p;
    p.name = n;
    p.shape = {3};
    if (std::string(n) == "0.weight") p.source_dtypes["fp32"] = DType::BFloat16;
    m.params.push_back(p);
  }
  const auto step = [](int) { return nullptr; };
  const auto own = reshard::plan_dcp_output(m, DType::Float16, formats::dcp::Target::whole(), step, true);
  EXPECT_EQ(own.plan.entries[0].dtype, DType::BFloat16);
  EXPECT_EQ(own.plan.entries[1].dtype, DType::Float32);
  EXPECT_EQ(reshard::dcp_output_json(own)["dtype"], "as stored");
  const auto asked = reshard::plan_dcp_output(m, DType::Float16, formats::dcp::Target::whole(), step);
  EXPECT_EQ(asked.plan.entries[0].dtype, DType::Float16);
  EXPECT_EQ(asked.plan.entries[1].dtype, DType::Float16);
  reshard::TargetGiven given;
  given.dtype = false;
  EXPECT_TRUE(reshard::keeps_stored_dtypes(given, m, reshard::OutputFormat::Dcp));
  EXPECT_FALSE(reshard::keeps_stored_dtypes(given, m, reshard::OutputFormat::Safetensors));
  m.source_dtype = DType::BFloat16;  // one precision: it is the default, as before
  EXPECT_FALSE(reshard::keeps_stored_dtypes(given, m, reshard::OutputFormat::Dcp));
}

}  // namespace dcp_output_test
