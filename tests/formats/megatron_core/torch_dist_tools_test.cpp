// ucp-union --input <torch_dist> and ucp-load --format torch_dist through the tools, as users call
// them (relative paths, from another working folder, layout options left out), on the committed real
// Megatron-Core fixtures (tests/formats/megatron_core/data: Megatron-LM's own save_checkpoint):
//  * union: every parameter's fp32 / exp_avg / exp_avg_sq state file equals the truth Megatron's own
//    reader gave (load_plain_tensors -> fully_reshardable.truth: optimizer.state.{param,exp_avg,
//    exp_avg_sq}.<key> at the parameter's layer / expert), from both optimizer formats; the
//    dp_reshardable and fully_reshardable saves give byte-identical state files;
//  * load --format torch_dist: read back by formats/megatron_core's reader, each model tensor is the
//    truth's model tensor (bf16, bit-exact: Megatron's bf16 params are its fp32 main params rounded)
//    and each optimizer state the truth's; at the source layout the chunks of every model and
//    optimizer tensor are the boxes Megatron itself wrote; at another layout (TP 1 PP 1, EP 1) the
//    values are the same; the written folder unioned again gives identical state files;
//  * damage: a truncated data file, an unknown key (ucp-union), a universal folder missing a layer
//    (ucp-load): one line naming the file, exit 1, nothing left.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "formats/megatron_core/config.h"
#include "formats/megatron_core/reader.h"
#include "formats/universal/state_file.h"
#include "io/dtype.h"
#include "io/safetensors_file.h"
#include "io/torch/torch_file.h"
#include "formats/dcp/dcp_data.h"
#include "formats/megatron_core/mcore_data.h"
#include "support/paths.h"
#include "support/process.h"

namespace megatron_core_torch_dist_tools_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::formats::megatron_core;
using ucpkit::testing::kMcoreData;

