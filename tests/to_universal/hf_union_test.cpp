// ucp-union of a damaged Hugging Face folder (to_universal/from_hf.cpp, docs/hf.md "Hugging Face input"),
// through the tool as users run it: one line naming the file and the tensor, exit 1, no output folder and
// no staging folder left. The folders are assembled by hand (damage only; well-formed ones are
// transformers' own, tests/frameworks/hf_models.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "formats/dcp/reader.h"
#include "io/safetensors_file.h"
#include "support/paths.h"
#include "support/process.h"

namespace hf_union_test {

namespace fs = std::filesystem;
using namespace ucpkit;

namespace {

void put(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// Values in [0.5, 1) that differ along the tensor (a row or piece put in the wrong place shows).
SafetensorsTensor bf16(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::string bytes(static_cast<size_t>(n) * 2, '\x3f');
  for (size_t i = 0; i < bytes.size(); i += 2) bytes[i] = static_cast<char>((i / 2 * 37 + shape[0]) % 251);
  return {"BF16", shape, bytes};
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every file under a and b (relative paths) with the same bytes; `same` maps a's text before the comparison (a
// path recorded inside a file).
void expect_same_files(const fs::path& a, const fs::path& b, const std::function<std::string(std::string)>& same) {
  std::set<std::string> fa, fb;
  for (const auto& e : fs::recursive_directory_iterator(a))
    if (e.is_regular_file()) fa.insert(fs::relative(e.path(), a).string());
  for (const auto& e : fs::recursive_directory_iterator(b))
    if (e.is_regular_file()) fb.insert(fs::relative(e.path(), b).string());
  EXPECT_EQ(fa, fb);
  for (const auto& f : fa) EXPECT_TRUE(same(file_text(a / f)) == file_text(b / f)) << (a / f) << " and " << (b / f) << " differ";
}

// A Llama with hidden 8, 2 heads of 4 in 1 KV group, intermediate 16, 1 layer, vocabulary 16, untied.
std::map<std::string, SafetensorsTensor> llama() {
  return {{"model.embed_tokens.weight", bf16({16, 8})},
          {"model.layers.0.input_layernorm.weight", bf16({8})},
          {"model.layers.0.self_attn.q_proj.weight", bf16({8, 8})},
          {"model.layers.0.self_attn.k_proj.weight", bf16({4, 8})},
          {"model.layers.0.self_attn.v_proj.weight", bf16({4, 8})},
          {"model.layers.0.self_attn.o_proj.weight", bf16({8, 8})},
          {"model.layers.0.post_attention_layernorm.weight", bf16({8})},
          {"model.layers.0.mlp.gate_proj.weight", bf16({16, 8})},
          {"model.layers.0.mlp.up_proj.weight", bf16({16, 8})},
          {"model.layers.0.mlp.down_proj.weight", bf16({8, 16})},
          {"model.norm.weight", bf16({8})},
          {"lm_head.weight", bf16({16, 8})}};
}

nlohmann::json config() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 8}, {"intermediate_size", 16}, {"num_hidden_layers", 1},
          {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 4}, {"max_position_embeddings", 8},
          {"vocab_size", 16}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}, {"dtype", "bfloat16"}};
}

// A scratch folder `name` holding the undamaged Hugging Face folder "hf".
fs::path with_hf_folder(const std::string& name) {
  const fs::path root = ucpkit::testing::scratch_dir(name);
  fs::create_directories(root / "hf");
  put(root / "hf/config.json", config().dump());
  put(root / "hf/model.safetensors", safetensors_bytes(llama()));
  return root;
}

// A bf16 norm of 8 values seeded by `seed` >= 8 (bf16's values follow the first dimension): each layer's its own.
SafetensorsTensor norm8(int64_t seed) {
  SafetensorsTensor t = bf16({seed});
  t.shape = {8};
  t.bytes.resize(16);
  return t;
}

