// formats/universal/manifest: the universal checkpoint's manifest.json as one struct. The fixtures in
// tests/formats/universal/data/ are manifests that ucp-union wrote before the struct existed (main at e20e28a,
// on tests/reshard/fixtures.py, tests/autoep/fixtures.py and tests/generator/gen_ds_checkpoint.py --model dsmoe
// checkpoints; see data/README.md): reading and writing them back must give the same bytes, and
// every typed field must be the one in the raw JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "formats/universal/manifest.h"
#include "support/process.h"
#include "support/errors.h"
#include "support/files.h"

namespace universal_manifest_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace ucpkit;
using namespace ucpkit::formats::universal;

using ucpkit::testing::file_bytes;

namespace {

const fs::path kData = fs::path(UCPKIT_SOURCE_DIR) / "tests" / "formats" / "universal" / "data";

std::vector<fs::path> fixture_manifests() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(kData))
    if (e.path().extension() == ".json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The message of the Error that from_json throws on `j` (empty when it throws none).
std::string error_of(const json& j, const std::string& file = "/ckpt/u/manifest.json") {
  return ucpkit::testing::error_of([&] { (void)UniversalManifest::from_json(j, file); });
}

json fixture(const std::string& name) { return json::parse(file_bytes(kData / name)); }

}  // namespace

TEST(UniversalManifest, FixturesCoverEveryEntryKind) {
  // The fixtures hold every optional key ucp-union writes, so the byte-exact test below covers them.
  std::set<std::string> keys;
  bool crc = false;
  for (const auto& path : fixture_manifests()) {
    const json j = json::parse(file_bytes(path));
    for (const auto& p : j["params"]) {
      for (const auto& [k, v] : p.items()) keys.insert(k);
      for (const auto& [s, v] : p["states"].items()) crc = crc || v.contains("crc32");
    }
  }
  for (const char* k : {"name", "shape", "dtype", "join", "tp_shapes", "pp_stage", "states", "step", "patterns", "cat_dim",
                        "vocab_tensor", "flat", "expert", "autoep"})
    EXPECT_TRUE(keys.count(k)) << k;
  EXPECT_TRUE(crc);
  EXPECT_GE(fixture_manifests().size(), 4u);
}

TEST(UniversalManifest, ToJsonWritesTheBytesUcpUnionWrote) {
  for (const auto& path : fixture_manifests()) {
    SCOPED_TRACE(path.filename().string());
    const std::string text = file_bytes(path);
    const UniversalManifest m = read_universal_manifest(path.string());
    EXPECT_EQ(m.text(), text);
    // And once more through the struct (write, read, write).
    EXPECT_EQ(UniversalManifest::from_json(m.to_json(), path.string()).text(), text);
  }
}