namespace {

struct Scratch {
  std::string root, work;
};

Scratch scratch(const std::string& name) {
  Scratch s;
  s.root = ucpkit::testing::scratch_dir("mcore_tools_" + name);
  s.work = s.root + "/work";
  fs::create_directories(s.work);
  return s;
}

// The tool run in s.work with `args` (paths relative to s.work).
ucpkit::testing::SplitResult run(const Scratch& s, const std::string& tool, const std::string& args) {
  return ucpkit::testing::run_split_in(s.work, kBin + "/" + tool + " " + args, s.root);
}

// `path` relative to the tools' working folder.
std::string rel(const Scratch& s, const std::string& path) { return fs::relative(path, s.work).string(); }

std::map<std::string, SafetensorsTensor> truth_of(const std::string& variant) {
  const std::string p = kMcoreData + "/" + variant + ".truth/tensors.safetensors";
  return parse_safetensors(ucpkit::testing::slurp(p), p);
}

// The bytes of the parameter at `index` (leading layer / expert axes) of the truth tensor.
std::span<const uint8_t> truth_slice(const SafetensorsTensor& want, const std::vector<int64_t>& index) {
  int64_t flat = 0, outer = 1;
  for (size_t d = 0; d < index.size(); ++d) flat = flat * want.shape[d] + index[d], outer *= want.shape[d];
  const size_t n = want.bytes.size() / static_cast<size_t>(outer);
  return {reinterpret_cast<const uint8_t*>(want.bytes.data()) + static_cast<size_t>(flat) * n, n};
}

bool same_bytes(const Tensor& got, std::span<const uint8_t> want) {
  const auto b = got.contiguous().contiguous_bytes();
  return b.size() == want.size() && std::memcmp(b.data(), want.data(), b.size()) == 0;
}

Tensor state_file(const std::string& path) { return formats::universal::read_state_file(load_torch(path), path).param; }

nlohmann::json manifest_of(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json");
  return nlohmann::json::parse(in);
}

// manifest.json's params by name (their order is the stored keys' order in .metadata).
std::map<std::string, nlohmann::json> params_by_name(const std::string& dir) {
  std::map<std::string, nlohmann::json> out;
  for (const auto& e : manifest_of(dir)["params"]) out[e["name"]] = e;
  return out;
}

const char* const kModels[] = {"gpt_tp2_pp2", "llama_gqa_tp2_dp2_v016", "moe_ep2"};

// Every universal parameter's states of `u` against the fully_reshardable truth of `model`; returns
// the number of states compared.
size_t expect_universal_is_truth(const std::string& u, const std::string& model) {
  const auto truth = truth_of(model + "/fully_reshardable");
  const Checkpoint ck(kMcoreData + "/" + model + "/fully_reshardable");  // parameter -> stored key, index
  const auto m = manifest_of(u);
  size_t n = 0;
  std::set<std::string> seen;
  for (const auto& e : m["params"]) {
    const std::string name = e["name"];
    SCOPED_TRACE(u + " " + name);
    seen.insert(name);
    const ModelParam& p = ck.param(name);
    EXPECT_EQ(e["dtype"], "bfloat16");
    EXPECT_TRUE(e["step"].get<bool>());
    for (const auto& [state, key] : std::map<std::string, std::string>{
             {"fp32", "param"}, {"exp_avg", "exp_avg"}, {"exp_avg_sq", "exp_avg_sq"}}) {
      const Tensor t = state_file(u + "/" + e["states"][state]["file"].get<std::string>());
      EXPECT_EQ(t.dtype(), DType::Float32);
      EXPECT_EQ(t.shape(), p.slice.shape);
      const auto& want = truth.at("optimizer.state." + key + "." + p.key->model.key);
      EXPECT_TRUE(same_bytes(t, truth_slice(want, p.slice.index))) << state << " differs from the truth";
      ++n;
    }
  }
  EXPECT_EQ(seen.size(), ck.params().size());
  return n;
}

// ucp-union --input <in> (relative to s.work) --output <out>; returns the output's path.
std::string union_rel(const Scratch& s, const std::string& in, const std::string& out) {
  const auto r = run(s, "ucp-union", "--input " + in + " --output " + out);
  EXPECT_EQ(r.rc, 0) << r.err;
  return s.work + "/" + out;
}

std::string union_of(const Scratch& s, const std::string& model, const std::string& variant, const std::string& out) {
  return union_rel(s, rel(s, kMcoreData + "/" + model + "/" + variant), out);
}

// The state files (zero/**) of two universal folders byte-identical (zero/optimizer_state.pt too
// unless `param_groups` is false: an EP 2 -> EP 1 save has no expert optimizer); returns how many.
size_t expect_same_state_files(const std::string& a, const std::string& b, bool param_groups = true) {
  size_t files = 0;
  for (const auto& f : fs::recursive_directory_iterator(a + "/zero")) {
    if (!f.is_regular_file()) continue;
    if (!param_groups && f.path().filename() == "optimizer_state.pt") continue;
    const auto r = fs::relative(f.path(), a).string();
    EXPECT_TRUE(fs::exists(b + "/" + r)) << r;
    if (fs::exists(b + "/" + r)) EXPECT_EQ(ucpkit::testing::slurp(a + "/" + r), ucpkit::testing::slurp(b + "/" + r)) << r;
    ++files;
  }
  return files;
}

TEST(McoreUnion, EveryParameterAndMomentEqualsMegatronsTruthFromBothOptimizerFormats) {
  const Scratch s = scratch("union");
  size_t n = 0;
  for (const char* model : kModels)
    for (const char* variant : {"fully_reshardable", "dp_reshardable"})
      n += expect_universal_is_truth(union_of(s, model, variant, std::string(model) + "." + variant), model);
  EXPECT_EQ(n, 2u * 3u * (23 + 15 + 24));
}

TEST(McoreUnion, DpReshardableAndFullyReshardableGiveIdenticalStateFiles) {
  const Scratch s = scratch("same");
  for (const char* model : kModels) {
    const std::string a = union_of(s, model, "fully_reshardable", std::string(model) + ".f");
    const std::string b = union_of(s, model, "dp_reshardable", std::string(model) + ".d");
    EXPECT_EQ(params_by_name(a), params_by_name(b)) << model;  // names, shapes, crc32s
    EXPECT_GT(expect_same_state_files(a, b), 40u) << model;
  }
}

TEST(McoreUnion, SaveRootWithTrackerIsAnInput) {
  const Scratch s = scratch("root");
  fs::create_directories(s.root + "/save");
  fs::copy(kMcoreData + "/gpt_tp2_pp2/fully_reshardable", s.root + "/save/iter_0000002", fs::copy_options::recursive);
  std::ofstream(s.root + "/save/latest_checkpointed_iteration.txt") << "2\n";
  const auto r = run(s, "ucp-union", "--input ../save --output u");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(expect_universal_is_truth(s.work + "/u", "gpt_tp2_pp2"), 3u * 23u);
}

// The model tensors and optimizer states of the torch_dist folder `out` (a save root) against the
// source truth; returns the number of (parameter, tensor) values compared.
size_t expect_torch_dist_is_truth(const std::string& out, const std::string& model) {
  const auto truth = truth_of(model + "/fully_reshardable");
  const Checkpoint src(kMcoreData + "/" + model + "/fully_reshardable");
  const Checkpoint ck(out);
  EXPECT_EQ(ck.optimizer_format(), OptimizerFormat::FullyReshardable);
  EXPECT_EQ(ck.params().size(), src.params().size());
  size_t n = 0;
  for (const auto& p : ck.params()) {
    SCOPED_TRACE(out + " " + p.slice.name);
    const ModelParam& sp = src.param(p.slice.name);
    EXPECT_EQ(p.key->model.key, sp.key->model.key);  // the same stored key form
    const Tensor model_t = ck.read_param(p);
    EXPECT_EQ(model_t.dtype(), DType::BFloat16);
    EXPECT_TRUE(same_bytes(model_t, truth_slice(truth.at(sp.key->model.key), sp.slice.index))) << "model tensor";
    ++n;
    for (const char* state : {"param", "exp_avg", "exp_avg_sq"}) {
      const auto& want = truth.at(std::string("optimizer.state.") + state + "." + sp.key->model.key);
      EXPECT_TRUE(same_bytes(ck.read_param(p, state), truth_slice(want, sp.slice.index))) << state;
      ++n;
    }
  }
  return n;
}

// {fqn: sorted chunk boxes} of the tensors of a torch_dist folder.
std::map<std::string, std::set<std::pair<std::vector<int64_t>, std::vector<int64_t>>>> boxes_of(const std::string& dir) {
  const Checkpoint ck(dir);
  std::map<std::string, std::set<std::pair<std::vector<int64_t>, std::vector<int64_t>>>> out;
  for (const auto& e : ck.dcp().metadata().entries)
    if (!e.is_bytes)
      for (const auto& c : e.chunks) out[e.fqn].insert({c.offsets, c.sizes});
  return out;
}

TEST(McoreTorchDistLoad, SourceLayoutReadsBackAsTheTruthWithMegatronsOwnChunks) {
  const Scratch s = scratch("load_same");
  size_t n = 0;
  for (const char* model : kModels) {
    union_of(s, model, "dp_reshardable", std::string(model) + ".u");
    const auto r = run(s, "ucp-load", "--input " + std::string(model) + ".u --format torch_dist --output " + model + ".td");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.err.find("from the source"), std::string::npos) << r.err;  // the layout taken from the source, said
    const std::string out = s.work + "/" + model + ".td";
    EXPECT_EQ(ucpkit::testing::slurp(out + "/latest_checkpointed_iteration.txt"), "2");
    EXPECT_TRUE(fs::exists(out + "/iter_0000002/metadata.json"));
    n += expect_torch_dist_is_truth(out, model);
    // The same boxes as Megatron's own fully_reshardable save of that layout.
    const auto want = boxes_of(kMcoreData + "/" + model + "/fully_reshardable");
    const auto got = boxes_of(out + "/iter_0000002");
    EXPECT_EQ(got.size(), want.size()) << model;
    for (const auto& [fqn, b] : want) EXPECT_EQ(got.count(fqn) ? got.at(fqn) : decltype(b){}, b) << model << " " << fqn;
  }
  EXPECT_EQ(n, 4u * (23 + 15 + 24));
}