// A Mixtral (every layer MoE) with hidden 8, 2 heads of 4 in 1 KV group, 2 experts of 16, 2 layers, vocabulary 16.
fs::path with_mixtral_folder(const std::string& name) {
  std::map<std::string, SafetensorsTensor> t = {{"model.embed_tokens.weight", bf16({16, 8})},
                                                {"model.norm.weight", bf16({8})},
                                                {"lm_head.weight", bf16({16, 8})}};
  for (int l = 0; l < 2; ++l) {
    const std::string L = "model.layers." + std::to_string(l) + ".";
    t.emplace(L + "input_layernorm.weight", norm8(8 + l));
    t.emplace(L + "post_attention_layernorm.weight", norm8(10 + l));
    t.emplace(L + "self_attn.q_proj.weight", bf16({8, 8}));
    t.emplace(L + "self_attn.k_proj.weight", bf16({4, 8}));
    t.emplace(L + "self_attn.v_proj.weight", bf16({4, 8}));
    t.emplace(L + "self_attn.o_proj.weight", bf16({8, 8}));
    t.emplace(L + "block_sparse_moe.gate.weight", bf16({2, 8}));
    for (int e = 0; e < 2; ++e) {
      const std::string E = L + "block_sparse_moe.experts." + std::to_string(e) + ".";
      t.emplace(E + "w1.weight", bf16({16, 8}));
      t.emplace(E + "w3.weight", bf16({16, 8}));
      t.emplace(E + "w2.weight", bf16({8, 16}));
    }
  }
  nlohmann::json c = config();
  c["architectures"] = {"MixtralForCausalLM"};
  c["model_type"] = "mixtral";
  c["num_hidden_layers"] = 2;
  c["num_local_experts"] = 2;
  c["num_experts_per_tok"] = 1;
  c["router_jitter_noise"] = 0.0;
  c["sliding_window"] = nullptr;
  const fs::path root = ucpkit::testing::scratch_dir(name);
  fs::create_directories(root / "hf");
  put(root / "hf/config.json", c.dump());
  put(root / "hf/model.safetensors", safetensors_bytes(t));
  return root;
}

// A runner of the tools (the build's bin/) in `root`, as a user in that folder types them: tools_in(root)("ucp-load ...").
auto tools_in(const fs::path& root) {
  return [root](const std::string& tool_args) {
    return ucpkit::testing::run_split_in(root.string(), kBin + "/" + tool_args, root.string());
  };
}

struct Case {
  const char* what;      // the damage
  const char* expected;  // in the one error line
  std::function<void(const fs::path&)> damage;
};

}  // namespace