TEST(UniversalManifest, TypedFieldsAreTheRawJson) {
  for (const auto& path : fixture_manifests()) {
    SCOPED_TRACE(path.filename().string());
    const json j = json::parse(file_bytes(path));
    const UniversalManifest m = UniversalManifest::from_json(j, path.string());
    EXPECT_EQ(m.version, j["version"].get<int64_t>());
    EXPECT_EQ(m.source.to_json(), j["source"]);
    EXPECT_EQ(m.patterns_origin, j["patterns"]["origin"].get<std::string>());
    EXPECT_EQ(m.patterns_set, j["patterns"]["set"]);
    EXPECT_EQ(m.model_files, j["model_files"].get<std::vector<std::string>>());
    EXPECT_EQ(m.optimizer_state, j["optimizer_state"].get<std::string>());
    ASSERT_EQ(m.params.size(), j["params"].size());
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& p = m.params[i];
      const json& e = j["params"][i];
      EXPECT_EQ(p.name, e["name"].get<std::string>());
      EXPECT_EQ(p.shape, e["shape"].get<std::vector<int64_t>>());
      EXPECT_EQ(p.step, e["step"].get<bool>());
      EXPECT_EQ(p.flat, e.value("flat", false));
      EXPECT_EQ(p.vocab_tensor, e.value("vocab_tensor", false));
      EXPECT_EQ(p.cat_dim.has_value(), e.contains("cat_dim"));
      if (p.cat_dim) EXPECT_EQ(*p.cat_dim, e["cat_dim"].get<int64_t>());
      ASSERT_EQ(p.expert.has_value(), e.contains("expert"));
      if (p.expert) {
        EXPECT_EQ(p.expert->layer, e["expert"]["layer"].get<int>());
        EXPECT_EQ(p.expert->global_id, e["expert"]["global_id"].get<int>());
      }
      ASSERT_EQ(p.autoep.has_value(), e.contains("autoep"));
      if (p.autoep) EXPECT_EQ(p.autoep->num_experts, e["autoep"]["num_experts"].get<int>());
      ASSERT_EQ(p.states.size(), e["states"].size());
      for (const auto& [state, s] : p.states) {
        EXPECT_EQ(s.file, e["states"][state]["file"].get<std::string>());
        ASSERT_TRUE(s.crc32);
        EXPECT_EQ(*s.crc32, std::stoul(e["states"][state]["crc32"].get<std::string>(), nullptr, 16));
      }
    }
    const UniversalSource& src = m.source;
    EXPECT_EQ(src.tp, j["source"]["tp"].get<int>());
    EXPECT_EQ(src.dp, j["source"]["dp"].get<int>());
    EXPECT_EQ(src.pipeline, j["source"]["pipeline"].get<bool>());
    EXPECT_EQ(src.tag, j["source"]["tag"].get<std::string>());
    EXPECT_EQ(src.autoep.is_null(), !j["source"].contains("autoep"));
  }
}

TEST(UniversalManifest, DirectModeEntryWritesOnlyWhatItHas) {
  // Direct mode builds entries without ucp-union's dtype, join, tp_shapes, pp_stage, patterns and
  // checksums: none of those keys appear, and a checksum is always eight hex digits.
  UniversalParam p;
  p.name = "w";
  p.shape = {4, 2};
  p.states["fp32"].file = "zero/w/fp32.pt";
  p.states["exp_avg"] = {"zero/w/exp_avg.pt", 0x1fu};
  const json j = p.to_json();
  EXPECT_EQ(j, json::parse(R"({"name": "w", "shape": [4, 2], "step": false,
      "states": {"fp32": {"file": "zero/w/fp32.pt"}, "exp_avg": {"file": "zero/w/exp_avg.pt", "crc32": "0000001f"}}})"));
  const UniversalParam back = UniversalParam::from_json(j, "m.json", "params[0]");
  EXPECT_EQ(back.to_json(), j);
  EXPECT_FALSE(back.states.at("fp32").crc32);
  EXPECT_EQ(back.states.at("exp_avg").crc32, 0x1fu);
}