TEST(McoreTorchDistLoad, AnotherLayoutHasTheSameValuesAndUnionsBackIdentically) {
  const Scratch s = scratch("load_other");
  struct Case {
    const char* model;
    const char* args;
  };
  for (const Case& c : {Case{"gpt_tp2_pp2", "--tp 1 --pp 1 --dp 1"}, Case{"gpt_tp2_pp2", "--tp 2 --pp 1 --dp 2"},
                        Case{"llama_gqa_tp2_dp2_v016", "--tp 1 --dp 4"}, Case{"moe_ep2", "--ep 1 --dp 2"}}) {
    SCOPED_TRACE(std::string(c.model) + " " + c.args);
    const std::string tag = std::string(c.model) + "." + std::to_string(std::hash<std::string>{}(c.args) % 1000);
    const std::string u = union_of(s, c.model, "fully_reshardable", tag + ".u");
    const auto r = run(s, "ucp-load", "--input " + tag + ".u --format torch_dist " + c.args + " --output " + tag + ".td");
    ASSERT_EQ(r.rc, 0) << r.err;
    expect_torch_dist_is_truth(s.work + "/" + tag + ".td", c.model);
    // The common state's args name the new layout; the optimizer parts are what Megatron builds
    // there (MoE at EP 1: one unchained part, optimizer/__init__.py:1181-1224).
    const Checkpoint out(s.work + "/" + tag + ".td");
    const std::string a = c.args;
    auto arg_is = [&](const char* flag, const char* name) {
      const auto at = a.find(flag);
      if (at == std::string::npos) return;
      EXPECT_EQ(out.common().arg(name)->i, std::stoll(a.substr(at + std::string(flag).size()))) << name;
    };
    arg_is("--tp ", "tensor_model_parallel_size");
    arg_is("--pp ", "pipeline_model_parallel_size");
    arg_is("--ep ", "expert_model_parallel_size");
    arg_is("--dp ", "data_parallel_size");
    const auto opt = out.common().root->get("optimizer");
    ASSERT_TRUE(opt);
    EXPECT_TRUE(opt->contains("optimizer")) << "one unchained optimizer part expected";
    EXPECT_EQ(out.common().content_string("distrib_optim_sharding_type"), "fully_reshardable");
    // Unioned again (the save root): the same state files, the manifest's params equal.
    const std::string u2 = union_rel(s, tag + ".td", tag + ".u2");
    EXPECT_EQ(params_by_name(u), params_by_name(u2));
    EXPECT_GT(expect_same_state_files(u, u2, std::string(c.model) != "moe_ep2"), 40u);
  }
}