TEST(HfUnion, DamagedFoldersAreRefusedNamingTheFileAndNothingIsLeft) {
  const Case cases[] = {
      {"config.json contradicts k_proj", "rows",
       [](const fs::path& d) { auto c = config(); c["num_key_value_heads"] = 2; put(d / "config.json", c.dump()); }},
      {"an architecture without a map", "has no Hugging Face family map",
       [](const fs::path& d) { auto c = config(); c["architectures"] = {"BloomForCausalLM"}; put(d / "config.json", c.dump()); }},
      {"a shard the index names is missing", "model-00002-of-00002.safetensors: missing",
       [](const fs::path& d) {
         auto t = llama();
         t.erase("lm_head.weight");
         put(d / "model-00001-of-00002.safetensors", safetensors_bytes(t));
         fs::remove(d / "model.safetensors");
         nlohmann::json map;
         for (const auto& [n, t] : llama()) map[n] = n == "lm_head.weight" ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
         put(d / "model.safetensors.index.json", nlohmann::json{{"weight_map", map}}.dump());
       }},
      {"a tensor in two shards", "is in two shards",
       [](const fs::path& d) {
         auto t = llama();
         put(d / "model-00001-of-00002.safetensors", safetensors_bytes(t));
         put(d / "model-00002-of-00002.safetensors", safetensors_bytes({{"lm_head.weight", bf16({16, 8})}}));
         fs::remove(d / "model.safetensors");
         nlohmann::json map;
         for (const auto& [n, x] : t) map[n] = n == "lm_head.weight" ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
         put(d / "model.safetensors.index.json", nlohmann::json{{"weight_map", map}}.dump());
       }},
      {"a dtype ucpkit does not convert", "F8_E4M3",
       [](const fs::path& d) {
         auto t = llama();
         t["model.norm.weight"] = {"F8_E4M3", {8}, std::string(8, '\0')};
         put(d / "model.safetensors", safetensors_bytes(t));
       }},
      {"a tensor the map does not name", "model.layers.0.self_attn.rotary_emb.inv_freq has no rule",
       [](const fs::path& d) {
         auto t = llama();
         t["model.layers.0.self_attn.rotary_emb.inv_freq"] = bf16({2});
         put(d / "model.safetensors", safetensors_bytes(t));
       }},
  };
  for (const Case& c : cases) {
    const fs::path root = ucpkit::testing::scratch_dir(std::string("hf_union_") + std::to_string(&c - cases));
    const fs::path in = root / "hf";
    fs::create_directories(in);
    put(in / "config.json", config().dump());
    put(in / "model.safetensors", safetensors_bytes(llama()));
    c.damage(in);
    // ucp-union, and ucp-load through its scratch folder (dcp) and in one pass (torch_dist, hf).
    for (const std::string cmd : {"ucp-union --input hf --output u", "ucp-load --input hf --format dcp --output u",
                                  "ucp-load --input hf --format torch_dist --tp 1 --output u",
                                  "ucp-load --input hf --format hf --output u"}) {
      const auto r = ucpkit::testing::run_split_in(root.string(), kBin + "/" + cmd, root.string());
      EXPECT_EQ(r.rc, 1) << c.what << ", " << cmd << ": " << r.err;
      EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.what << ", " << cmd << ": " << r.err;
      EXPECT_NE(r.err.find("hf"), std::string::npos) << c.what << ", " << cmd << ": " << r.err;
      for (const auto& e : fs::directory_iterator(root))
        if (e.path().filename() != "hf") ADD_FAILURE() << c.what << ", " << cmd << ": left behind " << e.path();
    }
  }
  // The same folder undamaged converts (the cases above fail for their damage alone).
  const fs::path root = with_hf_folder("hf_union_ok");
  const auto r = ucpkit::testing::run_split_in(root.string(), kBin + "/ucp-union -q --input hf --output u", root.string());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::exists(root / "u/megatron_core/common_state.pt"));
}

// The import is in Megatron-Core names (manifest source.names, to_universal/from_hf.cpp): renaming it
// to Megatron-Core names again is refused as such, and to Megatron-DeepSpeed names through a template is refused
// because the template's model files would bring that run's iteration, schedule and data position (the build before
// said "already has Megatron-DeepSpeed names" to both); without one it takes a fresh run's.
TEST(HfUnion, ImportIsNotRenamedAsIfItHadMegatronDeepSpeedNames) {
  const fs::path root = with_hf_folder("hf_union_names");
  auto run = [&](const std::string& args) {
    return ucpkit::testing::run_split_in(root.string(), kBin + "/ucp-union -q " + args, root.string());
  };
  ASSERT_EQ(run("--input hf --output u").rc, 0);
  auto r = run("--input u --to-names megatron-core --output c");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("u/manifest.json: this universal folder already has Megatron-Core names"), std::string::npos) << r.err;
  r = run("--input u --to-names megatron-deepspeed --template u --output d");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("take the model files of a fresh Megatron-DeepSpeed run"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("iteration, learning-rate schedule and data position: leave --template out"), std::string::npos) << r.err;
  for (const char* left : {"c", "d"}) EXPECT_FALSE(fs::exists(root / left)) << left;
  // Without --template, the import and the folder itself take a fresh run's model files (hf_megatron_deepspeed.h),
  // and nothing is left beside the output but it.
  for (const char* in : {"u", "hf"}) {
    const std::string out = std::string("mds_") + in;
    r = run(std::string("--input ") + in + " --to-names megatron-deepspeed --output " + out);
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(fs::exists(root / out / "mp_rank_00_model_states.pt")) << in;
    EXPECT_NE(r.err.find("fresh Megatron-DeepSpeed run"), std::string::npos) << r.err;
  }
  r = run("--input hf --to-names megatron-deepspeed --template u --output d");
  EXPECT_EQ(r.rc, 2) << r.err;
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().find(".ucp-"), std::string::npos) << e.path();
}