TEST(UniversalManifest, BadKeysNameTheFileAndTheKeyInOneLine) {
  const json good = fixture("gpt_pipeline.json");
  ASSERT_EQ(error_of(good), "");
  struct Case {
    std::string what, key;
    std::function<void(json&)> change;
  };
  const std::vector<Case> cases = {
      {"crc32 a list", "params[0].states.fp32.crc32", [](json& m) { m["params"][0]["states"]["fp32"]["crc32"] = {1}; }},
      {"crc32 not hex", "params[1].states.exp_avg.crc32", [](json& m) { m["params"][1]["states"]["exp_avg"]["crc32"] = "12zz"; }},
      {"crc32 too long", "params[0].states.fp32.crc32", [](json& m) { m["params"][0]["states"]["fp32"]["crc32"] = "123456789"; }},
      {"shape a string", "params[2].shape", [](json& m) { m["params"][2]["shape"] = "4x4"; }},
      {"negative size", "params[2].shape[0]", [](json& m) { m["params"][2]["shape"][0] = -4; }},
      {"no shape", "params[2].shape", [](json& m) { m["params"][2].erase("shape"); }},
      {"state without file", "params[0].states.fp32.file", [](json& m) { m["params"][0]["states"]["fp32"].erase("file"); }},
      {"step a string", "params[0].step", [](json& m) { m["params"][0]["step"] = "yes"; }},
      {"null entry", "params[3]", [](json& m) { m["params"][3] = nullptr; }},
      {"expert layer", "params[0].expert.layer", [](json& m) { m["params"][0]["expert"] = {{"layer", "a"}, {"global_id", 0}}; }},
      {"autoep", "params[0].autoep", [](json& m) { m["params"][0]["autoep"] = {{"moe_layer_id", 0}}; }},
      {"params not a list", "params", [](json& m) { m["params"] = json::object(); }},
      {"model_files", "model_files[1]", [](json& m) { m["model_files"][1] = 7; }},
      {"no source", "source", [](json& m) { m.erase("source"); }},
      {"tp a string", "source.tp", [](json& m) { m["source"]["tp"] = "2"; }},
      {"tp zero", "source.tp", [](json& m) { m["source"]["tp"] = 0; }},
      {"pipeline", "source.pipeline", [](json& m) { m["source"]["pipeline"] = 1; }},
      {"num_experts", "source.num_experts[0]", [](json& m) { m["source"]["num_experts"] = {"four"}; }},
      {"layer_keys index", "source.layer_keys", [](json& m) { m["source"]["layer_keys"] = {{"x1", json::array()}}; }},
      {"layer_keys list", "source.layer_keys.3", [](json& m) { m["source"]["layer_keys"] = {{"3", "abc"}}; }},
      {"patterns.set", "patterns.set", [](json& m) { m["patterns"].erase("set"); }},
      {"version", "version", [](json& m) { m["version"] = "1"; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    json bad = good;
    c.change(bad);
    const std::string msg = error_of(bad);
    EXPECT_EQ(msg.rfind("/ckpt/u/manifest.json: malformed: " + c.key, 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 200u) << msg;
  }
  for (const json& other : {json::array(), json{{"format", "ucpkit-pec-manifest/1"}}, json{{"params", json::array()}}})
    EXPECT_EQ(error_of(other), "/ckpt/u/manifest.json: not a ucpkit universal manifest");
}

// Buffers (issue 47): listed under "buffers" only when there are any (a folder without keeps the bytes
// above), each with its own dtype, read back field for field; a malformed one names its key.
TEST(UniversalManifest, BuffersRoundTripAndAreWrittenOnlyWhenPresent) {
  UniversalManifest m = UniversalManifest::from_json(fixture("gpt_pipeline.json"), "m.json");
  EXPECT_FALSE(m.to_json().contains("buffers"));
  m.buffers.push_back({"norm.num_batches_tracked", {}, "int64", {"zero/norm.num_batches_tracked/fp32.pt", 0x0badf00du}});
  m.buffers.push_back({"mask", {16}, "bool", {"zero/mask/fp32.pt", 7u}});
  const json j = m.to_json();
  ASSERT_EQ(j["buffers"].size(), 2u);
  EXPECT_EQ(j["buffers"][0], json::parse(R"({"name": "norm.num_batches_tracked", "shape": [], "dtype": "int64",
                                             "tensor": {"file": "zero/norm.num_batches_tracked/fp32.pt", "crc32": "0badf00d"}})"));
  const UniversalManifest back = UniversalManifest::from_json(j, "m.json");
  ASSERT_EQ(back.buffers.size(), 2u);
  EXPECT_EQ(back.buffers[1].name, "mask");
  EXPECT_EQ(back.buffers[1].shape, std::vector<int64_t>{16});
  EXPECT_EQ(back.buffers[1].dtype, "bool");
  EXPECT_EQ(back.buffers[1].tensor.crc32, 7u);
  EXPECT_EQ(back.text(), m.text());
  EXPECT_EQ(describe_buffers(back.buffers), "2 buffers ('norm.num_batches_tracked', 'mask')");
  EXPECT_EQ(describe_buffers(back.buffers, 1), "2 buffers ('norm.num_batches_tracked', ...)");
  for (const auto& [key, change] : std::vector<std::pair<std::string, std::function<void(json&)>>>{
           {"buffers", [](json& x) { x["buffers"] = json::object(); }},
           {"buffers[1].dtype", [](json& x) { x["buffers"][1].erase("dtype"); }},
           {"buffers[0].shape", [](json& x) { x["buffers"][0]["shape"] = "16"; }},
           {"buffers[0].tensor.crc32", [](json& x) { x["buffers"][0]["tensor"]["crc32"] = "xyz"; }}}) {
    json bad = j;
    change(bad);
    const std::string msg = error_of(bad);
    EXPECT_EQ(msg.rfind("/ckpt/u/manifest.json: malformed: " + key, 0), 0u) << msg;
  }
}

// A DCP's bytes entries and 16-bit float states (issue 47): "items" and a state's "source_dtype" are
// written only when present (every other folder keeps its bytes), read back field for field (a path's
// ints stay ints); a malformed one names its key.
TEST(UniversalManifest, ItemsAndSourceDtypesRoundTripAndAreWrittenOnlyWhenPresent) {
  UniversalManifest m = UniversalManifest::from_json(fixture("gpt_pipeline.json"), "m.json");
  const std::string before = m.text();
  EXPECT_FALSE(m.to_json().contains("items"));
  EXPECT_EQ(before.find("source_dtype"), std::string::npos);
  m.items.push_back({"lr_scheduler.last_epoch", json::array({"lr_scheduler", "last_epoch"}), {"items/0.pt", 0x12u}});
  m.items.push_back({"optim.param_groups.0.lr", json::array({"optim", "param_groups", 0, "lr"}), {"items/1.pt", 0x34u}});
  m.params[0].states.begin()->second.source_dtype = "bfloat16";
  const json j = m.to_json();
  ASSERT_EQ(j["items"].size(), 2u);
  EXPECT_EQ(j["items"][1], json::parse(R"({"key": "optim.param_groups.0.lr", "path": ["optim", "param_groups", 0, "lr"],
                                           "file": {"file": "items/1.pt", "crc32": "00000034"}})"));
  EXPECT_EQ(j["params"][0]["states"].begin().value()["source_dtype"], "bfloat16");
  const UniversalManifest back = UniversalManifest::from_json(j, "m.json");
  ASSERT_EQ(back.items.size(), 2u);
  EXPECT_EQ(back.items[0].key, "lr_scheduler.last_epoch");
  EXPECT_EQ(back.items[1].path[2], 0);
  EXPECT_EQ(back.items[1].file.crc32, 0x34u);
  EXPECT_EQ(back.params[0].states.begin()->second.source_dtype, "bfloat16");
  EXPECT_EQ(back.text(), m.text());
  for (const auto& [key, change] : std::vector<std::pair<std::string, std::function<void(json&)>>>{
           {"items", [](json& x) { x["items"] = json::object(); }},
           {"items[0].key", [](json& x) { x["items"][0].erase("key"); }},
           {"items[1].path", [](json& x) { x["items"][1]["path"] = json::array({"a", 1.5}); }},
           {"items[1].path", [](json& x) { x["items"][1]["path"] = json::array(); }},
           {"items[0].file.crc32", [](json& x) { x["items"][0]["file"]["crc32"] = "xyz"; }}}) {
    json bad = j;
    change(bad);
    const std::string msg = error_of(bad);
    EXPECT_EQ(msg.rfind("/ckpt/u/manifest.json: malformed: " + key, 0), 0u) << msg;
  }
}

TEST(UniversalManifest, ReadingNamesTheFile) {
  const fs::path d = ucpkit::testing::scratch_dir("universal_manifest_read");
  try {
    (void)read_universal_manifest((d / "missing.json").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (d / "missing.json").string() + ": cannot read (incomplete universal checkpoint?)");
  }
  std::ofstream(d / "cut.json") << file_bytes(kData / "gpt_pipeline.json").substr(0, 300);
  try {
    (void)read_universal_manifest((d / "cut.json").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind((d / "cut.json").string() + ": corrupt JSON: ", 0), 0u) << e.what();
  }
}

// The source description is one struct with one binder (issue 46): what each input format records
// comes back from to_json as it was read (the keys it has, no others), a key the struct does not model
// (a format's own facts) is kept as read, and a key of another type is named.
TEST(UniversalSource, EachFormatsDescriptionRoundTripsKeyForKey) {
  const std::vector<json> written = {
      json::parse(R"({"dir": "/c/global_step5", "tag": "global_step5", "tp": 2, "pp": 2, "dp": 2, "zero_stage": 1,
                      "ep": 1, "pipeline": true, "bf16": false, "data_before_expert": false, "num_experts": [],
                      "expert_files": 0, "pipeline_numbering": {"first_block": 2}, "layer_keys": {"3": ["a", "b"]},
                      "layer_model_axis": false})"),
      json::parse(R"({"dir": "/c/global_step5", "tag": "global_step5", "tp": 1, "pp": 1, "dp": 4, "ep": 2,
                      "zero_stage": 3, "pipeline": false, "bf16": true, "sub_groups": 3, "autoep": [{"layer": 1}]})"),
      json::parse(R"({"format": "dcp", "dcp": {"folder": "global", "era": "2.6", "world_size": 4}})"),
      json::parse(R"({"format": "torch_dist", "tp": 2, "pp": 1, "dp": 2, "ep": 1, "torch_dist": {"etp": 1}})"),
      json::parse(R"({"tp": 1, "names": "megatron-core", "megatron_core_names": {"map": {}}})"),
      json::parse(R"({"tp": 1, "zero_stage": null})"),  // an older release's BF16_Optimizer source
      // a Hugging Face model: weights without a training run (a torch_dist output is a release folder)
      json::parse(R"({"format": "hf", "tp": 1, "pp": 1, "dp": 1, "ep": 1, "weights_only": true, "hf": {"family": "llama"}})"),
  };
  for (const auto& j : written) {
    SCOPED_TRACE(j.dump());
    const UniversalSource s = UniversalSource::from_json(j, "m.json");
    EXPECT_EQ(s.to_json(), j);
    EXPECT_EQ(s.to_json().dump(), j.dump());
  }
  const UniversalSource dcp = UniversalSource::from_json(written[2], "m.json");
  EXPECT_EQ(dcp.format_name(), "dcp");
  EXPECT_EQ(dcp.tp_or_1(), 1);
  EXPECT_EQ(dcp.facts["dcp"]["world_size"], 4);
  EXPECT_EQ(UniversalSource::from_json(written[0], "m.json").format_name(), "deepspeed");
  EXPECT_TRUE(UniversalSource::from_json(written[1], "m.json").flat());
  EXPECT_FALSE(UniversalSource::from_json(written[0], "m.json").flat());
  EXPECT_EQ(UniversalSource::from_json(written.back(), "m.json").weights_only, true);
  EXPECT_FALSE(UniversalSource::from_json(written[3], "m.json").weights_only.has_value());
  for (const auto& [bad, key] : std::vector<std::pair<json, std::string>>{{{{"tp", "2"}}, "source.tp"},
                                                                           {{{"pipeline", 1}}, "source.pipeline"},
                                                                           {{{"num_experts", {1, "x"}}}, "source.num_experts[1]"},
                                                                           {{{"names", 3}}, "source.names"},
                                                                           {{{"weights_only", 1}}, "source.weights_only"}}) {
    try {
      (void)UniversalSource::from_json(bad, "m.json");
      ADD_FAILURE() << bad.dump() << " accepted";
    } catch (const ucpkit::Error& e) {
      EXPECT_NE(std::string(e.what()).find("m.json: malformed: " + key), std::string::npos) << e.what();
    }
  }
}

}  // namespace universal_manifest_test