// Expert tensor parallelism (issue 47): a TP 2 x EP 2 save with Megatron-LM's default ETP = TP is read from
// both optimizer forms (the same state files) and written with ETP following TP, or --etp; ucp-info names it.
// Megatron-LM's own load_checkpoint of these outputs: scripts/verify/torch_dist_verify.sh (moe_etp_* cases).
TEST(McoreTorchDistLoad, ExpertTensorParallelismIsReadAndWritten) {
  const Scratch s = scratch("etp");
  const std::string dp = union_of(s, "moe_tp2_etp2", "dp_reshardable", "dp.u");
  const std::string full = union_of(s, "moe_tp2_etp2", "fully_reshardable", "full.u");
  EXPECT_GT(expect_same_state_files(dp, full, false), 40u);
  const auto info = nlohmann::json::parse(run(s, "ucp-info", rel(s, kMcoreData + "/moe_tp2_etp2/dp_reshardable") + " --json").out);
  EXPECT_EQ(info["layout"]["etp"], 2) << info["layout"].dump();
  struct Case {
    const char* args;
    int64_t etp;
  };
  // "--etp 1 --ep 4": EP above DP 2, which Megatron's expert grid allows at ETP 1 (ETP x EP = TP x DP);
  // its load_checkpoint and training resumed from it: torch_dist_verify.sh resume_moe_etp2_etp1_ep4.
  for (const Case& c : {Case{"", 2}, Case{"--tp 1", 1}, Case{"--etp 1", 1}, Case{"--tp 1 --dp 4 --etp 2", 2},
                        Case{"--etp 1 --ep 4", 1}}) {
    SCOPED_TRACE(c.args);
    const std::string out = "td" + std::to_string(std::hash<std::string>{}(c.args) % 1000);
    const auto r = run(s, "ucp-load", "--input full.u --format torch_dist " + std::string(c.args) + " --output " + out);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(expect_torch_dist_is_truth(s.work + "/" + out, "moe_tp2_etp2"), 4u * 24u);
    EXPECT_EQ(Checkpoint(s.work + "/" + out).common().arg("expert_tensor_parallel_size")->i, c.etp);
  }
  const auto wrong = run(s, "ucp-load", "--input full.u --format torch_dist --etp 4 --output bad");  // 4 x EP 2 > 4 ranks
  EXPECT_EQ(wrong.rc, 2) << wrong.err;
  EXPECT_NE(wrong.err.find("expert TP 4 x EP 2"), std::string::npos) << wrong.err;
  const auto ep4 = run(s, "ucp-load", "--input full.u --format torch_dist --ep 4 --output bad");  // ETP 2 x EP 4 > 4
  EXPECT_EQ(ep4.rc, 2) << ep4.err;
  EXPECT_NE(ep4.err.find("expert TP 2 x EP 4 does not divide TP x DP = 4"), std::string::npos) << ep4.err;
  const auto ds = run(s, "ucp-load", "--input full.u --format dcp --etp 1 --output bad");
  EXPECT_EQ(ds.rc, 2) << ds.err;
  EXPECT_NE(ds.err.find("--etp applies to --format torch_dist"), std::string::npos) << ds.err;
}