// --audit (docs/hf.md "Audit"): the import records every Megatron-Core parameter once, after the folder is in
// place; where no audit is recorded (another input, --dry-run, --to-names) it is refused before anything is written.
// The SHA-256s are judged against Python's hashlib in tests/frameworks/hf_import_audit_check.py.
TEST(HfUnion, ImportAuditListsEveryParameterOnceAndIsRefusedWhereNoneIsRecorded) {
  const fs::path root = with_hf_folder("hf_union_audit");
  const auto run = tools_in(root);
  auto r = run("ucp-union -q --input hf --output u --audit audit.json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto audit = nlohmann::json::parse(std::ifstream(root / "audit.json"));
  EXPECT_EQ(audit["format"], "ucpkit-audit");
  EXPECT_EQ(audit["output"], "u");
  std::set<std::string> names, sources;
  for (const auto& t : audit["tensors"]) {
    EXPECT_TRUE(names.insert(t["name"].get<std::string>()).second) << t["name"];
    EXPECT_EQ(t["sha256"].get<std::string>().size(), 64u);
    for (const auto& f : t["from"]) EXPECT_TRUE(sources.insert(f["name"].get<std::string>()).second) << f["name"];
  }
  EXPECT_EQ(names.size(), audit["totals"]["tensors"].get<size_t>());
  EXPECT_EQ(sources.size(), llama().size());  // every Hugging Face tensor the source of one parameter
  r = run("ucp-load -q --input hf --format dcp --output d --audit d.json");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(root / "d.json"))["output"], "d");  // the user's output, not the scratch
  const std::pair<std::string, std::string> refused[] = {
      {"ucp-union -q --input " + kFx + "/gpt_tp2_pp2_dp3 --output v --audit a.json", "records no audit"},
      {"ucp-union -q --input hf --output v --audit a.json --dry-run", "not available with --dry-run"},
      {"ucp-union -q --input u --to-names megatron-deepspeed --template u --output v --audit a.json", "not available with --to-names"},
      {"ucp-load -q --input u --format dcp --output v --audit a.json", "--audit applies to --format hf, or to a Hugging Face input"},
  };
  // An audit that could not be written after the commit is refused before anything is (exit 1, no output).
  r = run("ucp-union -q --input hf --output v --audit missing/a.json");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("missing/a.json: folder missing does not exist"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(root / "v"));
  r = run("ucp-load -q --input hf --format dcp --output v --audit missing/a.json");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_FALSE(fs::exists(root / "v"));
  for (const auto& [args, expected] : refused) {
    r = run(args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << args << ": " << r.err;
    EXPECT_FALSE(fs::exists(root / "v")) << args;
    EXPECT_FALSE(fs::exists(root / "a.json")) << args;
  }
}

