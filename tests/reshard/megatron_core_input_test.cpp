// lib/reshard/megatron_core_input: the Megatron-Core-named input of --format torch_dist and hf. Read
// forward from the GPT fixture's DeepSpeed source and from its universal folder (the Megatron-Core view in
// one pass), and from a Megatron-Core-named universal folder made here by ucp-union --to-names
// megatron-core; values against dsgen's ground truth (Megatron's padded vocabulary rows added as zeros),
// and each refusal with the file and the cause named.
#include <gtest/gtest.h>

#include <functional>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "reshard/megatron_core_input.h"
#include "reshard/universal_fixture.h"
#include "support/errors.h"
#include "support/process.h"

namespace megatron_core_input_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

namespace {

std::string native() { return loadtest::gpt_case().src.string(); }

const std::string& mc_named() { return loadtest::gpt_megatron_core_named(); }
std::string mc_copy(const std::string& name) { return loadtest::gpt_megatron_core_named_copy(name); }

LoadOptions options_for(const std::string& input, std::vector<std::string>* warnings = nullptr) {
  LoadOptions o;
  o.input = input;
  o.format = OutputFormat::TorchDist;
  if (warnings) o.reporter.warn = [warnings](const std::string& w) { warnings->push_back(w); };
  return o;
}

std::vector<float> truth(const std::string& name, const std::string& state) {
  auto root = load_torch((loadtest::gpt_case().truth / "universal" / "zero" / name / (state + ".pt")).string());
  return root->at("param")->as_tensor().contiguous().to_vector<float>();
}

size_t index_of(const MegatronCoreInput& in, const std::string& name) {
  for (size_t i = 0; i < in.manifest.params.size(); ++i)
    if (in.manifest.params[i].name == name) return i;
  ADD_FAILURE() << "no parameter " << name;
  return 0;
}

std::vector<float> value_of(const MegatronCoreInput& in, const std::string& name, const std::string& state,
                            uint64_t* read = nullptr) {
  uint64_t r = 0;
  const Tensor t = in.value(index_of(in, name), state, true, r);
  if (read) *read = r;
  EXPECT_EQ(t.dtype(), DType::Float32);
  return t.contiguous().to_vector<float>();
}

// The truth's word embeddings (100 rows of 32) with Megatron's padding to 104 rows: zeros.
std::vector<float> padded_word_embeddings(const std::string& state) {
  std::vector<float> v = truth("language_model.embedding.word_embeddings.weight", state);
  v.resize(104 * 32, 0.0f);
  return v;
}

std::string error_of(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

}  // namespace

TEST(MegatronCoreInput, NativeSourceIsReadForwardInMegatronCoreNames) {
  std::vector<std::string> warnings;
  const MegatronCoreInput in = open_megatron_core_input(options_for(native(), &warnings), "torch_dist");
  ASSERT_TRUE(in.forward);
  EXPECT_NE(in.family.find("gpt"), std::string::npos) << in.family;
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("Megatron-DeepSpeed names written as Megatron-Core's (model family gpt"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(in.common_path.find("made from its model file"), std::string::npos);
  ASSERT_TRUE(in.common && in.common->is(pickle::Kind::Dict));
  EXPECT_TRUE(in.common->get("args"));
  EXPECT_EQ(in.manifest.params[0].name, "embedding.word_embeddings.weight");
  EXPECT_EQ(in.manifest.params[0].shape, (std::vector<int64_t>{104, 32}));
  EXPECT_EQ(in.model_dtype(), DType::BFloat16);  // dsgen's layout: bf16
  EXPECT_EQ(in.rows_added(index_of(in, "embedding.word_embeddings.weight")), 4);
  EXPECT_EQ(in.rows_added(index_of(in, "embedding.position_embeddings.weight")), 0);
}

TEST(MegatronCoreInput, ForwardValuesAreTheTruthWithPaddedRowsAdded) {
  for (const std::string& input : {native(), loadtest::gpt_case().universal.string()}) {
    SCOPED_TRACE(input);
    const MegatronCoreInput in = open_megatron_core_input(options_for(input), "torch_dist");
    ASSERT_TRUE(in.forward);
    uint64_t read = 0;
    EXPECT_EQ(value_of(in, "embedding.word_embeddings.weight", "exp_avg", &read), padded_word_embeddings("exp_avg"));
    EXPECT_EQ(read, 100u * 32 * 4);  // the source's rows only
    EXPECT_EQ(value_of(in, "embedding.position_embeddings.weight", "fp32"),
              truth("language_model.embedding.position_embeddings.weight", "fp32"));
    EXPECT_EQ(value_of(in, "decoder.layers.2.self_attention.linear_proj.weight", "exp_avg_sq"),
              truth("language_model.encoder.layers.2.self_attention.dense.weight", "exp_avg_sq"));
  }
}

TEST(MegatronCoreInput, MegatronCoreNamedFolderIsReadAsItIs) {
  std::vector<std::string> warnings;
  const MegatronCoreInput in = open_megatron_core_input(options_for(mc_named(), &warnings), "torch_dist");
  EXPECT_FALSE(in.forward);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(in.common_path, (fs::path(mc_named()) / kMegatronCoreCommonStateFile).string());
  ASSERT_TRUE(in.common && in.common->is(pickle::Kind::Dict));
  EXPECT_TRUE(in.objects && in.objects->is(pickle::Kind::Dict));
  EXPECT_EQ(in.model_dtype(), DType::BFloat16);
  EXPECT_EQ(in.rows_added(0), 0);  // every row is the folder's own
  EXPECT_EQ(value_of(in, "embedding.word_embeddings.weight", "fp32"), padded_word_embeddings("fp32"));
  EXPECT_EQ(value_of(in, "decoder.layers.1.self_attention.linear_proj.weight", "exp_avg"),
            truth("language_model.encoder.layers.1.self_attention.dense.weight", "exp_avg"));
}

TEST(MegatronCoreInput, AStateTheManifestDoesNotListIsRefused) {
  const MegatronCoreInput in = open_megatron_core_input(options_for(mc_named()), "torch_dist");
  uint64_t read = 0;
  const std::string msg = error_of([&] { in.value(0, "momentum", true, read); });
  EXPECT_NE(msg.find("parameter embedding.word_embeddings.weight has no momentum state"), std::string::npos) << msg;
}

TEST(MegatronCoreInput, AChecksumMismatchIsRefusedOnlyWhenVerifying) {
  const std::string dir = mc_copy("crc");
  nlohmann::json m;
  std::ifstream(dir + "/manifest.json") >> m;
  m["params"][1]["states"]["fp32"]["crc32"] = "00000000";
  std::ofstream(dir + "/manifest.json") << m.dump(1);
  const MegatronCoreInput in = open_megatron_core_input(options_for(dir), "torch_dist");
  uint64_t read = 0;
  const std::string msg = error_of([&] { in.value(1, "fp32", true, read); });
  EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("records 00000000"), std::string::npos) << msg;
  EXPECT_NO_THROW(in.value(1, "fp32", false, read));
}

TEST(MegatronCoreInput, MissingCommonStateIsRefusedNamingIt) {
  const std::string dir = mc_copy("no_common");
  fs::remove(fs::path(dir) / kMegatronCoreCommonStateFile);
  const std::string msg = error_of([&] { open_megatron_core_input(options_for(dir), "hf"); });
  EXPECT_NE(msg.find("common_state.pt: missing: --format hf needs the Megatron-Core common state"), std::string::npos)
      << msg;
}

TEST(MegatronCoreInput, ModelMapOnAMegatronCoreNamedFolderIsAUsageError) {
  LoadOptions o = options_for(mc_named());
  o.model_map = "map.json";
  EXPECT_THROW(open_megatron_core_input(o, "torch_dist"), UsageError);
  EXPECT_NE(error_of([&] { open_megatron_core_input(o, "torch_dist"); }).find("read in Megatron-Core names as it is"),
            std::string::npos);
}

TEST(MegatronCoreInput, NoFolderIsRefused) {
  const std::string missing = ucpkit::testing::scratch_dir("megatron_core_input_none") + "/absent";
  std::string msg = error_of([&] { open_megatron_core_input(options_for(missing), "torch_dist"); });
  EXPECT_NE(msg.find(missing + ": no such folder (--format torch_dist reads"), std::string::npos) << msg;
  const std::string file = mc_named() + "/manifest.json";
  msg = error_of([&] { open_megatron_core_input(options_for(file), "hf"); });
  EXPECT_NE(msg.find(file + ": not a folder (--format hf"), std::string::npos) << msg;
}

}  // namespace megatron_core_input_test