// --megatron-version (issue 47): the common state where that release keeps it: common.pt before 0.17
// (what Megatron-Core 0.16 reads), the common_state item from 0.17; by default the source's form.
TEST(McoreTorchDistLoad, MegatronVersionChoosesWhereTheCommonStateIsWritten) {
  const Scratch s = scratch("megatron_version");
  union_of(s, "gpt_tp2_pp2", "fully_reshardable", "u19");
  union_of(s, "llama_gqa_tp2_dp2_v016", "fully_reshardable", "u16");
  struct Case {
    const char* input;
    const char* option;
    bool common_pt;
  };
  for (const Case& c : {Case{"u19", "", false}, Case{"u19", "--megatron-version 0.16", true},
                        Case{"u16", "", true}, Case{"u16", "--megatron-version 0.19.0", false}}) {
    SCOPED_TRACE(std::string(c.input) + " " + c.option);
    const std::string out = std::string(c.input) + (c.option[0] ? ".opt" : ".default");
    const auto r = run(s, "ucp-load", "--input " + std::string(c.input) + " --format torch_dist " + c.option + " --output " + out);
    ASSERT_EQ(r.rc, 0) << r.err;
    const std::string iter = formats::megatron_core::iteration_dir(s.work + "/" + out);
    EXPECT_EQ(fs::exists(iter + "/common.pt"), c.common_pt);
    const Checkpoint ck(s.work + "/" + out);
    EXPECT_EQ(ck.common().legacy, c.common_pt);
    EXPECT_TRUE(ck.common().arg("tensor_model_parallel_size"));
  }
  const auto bad = run(s, "ucp-load", "--input u19 --format torch_dist --megatron-version latest --output bad");
  EXPECT_EQ(bad.rc, 2) << bad.err;
  EXPECT_NE(bad.err.find("--megatron-version latest: expected a Megatron-Core release"), std::string::npos) << bad.err;
  const auto other = run(s, "ucp-load", "--input u19 --format dcp --megatron-version 0.16 --output bad");
  EXPECT_EQ(other.rc, 2) << other.err;
  EXPECT_NE(other.err.find("--megatron-version applies to --format torch_dist"), std::string::npos) << other.err;
}

// A torch_dist save written as torch_dist is read in one pass (reshard/megatron_core_input.h): no scratch folder.
TEST(McoreTorchDistLoad, DirectFromATorchDistInputInOnePassLeavesNothingBeside) {
  const Scratch s = scratch("load_direct");
  const std::string in = rel(s, kMcoreData + "/moe_ep2/dp_reshardable");
  const auto r = run(s, "ucp-load", "--input " + in + " --format torch_dist --ep 1 --output td");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("scratch universal folder"), std::string::npos) << r.err;
  EXPECT_EQ(expect_torch_dist_is_truth(s.work + "/td", "moe_ep2"), 4u * 24u);
  // Under mpirun the ranks share the data files and rank 0 writes .metadata: the same files, the same content.
  const auto np2 = ucpkit::testing::run_split_in(
      s.work, "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 " +
                  kBin + "/ucp-load -q --input " + in + " --format torch_dist --ep 1 --output td_np2", s.root);
  ASSERT_EQ(np2.rc, 0) << np2.err;
  EXPECT_EQ(expect_torch_dist_is_truth(s.work + "/td_np2", "moe_ep2"), 4u * 24u);
  for (const auto& e : fs::recursive_directory_iterator(s.work + "/td")) {
    if (!e.is_regular_file() || e.path().filename() == ".metadata") continue;  // .metadata names its folder
    const auto rel_path = fs::relative(e.path(), s.work + "/td");
    EXPECT_EQ(ucpkit::testing::run_command("cmp -s " + e.path().string() + " " + (fs::path(s.work) / "td_np2" / rel_path).string()), 0)
        << rel_path;
  }
  fs::remove_all(s.work + "/td_np2");
  // A failure after the conversion (--ep 3 does not divide DP 2) leaves no scratch folder either.
  const auto bad = run(s, "ucp-load", "--input " + in + " --format torch_dist --ep 3 --output td2");
  EXPECT_EQ(bad.rc, 2) << bad.err;
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(s.work)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, std::set<std::string>{"td"});
}