// ucp-load of a Hugging Face folder as --format torch_dist (or hf), and of a torch_dist save as --format hf, reads the
// input in one pass (reshard/megatron_core_input.h): no scratch universal folder, and byte for byte what the two
// steps through a universal folder write; the import's --audit the union's records.
TEST(HfUnion, UcpLoadReadsTheFolderInOnePassAsTheTwoStepsWrite) {
  const fs::path root = with_hf_folder("hf_one_pass");
  const auto run = tools_in(root);
  auto ok = [&](const std::string& tool_args) {
    const auto r = run(tool_args);
    EXPECT_EQ(r.rc, 0) << tool_args << ": " << r.err;
    return r;
  };
  fs::create_directories(root / "a");
  fs::create_directories(root / "b");
  ok("ucp-union -q --input hf --output u --audit u.json");
  ok("ucp-load -q --input u --format torch_dist --dp 2 --output a/td");
  auto r = ok("ucp-load -v --input hf --format torch_dist --dp 2 --output b/td --audit b.json");
  EXPECT_EQ(r.err.find("scratch universal folder"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("read in one pass"), std::string::npos) << r.err;
  // .metadata records the folder it was written to (storage_meta.checkpoint_id): a/td and b/td.
  auto a_to_b = [&](std::string text) {
    const std::string from = (root / "a/td").string(), to = (root / "b/td").string();
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) text.replace(at, from.size(), to);
    return text;
  };
  expect_same_files(root / "a/td", root / "b/td", a_to_b);
  // Under mpirun the ranks share the data files, rank 0 writes .metadata: the same bytes.
  fs::create_directories(root / "c");
  const auto np2 = ucpkit::testing::run_split_in(
      root.string(), "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 " +
                         kBin + "/ucp-load -q --input hf --format torch_dist --dp 2 --output c/td", root.string());
  ASSERT_EQ(np2.rc, 0) << np2.err;
  expect_same_files(root / "a/td", root / "c/td", [&](std::string text) {
    const std::string from = (root / "a/td").string(), to = (root / "c/td").string();
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) text.replace(at, from.size(), to);
    return text;
  });
  const auto one = nlohmann::json::parse(std::ifstream(root / "b.json")), two = nlohmann::json::parse(std::ifstream(root / "u.json"));
  EXPECT_EQ(one["tensors"], two["tensors"]);
  EXPECT_EQ(one["output"], "b/td");
  // The export: one pass from the save against ucp-union of it and ucp-load of that folder.
  r = ok("ucp-load -v --input a/td --format hf --output a/back");
  EXPECT_EQ(r.err.find("scratch universal folder"), std::string::npos) << r.err;
  ok("ucp-union -q --input a/td --output ut");
  ok("ucp-load -q --input ut --format hf --output b/back");
  expect_same_files(root / "a/back", root / "b/back", [](std::string t) { return t; });
  // With --no-verify a torch_dist save is read range by range as it is written (no item read whole to check its
  // CRC-32): the same files, to Hugging Face and to torch_dist at another layout.
  ok("ucp-load -q --no-verify --input a/td --format hf --output c_back");
  expect_same_files(root / "a/back", root / "c_back", [](std::string t) { return t; });
  ok("ucp-load -q --input a/td --format torch_dist --dp 1 --tp 1 --output d_td");
  ok("ucp-load -q --no-verify --input a/td --format torch_dist --dp 1 --tp 1 --output e_td");
  expect_same_files(root / "d_td", root / "e_td", [&](std::string text) {
    const std::string from = (root / "d_td").string(), to = (root / "e_td").string();
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) text.replace(at, from.size(), to);
    return text;
  });
  // The default --verify still checks every fp32 item it streams: a byte flipped in the embedding's fp32 master (its
  // first values 0x3f10, 0x3f35 as bf16, so 00 00 10 3f 00 00 35 3f in fp32) is refused naming the item, nothing left.
  fs::copy(root / "a/td", root / "bad_td", fs::copy_options::recursive);
  bool flipped = false;
  for (const auto& e : fs::recursive_directory_iterator(root / "bad_td")) {
    if (flipped || e.path().extension() != ".distcp") continue;
    std::string bytes = file_text(e.path());
    const size_t at = bytes.find(std::string("\0\0\x10\x3f\0\0\x35\x3f", 8));
    if (at == std::string::npos) continue;
    bytes[at + 6] = '\x36';
    put(e.path(), bytes);
    flipped = true;
  }
  ASSERT_TRUE(flipped) << "the embedding's fp32 master was not found in the save";
  r = run("ucp-load -q --input bad_td --format hf --output bad_back");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("CRC-32 mismatch"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(root / "bad_back"));
  fs::remove_all(root / "bad_td");
  ok("ucp-load -q --input hf --format hf --output hfc");
  ok("ucp-diff -q hf hfc");
  ok("ucp-diff -q hf a/back");
  for (const auto& e : fs::directory_iterator(root)) EXPECT_NE(e.path().filename().string()[0], '.') << e.path() << " left";
  for (const auto& e : fs::directory_iterator(root / "a")) EXPECT_NE(e.path().filename().string()[0], '.') << e.path() << " left";
}

