// A new input format costs its own code plus its registrations (issue 46): a toy format, registered
// from this file only (detection, ucp-union's plan through the one union executor, ucp-info's
// describer), is read by ucp-union, ucp-info and ucp-load with nothing in lib/ naming it. ucp-load
// reaches it through its union (a scratch universal folder) as it does DCP and torch_dist.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "formats/detect.h"
#include "formats/universal/state_file.h"
#include "inspect/info.h"
#include "io/torch/torch_file.h"
#include "parallel/mpi_session.h"
#include "support/process.h"
#include "to_universal/union_executor.h"
#include "tool/ucp_convert.h"
#include "tool/ucp_inspect.h"
#include "tool/ucp_load.h"

namespace toy_format_test {

namespace fs = std::filesystem;
using namespace ucpkit;

namespace {

// The toy checkpoint: a marker file and `weights.f32`, the raw float32 values of one 2 x 3 parameter.
constexpr const char* kMarker = "TOY_CHECKPOINT";
const std::vector<float> kValues = {1.5f, -2.25f, 3.0f, 0.125f, -7.0f, 42.0f};

std::vector<float> read_values(const std::string& dir) {
  std::vector<float> v(kValues.size());
  std::ifstream(fs::path(dir) / "weights.f32", std::ios::binary).read(reinterpret_cast<char*>(v.data()), v.size() * 4);
  return v;
}

to_universal::RunSummary toy_union(const std::string& input, const std::string& output, const to_universal::ConvertOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  parallel::RankFailure failed(parallel::MpiSession::get());
  Reporter::Phase phase(options.reporter, "plan");
  to_universal::UnionJob job;
  job.params = 1;
  job.bytes = [](size_t) { return uint64_t(kValues.size() * 4); };
  job.write_param = [&](size_t, const fs::path& zero_dir) {
    to_universal::ParamResult r;
    fs::create_directories(zero_dir / "toy.weight");
    formats::universal::StateFile f;
    f.param = Tensor::from_vector(DType::Float32, {2, 3}, read_values(input));
    const std::string path = (zero_dir / "toy.weight" / "fp32.pt").string();
    save_torch_file(path, formats::universal::to_pickle(f));
    auto& e = r.manifest;
    e.name = "toy.weight";
    e.shape = {2, 3};
    e.dtype = "float32";
    e.tp_shapes = std::vector<std::vector<int64_t>>{{2, 3}};
    e.states["fp32"] = {"zero/toy.weight/fp32.pt", to_universal::written_crc32(path, f.param)};
    r.bytes_read = kValues.size() * 4;
    r.files = 1;
    return r;
  };
  job.write_common = [](const fs::path& staged, formats::universal::UniversalManifest& manifest, to_universal::CommonFiles& t) {
    auto root = pickle::Value::dict();
    root->set_item("param_groups", pickle::Value::list({}));
    save_torch_file((staged / formats::universal::kUniversalOptimizerState).string(), root);
    ++t.files;
    manifest.source.format = "toy";
    manifest.patterns_origin = "none (toy)";
    manifest.patterns_set = nlohmann::json::object();
  };
  return to_universal::execute_union(job, output, options, failed, phase, t0);
}

// The three registrations a new format makes (here from a test file, as a plug-in would).
[[maybe_unused]] const bool kRegistered =
    formats::register_folder_format({"toy", 45, std::string(kMarker) + " (toy format)",
                                     [](const std::string& dir) -> std::optional<std::string> {
                                       if (!fs::exists(fs::path(dir) / kMarker)) return std::nullopt;
                                       return std::string();
                                     },
                                     formats::entry_names({kMarker, "weights.f32"})}) &&
    to_universal::register_union("toy", toy_union) &&
    inspect::register_describer("toy", [](inspect::CheckpointInfo& info, const inspect::InfoOptions&) {
      info.dir = info.input;
      info.checks.push_back({"files", "the toy's weights", inspect::Check::Status::ok, ""});
    });

std::string toy_checkpoint(const std::string& name) {
  const fs::path d = fs::path(ucpkit::testing::scratch_dir(name)) / "toy";
  fs::create_directories(d);
  std::ofstream(d / kMarker) << "";
  std::ofstream(d / "weights.f32", std::ios::binary).write(reinterpret_cast<const char*>(kValues.data()), kValues.size() * 4);
  return d.string();
}

// The one tensor of a safetensors file, as float32 values.
std::vector<float> safetensors_values(const fs::path& file, const std::string& name) {
  std::ifstream in(file, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const auto j = nlohmann::json::parse(header).at(name);
  EXPECT_EQ(j.at("dtype"), "F32");
  const auto offsets = j.at("data_offsets");
  std::vector<float> v((offsets[1].get<uint64_t>() - offsets[0].get<uint64_t>()) / 4);
  in.seekg(static_cast<std::streamoff>(8 + n + offsets[0].get<uint64_t>()));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

}  // namespace

TEST(ToyFormat, UcpUnionReadsIt) {
  const std::string in = toy_checkpoint("toy_union");
  tool::UcpConvertOptions o;
  o.input = in;
  o.output = (fs::path(in).parent_path() / "u").string();
  o.convert.sync = false;
  const tool::Result r = tool::run_ucp_union(o);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(formats::is_kind(o.output, formats::kUniversal));
  const auto manifest = nlohmann::json::parse(std::ifstream(fs::path(o.output) / "manifest.json"));
  EXPECT_EQ(manifest["source"]["format"], "toy");
  ASSERT_EQ(manifest["params"].size(), 1u);
  EXPECT_EQ(manifest["params"][0]["name"], "toy.weight");
}

TEST(ToyFormat, UcpInfoDescribesIt) {
  tool::UcpInfoOptions o;
  o.input = toy_checkpoint("toy_info");
  const tool::Result r = tool::run_ucp_info(o);
  EXPECT_FALSE(r.failure);
  EXPECT_EQ(r.fields["kind"], "toy");
}

TEST(ToyFormat, UcpLoadWritesItsValues) {
  const std::string in = toy_checkpoint("toy_load");
  tool::UcpLoadOptions o;
  o.load.input = in;
  o.load.output = (fs::path(in).parent_path() / "st").string();
  o.format = "safetensors";
  o.given = {false, false, false, false, false, false};  // no layout option nor --dtype given: the source's
  o.check();
  const tool::Result r = tool::run_ucp_load(o);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(safetensors_values(fs::path(o.load.output) / "model.safetensors", "toy.weight"), kValues);
  // The scratch universal folder is gone.
  for (const auto& e : fs::directory_iterator(fs::path(in).parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".ucp-load-universal-"), std::string::npos) << e.path();
}

}  // namespace toy_format_test