TEST(McoreTorchDistInfo, UcpInfoDescribesAFolderASaveRootAndTheUniversalFolder) {
  const Scratch s = scratch("info");
  const auto info = nlohmann::json::parse(run(s, "ucp-info", rel(s, kMcoreData + "/gpt_tp2_pp2/dp_reshardable") + " --json").out);
  EXPECT_EQ(info["kind"], "torch_dist");
  EXPECT_EQ(info["tensors"], 23);  // per layer, not the stored stacks and buckets
  EXPECT_EQ(info["dcp"]["megatron_core"]["optimizer_format"], "dp_reshardable");
  EXPECT_EQ(info["dcp"]["megatron_core"]["iteration"], 2);
  union_of(s, "moe_ep2", "fully_reshardable", "u");
  ASSERT_EQ(run(s, "ucp-load", "--input u --format torch_dist --output td").rc, 0);
  const auto root = nlohmann::json::parse(run(s, "ucp-info", "td --json").out);  // a save root
  EXPECT_EQ(root["kind"], "torch_dist");
  EXPECT_EQ(root["tensors"], 24);
  EXPECT_EQ(root["dcp"]["megatron_core"]["optimizer_format"], "fully_reshardable");
  // The layout, step and experts from Megatron's args and keys (issue 47: null, null and no MoE before).
  const auto moe = nlohmann::json::parse(run(s, "ucp-info", rel(s, kMcoreData + "/moe_ep2/fully_reshardable") + " --json").out);
  EXPECT_EQ(moe["layout"]["tp"], 1);
  EXPECT_EQ(moe["layout"]["dp"], 2);
  EXPECT_EQ(moe["layout"]["ep"], 2);
  EXPECT_EQ(moe["layout"]["optimizer"], "distributed fully_reshardable");
  EXPECT_EQ(moe["step"], 2);
  EXPECT_EQ(moe["experts"]["kind"], "megatron-core");
  EXPECT_EQ(moe["experts"]["moe_layers"], 1);
  EXPECT_EQ(moe["experts"]["per_layer"], nlohmann::json::array({4}));
  EXPECT_EQ(moe["dcp"]["megatron_core"]["etp"], 1);
  EXPECT_EQ(info["layout"]["tp"], 2);
  EXPECT_EQ(info["layout"]["pp"], 2);
  EXPECT_EQ(info["step"], 2);
  const auto r = run(s, "ucp-info", "u --json");
  const auto uni = nlohmann::json::parse(r.out);
  EXPECT_EQ(uni["kind"], "universal");
  EXPECT_EQ(uni["tensors"], 24);
  EXPECT_EQ(r.rc, 0) << r.err;
}

// Damage: one line on stderr naming `file` and `cause`, exit 1, and nothing but `keep` left in s.work.
void expect_refused(const Scratch& s, const ucpkit::testing::SplitResult& r, const std::string& file,
                    const std::string& cause, const std::set<std::string>& keep) {
  EXPECT_EQ(r.rc, 1) << r.err;
  std::string err = r.err;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_NE(err.find(file), std::string::npos) << err;
  EXPECT_NE(err.find(cause), std::string::npos) << err;
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(s.work)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, keep);
}

std::string copy_into_work(const Scratch& s, const std::string& model, const std::string& variant, const std::string& name) {
  const std::string d = s.work + "/" + name;
  fs::copy(kMcoreData + "/" + model + "/" + variant, d, fs::copy_options::recursive);
  return d;
}

TEST(McoreTorchDistDamage, TruncatedDataFileIsNamedAndNothingIsLeft) {
  const Scratch s = scratch("damage_trunc");
  const std::string d = copy_into_work(s, "gpt_tp2_pp2", "fully_reshardable", "in");
  const std::string f = d + "/__1_0.distcp";
  fs::resize_file(f, fs::file_size(f) / 2);
  expect_refused(s, run(s, "ucp-union", "--input in --output u"), "__1_0.distcp", "", {"in"});
}