// ucp-load --to-names megatron-deepspeed (docs/hf.md "Megatron-DeepSpeed output"): one command writes what the two
// steps write (ucp-union --to-names megatron-deepspeed, then ucp-load of its folder: equal for ucp-diff; exported
// back, equal to the Hugging Face folder) and leaves no scratch folder; the options it does not go with are usage
// errors.
TEST(HfUnion, UcpLoadToMegatronDeepSpeedNamesWritesWhatTheTwoStepsWrite) {
  const fs::path root = with_hf_folder("hf_to_mds");
  const auto run = tools_in(root);
  ASSERT_EQ(run("ucp-union -q --input hf --to-names megatron-deepspeed --output u").rc, 0);
  ASSERT_EQ(run("ucp-load -q --input u --dp 2 --output two").rc, 0);
  auto r = run("ucp-load --input hf --to-names megatron-deepspeed --dp 2 --output one");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("fresh Megatron-DeepSpeed run"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(root / "one/global_step0/layer_01-model_00-model_states.pt"));
  EXPECT_EQ(run("ucp-diff -q one two").rc, 0);
  ASSERT_EQ(run("ucp-load -q --input one --format hf --output back").rc, 0);
  EXPECT_EQ(run("ucp-diff -q back hf").rc, 0);
  // ucp-diff reads the Megatron-DeepSpeed side in Megatron-Core names, as the Hugging Face side's import holds them:
  // equal, and it says what it left out.
  r = run("ucp-diff hf one");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("param_groups (Megatron-DeepSpeed's against Megatron-Core's)"), std::string::npos) << r.out;
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().find(".ucp-"), std::string::npos) << e.path();
  // Not with another format, not with --audit or --param-group; the engine form stays the default.
  for (const char* bad : {"--format torch_dist --to-names megatron-deepspeed --dp 1",
                          "--to-names megatron-deepspeed --dp 1 --audit a.json",
                          "--to-names megatron-deepspeed --dp 1 --param-group '{\"lr\": 0.1}'"}) {
    r = run(std::string("ucp-load -q --input hf --output bad ") + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.err;
    EXPECT_FALSE(fs::exists(root / "bad")) << bad;
  }
  r = run("ucp-load -q --input u --to-names megatron-deepspeed --dp 1 --output bad");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("applies to a Hugging Face input"), std::string::npos) << r.err;
}

// An import into torch_dist is for a job of either Megatron layer spec: an MoE layer's pre-MLP norm is stored under
// the local spec's key and the Transformer Engine spec's (Megatron's default), formats/megatron_core/writer.h. Read
// back it is one parameter (ucp-info, ucp-diff, the export); a file whose two copies differ is refused.
TEST(HfUnion, AnMoeImportHoldsThePreMlpNormUnderBothLayerSpecsKeys) {
  const fs::path root = with_mixtral_folder("hf_moe_norm_keys");
  const auto run = tools_in(root);
  auto r = run("ucp-load -q --input hf --format torch_dist --ep 2 --dp 2 --output td");
  ASSERT_EQ(r.rc, 0) << r.err;
  const fs::path iter = root / "td/release";
  {
    formats::dcp::Reader dcp(iter.string());
    for (const char* k : {"decoder.layers.mlp.linear_fc1.layer_norm_weight", "decoder.layers.pre_mlp_layernorm.weight",
                          "optimizer.state.exp_avg.decoder.layers.pre_mlp_layernorm.weight"})
      EXPECT_NE(dcp.metadata().find(k), nullptr) << k;
  }
  r = run("ucp-info --json td");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.find("pre_mlp_layernorm"), std::string::npos) << "a parameter of its own";
  EXPECT_EQ(run("ucp-diff -q hf td").rc, 0);
  ASSERT_EQ(run("ucp-load -q --input td --format hf --output back").rc, 0);
  EXPECT_EQ(run("ucp-diff -q hf back").rc, 0);
  // Resharded, the output holds both keys again (its args still name no spec), once each.
  ASSERT_EQ(run("ucp-load -q --input td --format torch_dist --ep 1 --dp 1 --output td1").rc, 0);
  EXPECT_NE(formats::dcp::Reader((root / "td1/release").string()).metadata().find("decoder.layers.pre_mlp_layernorm.weight"), nullptr);

  // Layer 0's and layer 1's copies under the Transformer Engine key swapped (same sizes, other values).
  fs::copy(root / "td", root / "bad", fs::copy_options::recursive);
  std::vector<formats::dcp::Item> items;
  const formats::dcp::Reader bad((root / "bad/release").string());
  for (const auto& it : bad.metadata().items)
    if (it.fqn == "decoder.layers.pre_mlp_layernorm.weight") items.push_back(it);
  ASSERT_EQ(items.size(), 2u);
  ASSERT_EQ(items[0].storage.length, items[1].storage.length);
  ASSERT_EQ(items[0].storage.relative_path, items[1].storage.relative_path);
  const fs::path data = root / "bad/release" / items[0].storage.relative_path;
  std::string bytes = file_text(data);
  std::string a = bytes.substr(items[0].storage.offset, items[0].storage.length);
  std::string b = bytes.substr(items[1].storage.offset, items[1].storage.length);
  ASSERT_NE(a, b);
  // The zips differ only in their stored values (the same record names and sizes).
  bytes.replace(items[0].storage.offset, a.size(), b);
  bytes.replace(items[1].storage.offset, b.size(), a);
  put(data, bytes);
  r = run("ucp-info bad");
  EXPECT_NE(r.rc, 0);
  r = run("ucp-load -q --input bad --format hf --output bad_back");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("decoder.layers.0.pre_mlp_layernorm.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("differs from"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(root / "bad_back"));
}

// What ucp-load can refuse from its command line comes before the folder is converted: no conversion warning, nothing
// beside the output.
TEST(HfUnion, UcpLoadRefusesTheOutputAndTheEngineFormsLayoutBeforeConverting) {
  const fs::path root = with_mixtral_folder("hf_refuse_first");
  const auto run = tools_in(root);
  auto r = run("ucp-load --input hf --format dcp --world-size 2 --output missing/out");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("output parent folder does not exist"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("converted"), std::string::npos) << r.err;
  fs::create_directories(root / "taken");
  put(root / "taken/notes.txt", "mine");
  r = run("ucp-load --input hf --format dcp --world-size 2 --output taken");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("output already exists"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("converted"), std::string::npos) << r.err;
  r = run("ucp-load --input hf --dp 2 --ep 2 --output engine");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--ep 2: the DeepSpeed engine around a transformers model"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("converted"), std::string::npos) << r.err;
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().find(".ucp-"), std::string::npos) << e.path();
  EXPECT_FALSE(fs::exists(root / "engine"));
}

// A universal folder whose MoE norms have the Transformer Engine spec's names (as a TE run's union has them, here
// its manifest renamed): ucp-diff pairs each with the local spec's name on the other side and says so; ucp-load
// writes it under both keys too, as it writes an import.
TEST(HfUnion, TheTwoLayerSpecsNamesOfAnMoeNormAreOneParameter) {
  const fs::path root = with_mixtral_folder("hf_moe_norm_names");
  const auto run = tools_in(root);
  ASSERT_EQ(run("ucp-union -q --input hf --output u").rc, 0);
  fs::copy(root / "u", root / "u_te", fs::copy_options::recursive);
  nlohmann::json m = nlohmann::json::parse(file_text(root / "u_te/manifest.json"));
  int renamed = 0;
  for (auto& e : m["params"]) {
    std::string n = e["name"];
    if (const size_t at = n.find("mlp.linear_fc1.layer_norm_weight"); at != std::string::npos) {
      e["name"] = n.substr(0, at) + "pre_mlp_layernorm.weight";
      ++renamed;
    }
  }
  ASSERT_EQ(renamed, 2);
  put(root / "u_te/manifest.json", m.dump(1));
  auto r = run("ucp-diff u u_te");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("the names of 2 MoE pre-MLP norms"), std::string::npos) << r.out;
  r = run("ucp-diff u_te u");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  ASSERT_EQ(run("ucp-load -q --input u_te --format torch_dist --dp 1 --output td").rc, 0);
  const formats::dcp::Reader td((root / "td/release").string());
  for (const char* k : {"decoder.layers.mlp.linear_fc1.layer_norm_weight", "decoder.layers.pre_mlp_layernorm.weight"})
    EXPECT_NE(td.metadata().find(k), nullptr) << k;
  EXPECT_EQ(run("ucp-diff -q hf td").rc, 0);
}

}  // namespace hf_union_test