TEST(McoreTorchDistDamage, UnknownKeyIsNamedAndNothingIsLeft) {
  const Scratch s = scratch("damage_key");
  const std::string d = copy_into_work(s, "gpt_tp2_pp2", "dp_reshardable", "in");
  std::string md = ucpkit::testing::slurp(d + "/.metadata");
  const std::string from = "decoder.final_layernorm.weight", to = "decoder.final_layernorm.9eight";
  const size_t at = md.find(from);
  ASSERT_NE(at, std::string::npos);
  md.replace(at, from.size(), to);
  std::ofstream(d + "/.metadata", std::ios::binary | std::ios::trunc) << md;
  expect_refused(s, run(s, "ucp-union", "--input in --output u"), "in/.metadata", "unknown key", {"in"});
}

TEST(McoreTorchDistDamage, AChunkSetThatDoesNotCoverItsTensorIsNamedAndNothingIsLeft) {
  const Scratch s = scratch("damage_cover");
  const std::string d = copy_into_work(s, "gpt_tp2_pp2", "fully_reshardable", "in");
  std::string md = ucpkit::testing::slurp(d + "/.metadata");
  // optimizer.state.exp_avg.decoder.final_layernorm.weight [16], one chunk: in the pickle its global
  // size (BININT1 16), then its chunk's offsets (0) and sizes (16); the chunk's size becomes 8.
  const size_t key = md.find("optimizer.state.exp_avg.decoder.final_layernorm.weight");
  ASSERT_NE(key, std::string::npos);
  const size_t global = md.find(std::string("K\x10", 2), key);
  const size_t offsets = md.find(std::string("K\x00", 2), global + 2);
  const size_t sizes = md.find(std::string("K\x10", 2), global + 2);
  ASSERT_TRUE(global != std::string::npos && offsets < sizes && sizes != std::string::npos && sizes - key < 200);
  md[sizes + 1] = '\x08';
  std::ofstream(d + "/.metadata", std::ios::binary | std::ios::trunc) << md;
  expect_refused(s, run(s, "ucp-union", "--input in --output u"), "in/.metadata", "leave a gap", {"in"});
}

TEST(McoreTorchDistDamage, UniversalFolderMissingALayerLeavesTheStackUncoveredAndIsRefused) {
  const Scratch s = scratch("damage_layer");
  union_of(s, "gpt_tp2_pp2", "fully_reshardable", "u");
  auto m = manifest_of(s.work + "/u");
  auto& params = m["params"];
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i]["name"] == "decoder.layers.1.mlp.linear_fc2.weight") {
      params.erase(i);
      break;
    }
  std::ofstream(s.work + "/u/manifest.json", std::ios::trunc) << m.dump(1);
  expect_refused(s, run(s, "ucp-load", "--input u --format torch_dist --output td"), "u/manifest.json",
                 "decoder.layers.mlp.linear_fc2.weight has no parameter for layer 1", {"u"});
}

TEST(McoreTorchDistDamage, AStateFileOtherThanTheManifestsChecksumIsRefused) {
  const Scratch s = scratch("damage_crc");
  union_of(s, "gpt_tp2_pp2", "fully_reshardable", "u");
  auto m = manifest_of(s.work + "/u");
  for (auto& e : m["params"])
    if (e["name"] == "decoder.layers.1.mlp.linear_fc2.weight") e["states"]["exp_avg"]["crc32"] = "00000000";
  std::ofstream(s.work + "/u/manifest.json", std::ios::trunc) << m.dump(1);
  expect_refused(s, run(s, "ucp-load", "--input u --format torch_dist --dp 1 --output td"),
                 "u/zero/decoder.layers.1.mlp.linear_fc2.weight/exp_avg.pt", "checksum mismatch", {"u"});
}

TEST(McoreTorchDistDamage, UniversalFolderWithoutCommonStateIsRefusedByName) {
  const Scratch s = scratch("damage_common");
  union_of(s, "moe_ep2", "fully_reshardable", "u");
  fs::remove(s.work + "/u/megatron_core/common_state.pt");
  expect_refused(s, run(s, "ucp-load", "--input u --format torch_dist --output td"), "common_state.pt", "missing", {"u"});
}

TEST(McoreTorchDistDamage, ALayoutThatDoesNotDivideIsAUsageError) {
  const Scratch s = scratch("damage_usage");
  union_of(s, "gpt_tp2_pp2", "fully_reshardable", "u");
  const auto r = run(s, "ucp-load", "--input u --format torch_dist --pp 3 --output td");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--pp 3"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(s.work + "/td"));
}

}  // namespace

}  // namespace megatron_core_torch_dist_tools_test
