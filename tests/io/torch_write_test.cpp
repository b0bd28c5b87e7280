// Writing: C++ loads fixtures (or builds trees from scratch), saves them with save_torch_file, and
// Python's torch.load (Debian PyTorch, weights_only=False) must get back the same objects
// (tests/io/check_roundtrip.py compares against the JSON truth; its exit code decides).
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "core/atomic_file.h"
#include "core/crc32.h"
#include "core/mapped_file.h"
#include "io/zip/zip_reader.h"
#include "io/zip/zip_writer.h"
#include "support/process.h"
#include "truth_check.h"

namespace iotest {
namespace torch_write_test {
namespace {

using ucpkit::testing::quote;

std::string check_script() { return std::string(UCPKIT_SOURCE_DIR) + "/tests/io/check_roundtrip.py"; }

// Runs the Python check of `written` against `truth_path`; returns its exit code, output in `out`.
int python_check(const std::string& written, const std::string& truth_path, const std::string& prefix,
                 std::string* out) {
  std::string cmd = std::string(UCPKIT_PYTHON) + " " + quote(check_script()) + " " + quote(written) + " " +
                    quote(truth_path);
  if (!prefix.empty()) cmd += " --prefix " + quote(prefix);
  return ucpkit::testing::run_command(cmd, out);
}

// Counts zip records under <prefix>/data/.
size_t storage_records(const std::string& path) {
  ucpkit::ZipReader zip(ucpkit::MappedFile::open(path));
  size_t n = 0;
  for (const auto& [name, rec] : zip.records())
    if (name.find("/data/") != std::string::npos) ++n;
  return n;
}

// load fixture -> save -> (a) Python loads it and compares with the truth, (b) C++ reads it back.
void round_trip(const std::string& name, const std::string& prefix = "archive") {
  json truth = truth_of(name);
  std::string dir = ucpkit::testing::scratch_dir("roundtrip_" + name);
  std::string out = dir + "/" + name + ".pt";
  auto tf = ucpkit::load_torch_file(fixture(truth.at("file")));
  ucpkit::TorchSaveOptions opt;
  opt.archive_prefix = prefix;
  ucpkit::save_torch_file(out, tf.root, opt);
  ASSERT_TRUE(std::filesystem::exists(out));
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), name + ".pt") << "temporary file left behind";
  EXPECT_EQ(storage_records(out), truth.at("storages").size()) << "one record per distinct storage";

  std::string output;
  int rc = python_check(out, fixture(name + ".json"), prefix, &output);
  EXPECT_EQ(rc, 0) << name << ": Python torch.load of the written file differs:\n" << output;

  auto back = ucpkit::load_torch_file(out);
  EXPECT_EQ(back.archive_prefix, prefix);
  Checker c(truth.at("storages"));
  c.check(back.root, truth.at("value"), "$");
  EXPECT_TRUE(c.errors.empty()) << name << " read back by C++:\n" << c.report();
}

TEST(TorchSerialization, Basic) { round_trip("basic"); }
TEST(TorchSerialization, SingleItems) {
  round_trip("single_int");
  round_trip("single_list");
  round_trip("single_dict");
}
TEST(TorchSerialization, Tensors) { round_trip("tensors"); }
TEST(TorchSerialization, CheckpointObjects) { round_trip("objects"); }
TEST(TorchSerialization, EnumPy310) { round_trip("enum_py310"); }
TEST(TorchSerialization, EnumPy311) { round_trip("enum_py311"); }
TEST(TorchSerialization, MegatronModelStates) { round_trip("mp_rank_00_model_states"); }
TEST(TorchSerialization, ZeroOptimizerShard) { round_trip("zero_pp_rank_0_mp_rank_00_optim_states"); }
TEST(TorchSerialization, ZeroOptimizerShardPy311) { round_trip("zero_pp_rank_0_mp_rank_00_optim_states_py311"); }
TEST(TorchSerialization, SharedStorageWrittenOnce) { round_trip("shared_storage"); }
TEST(TorchSerialization, LegacyInZipOut) {
  round_trip("legacy_tensors");
  round_trip("legacy_mp_rank_00_model_states");
}
TEST(TorchSerialization, CustomPrefix) { round_trip("renamed_after_save", "my_prefix"); }
TEST(TorchSerialization, Ops) { round_trip("ops"); }

// ---- trees built from scratch with Value constructors; the expected Python objects are written
// alongside as truth JSON (built here independently of the writer) ----

struct Built {
  ValuePtr v;
  json t;
};
Built B(ValuePtr v, json t) { return {std::move(v), std::move(t)}; }
json int_truth(int64_t i) {
  std::string b;
  for (int k = 0; k < 8; ++k) b.push_back(static_cast<char>(static_cast<uint64_t>(i) >> (8 * k)));
  return {{"t", "int"}, {"v", std::to_string(i)}, {"i", i}, {"le", to_hex(canonical_le(b))}};
}
json str_truth(const std::string& s) { return {{"t", "str"}, {"v", s}}; }
Built I(int64_t i) { return B(Value::integer(i), int_truth(i)); }
Built S(const std::string& s) { return B(Value::str(s), str_truth(s)); }
Built F(double f) { return B(Value::real(f), {{"t", "float"}, {"hex", to_hex(&f, 8)}, {"repr", std::to_string(f)}}); }
Built L(std::vector<Built> xs, bool tuple = false) {
  std::vector<ValuePtr> vs;
  json ts = json::array();
  for (auto& x : xs) {
    vs.push_back(x.v);
    ts.push_back(x.t);
  }
  return B(tuple ? Value::tuple(vs) : Value::list(vs), {{"t", tuple ? "tuple" : "list"}, {"items", ts}});
}
Built D(std::vector<std::pair<std::string, Built>> kv, bool ordered = false) {
  auto d = Value::dict(ordered);
  json es = json::array();
  for (auto& [k, x] : kv) {
    d->set_item(k, x.v);
    es.push_back(json::array({str_truth(k), x.t}));
  }
  return B(d, {{"t", "dict"}, {"ordered", ordered}, {"entries", es}});
}

struct StorageTruth {
  json list = json::array();
};
Built T(const Tensor& t, int storage_index, const std::string& hex) {
  return B(Value::of_tensor(t), {{"t", "tensor"},
                                 {"dtype", std::string(ucpkit::dtype_name(t.dtype()))},
                                 {"shape", t.shape()},
                                 {"strides", t.strides()},
                                 {"offset", t.storage_offset()},
                                 {"requires_grad", t.requires_grad},
                                 {"parameter", t.is_parameter},
                                 {"storage", storage_index},
                                 {"hex", hex}});
}

void write_and_check(const std::string& name, const Built& root, const json& storages) {
  std::string dir = ucpkit::testing::scratch_dir("scratch_" + name);
  json truth = {{"value", root.t}, {"storages", storages}};
  std::ofstream(dir + "/" + name + ".json") << truth.dump();
  ucpkit::save_torch_file(dir + "/" + name + ".pt", root.v);
  std::string output;
  int rc = python_check(dir + "/" + name + ".pt", dir + "/" + name + ".json", "archive", &output);
  EXPECT_EQ(rc, 0) << name << ":\n" << output;
}

TEST(TorchSerialization, FromScratchValues) {
  auto big = Value::bytes("");  // 2**100 as a BigInt: 13 bytes little-endian two's complement
  big->kind = Kind::BigInt;
  big->s = std::string(12, '\0') + std::string(1, '\x10');
  Built bigint{big, {{"t", "int"}, {"v", "1267650600228229401496703205376"}, {"le", "00000000000000000000000010"}}};
  auto neg = Value::bytes("");  // -2**70
  neg->kind = Kind::BigInt;
  neg->s = std::string(8, '\0') + std::string(1, '\xc0');
  Built negbig{neg, {{"t", "int"}, {"v", "-1180591620717411303424"}, {"le", "0000000000000000c0"}}};
  Built root = D({{"none", B(Value::none(), {{"t", "none"}})},
                  {"bools", L({B(Value::boolean(true), {{"t", "bool"}, {"v", true}}),
                               B(Value::boolean(false), {{"t", "bool"}, {"v", false}})})},
                  {"ints", L({I(0), I(-1), I(255), I(65536), I(-2147483648LL), I(int64_t{1} << 40),
                              I(INT64_MAX), I(INT64_MIN), bigint, negbig})},
                  {"floats", L({F(0.0), F(-0.0), F(1.5e300), F(std::numeric_limits<double>::infinity()),
                                F(std::numeric_limits<double>::quiet_NaN()), F(-2.5)})},
                  {"strs", L({S(""), S("plain"), S("ünïcødé ✓ 漢字 🚀")})},
                  {"bytes", B(Value::bytes(std::string("\0\1\xff", 3)), {{"t", "bytes"}, {"hex", "0001ff"}})},
                  {"single_list", L({I(1)})},
                  {"tuples", L({L({}, true), L({I(1)}, true), L({I(1), I(2)}, true), L({I(1), I(2), I(3)}, true),
                                L({I(1), I(2), I(3), S("4")}, true)})},
                  {"single_dict", D({{"k", I(1)}})},
                  {"ordered", D({{"z", I(1)}, {"a", I(2)}, {"m", I(3)}}, true)},
                  {"empty_ordered", D({}, true)},
                  {"size", B(Value::torch_size({3, 0, 5}), {{"t", "shape"}, {"v", {3, 0, 5}}})},
                  {"empty_size", B(Value::torch_size({}), {{"t", "shape"}, {"v", json::array()}})},
                  {"dtypes", L({B(Value::torch_dtype(DType::BFloat16), {{"t", "dtype"}, {"v", "bfloat16"}}),
                                B(Value::torch_dtype(DType::Float16), {{"t", "dtype"}, {"v", "float16"}}),
                                B(Value::torch_dtype(DType::Bool), {{"t", "dtype"}, {"v", "bool"}})})}});
  auto set = Value::set({Value::integer(3), Value::integer(1)});
  root.v->set_item("set", set);
  root.t["entries"].push_back(json::array(
      {str_truth("set"), {{"t", "set"}, {"items", json::array({int_truth(1), int_truth(3)})}}}));
  write_and_check("from_scratch_values", root, json::array());
}

TEST(TorchSerialization, FromScratchTensorsSharedStorage) {
  std::vector<float> vals(24);
  for (int i = 0; i < 24; ++i) vals[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i) - 3.0f;
  Tensor base = Tensor::from_vector(DType::Float32, {4, 6}, vals);
  json storages = json::array();
  storages.push_back({{"dtype", "float32"}, {"numel", 24}, {"hex", to_hex(vals.data(), 96)}});
  Tensor view = base.narrow(1, 2, 3);  // offset 2, strides (6, 1)
  Tensor t(base.storage(), 1, {6, 2}, {1, 6});  // transposed-like view
  std::vector<uint16_t> bf = {0x3f80, 0x4000, 0xc040, 0x7f80, 0xff80, 0x7fc0};
  Tensor b16 = Tensor::from_vector(DType::BFloat16, {2, 3}, bf);
  storages.push_back({{"dtype", "bfloat16"}, {"numel", 6}, {"hex", to_hex(bf.data(), 12)}});
  std::vector<int64_t> ints = {1, -2, int64_t{1} << 50};
  Tensor i64 = Tensor::from_vector(DType::Int64, {3}, ints);
  storages.push_back({{"dtype", "int64"}, {"numel", 3}, {"hex", to_hex(ints.data(), 24)}});
  std::vector<uint8_t> bools = {1, 0, 1};
  Tensor bl = Tensor::from_vector(DType::Bool, {3}, bools);
  storages.push_back({{"dtype", "bool"}, {"numel", 3}, {"hex", "010001"}});
  Tensor param = Tensor::from_vector(DType::Float32, {2}, std::vector<float>{1.0f, 2.0f});
  param.is_parameter = true;
  param.requires_grad = true;
  storages.push_back({{"dtype", "float32"}, {"numel", 2}, {"hex", to_hex(std::vector<float>{1.0f, 2.0f}.data(), 8)}});
  Tensor empty = Tensor::zeros(DType::Float16, {0, 3});
  storages.push_back({{"dtype", "float16"}, {"numel", 0}, {"hex", ""}});
  Tensor scalar = Tensor::from_vector(DType::Float64, {}, std::vector<double>{2.5});
  double d25 = 2.5;
  storages.push_back({{"dtype", "float64"}, {"numel", 1}, {"hex", to_hex(&d25, 8)}});

  Built root = D({{"base", T(base, 0, tensor_hex(base))},
                  {"view", T(view, 0, tensor_hex(view))},
                  {"t", T(t, 0, tensor_hex(t))},
                  {"b16", T(b16, 1, to_hex(bf.data(), 12))},
                  {"i64", T(i64, 2, to_hex(ints.data(), 24))},
                  {"bool", T(bl, 3, "010001")},
                  {"param", T(param, 4, to_hex(std::vector<float>{1.0f, 2.0f}.data(), 8))},
                  {"empty", T(empty, 5, "")},
                  {"scalar", T(scalar, 6, to_hex(&d25, 8))},
                  {"again", T(base, 0, tensor_hex(base))}},
                 true);
  write_and_check("from_scratch_tensors", root, storages);
  std::string path = ucpkit::testing::scratch_dir("scratch_from_scratch_tensors") + "/x.pt";
  ucpkit::save_torch_file(path, root.v);
  EXPECT_EQ(storage_records(path), 7u) << "shared storage must be written once";
}

// Generated storages (Storage::generated) are streamed window by window: Python reads the same
// bytes, the CRC-32 is right in the central directory and patched into the local header, both when
// the header is still in AtomicFile's buffer (small windows) and when it is already in the file.
void check_generated(const std::string& name, size_t window, int64_t n32, int64_t n16) {
  ucpkit::ZipWriter::set_stream_window(window);
  auto f32 = [](int64_t i) { return 0.25f * static_cast<float>(i % 1000) - 7.0f; };
  auto g32 = ucpkit::Storage::generated(DType::Float32, n32, [&](uint64_t off, std::span<uint8_t> out) {
    for (size_t k = 0; k < out.size() / 4; ++k) {
      const float v = f32(static_cast<int64_t>(off / 4 + k));
      std::memcpy(out.data() + 4 * k, &v, 4);
    }
  });
  auto g16 = ucpkit::Storage::generated(DType::BFloat16, n16, [](uint64_t off, std::span<uint8_t> out) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<uint8_t>((off + k) * 7 + 1);
  });
  EXPECT_THROW(g32->bytes(), ucpkit::Error);
  std::vector<uint8_t> b32(static_cast<size_t>(g32->nbytes())), b16(static_cast<size_t>(g16->nbytes()));
  g32->generate(0, b32);
  g16->generate(0, b16);
  Tensor whole(g32, 0, {n32}, {1});
  Tensor view(g32, 10, {5}, {1});
  Tensor half(g16, 0, {n16}, {1});
  json storages = json::array({{{"dtype", "float32"}, {"numel", n32}, {"hex", to_hex(b32.data(), b32.size())}},
                               {{"dtype", "bfloat16"}, {"numel", n16}, {"hex", to_hex(b16.data(), b16.size())}}});
  Built root = D({{"whole", T(whole, 0, to_hex(b32.data(), b32.size()))},
                  {"view", T(view, 0, to_hex(b32.data() + 40, 20))},
                  {"half", T(half, 1, to_hex(b16.data(), b16.size()))}},
                 true);
  write_and_check(name, root, storages);
  const std::string path = ucpkit::testing::scratch_dir("zip_" + name) + "/x.pt";
  ucpkit::save_torch_file(path, root.v);
  ucpkit::ZipWriter::set_stream_window(8u << 20);

  auto file = ucpkit::MappedFile::open(path);
  ucpkit::ZipReader zip(file);
  const auto all = file->bytes();
  for (const auto& [rname, rec] : zip.records()) {
    EXPECT_EQ(ucpkit::crc32_update(0, zip.bytes(rec)), rec.crc32) << rname;
    // The local header: signature, then the CRC-32 at byte 14, the name at byte 30.
    const std::string& full = rname;
    auto it = std::search(all.begin(), all.end(), full.begin(), full.end());
    ASSERT_NE(it, all.end()) << full;
    const size_t h = static_cast<size_t>(it - all.begin()) - 30;
    EXPECT_EQ(all[h], 'P');
    EXPECT_EQ(all[h + 1], 'K');
    uint32_t local = 0;
    for (int k = 0; k < 4; ++k) local |= static_cast<uint32_t>(all[h + 14 + k]) << (8 * k);
    EXPECT_EQ(local, rec.crc32) << "local header CRC of " << full;
  }
}

TEST(TorchSerialization, GeneratedStoragesStreamedSmallWindows) { check_generated("generated_small", 4096, 10007, 4099); }
TEST(TorchSerialization, GeneratedStoragesStreamedLargeWindows) {
  check_generated("generated_large", 1u << 20, 700001, 3);
}

TEST(AtomicFileTest, PwriteAtPatchesFileAndBuffer) {
  const std::string path = ucpkit::testing::scratch_dir("pwrite_at") + "/x.bin";
  std::vector<uint8_t> want(10 + (2u << 20) + 10);
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint8_t>(i * 13);
  {
    ucpkit::AtomicFile f(path);
    f.write(want.data(), 10);
    f.write(want.data() + 10, 2u << 20);  // flushed to the file
    f.write(want.data() + 10 + (2u << 20), 10);  // still buffered
    const uint8_t patch[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint64_t at = 10 + (2u << 20) - 4;  // half in the file, half in the buffer
    f.pwrite_at(at, patch);
    f.pwrite_at(2, std::span<const uint8_t>(patch, 3));
    std::memcpy(want.data() + at, patch, 8);
    std::memcpy(want.data() + 2, patch, 3);
    EXPECT_THROW(f.pwrite_at(want.size() - 2, patch), ucpkit::Error);
    f.commit();
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(got == want);
}

// Opaque objects read from one file are written into another unchanged (SubparamShape, LossScaler,
// fragment_address, Namespace, numpy arrays), and new ones built with make_object are re-emitted.
TEST(TorchSerialization, OpaqueObjectsReEmitted) {
  json truth = truth_of("objects");
  auto src = ucpkit::load_torch(fixture("objects.pt"));
  auto root = Value::dict();
  json entries = json::array();
  for (const char* key : {"subparam_shape", "loss_scaler", "dynamic_loss_scaler", "fragment_address", "namespace",
                          "np_array_f8", "np_dtype", "np_rng_state"}) {
    root->set_item(std::string("copied_") + key, src->at(key));
    for (const auto& e : truth["value"]["entries"])
      if (e[0]["v"] == key) entries.push_back(json::array({str_truth(std::string("copied_") + key), e[1]}));
  }
  // new objects from scratch
  auto fa_state = Value::dict();
  fa_state->set_item("numel", Value::integer(77));
  fa_state->set_item("start", Value::integer(1000));
  root->set_item("new_fragment", Value::make_object("deepspeed.utils.tensor_fragment", "fragment_address",
                                                    Value::tuple(), fa_state, ucpkit::pickle::Object::Build::NewObj));
  entries.push_back(json::array(
      {str_truth("new_fragment"),
       {{"t", "object"}, {"class", "deepspeed.utils.tensor_fragment.fragment_address"}, {"newobj", true},
        {"args", json::array()},
        {"state", {{"t", "dict"}, {"ordered", false},
                   {"entries", json::array({json::array({str_truth("numel"), int_truth(77)}),
                                            json::array({str_truth("start"), int_truth(1000)})})}}}}}));
  auto sp_state = Value::dict();
  sp_state->set_item("patterns", Value::list({Value::str("attention.query_key_value.weight")}));
  sp_state->set_item("shape", Value::tuple({Value::tuple({Value::integer(8), Value::integer(4), Value::integer(4)}),
                                            Value::integer(16)}));
  sp_state->set_item("partition_dim", Value::integer(0));
  root->set_item("new_subparam", Value::make_object("deepspeed.checkpoint.universal_checkpoint", "SubparamShape",
                                                    Value::tuple(), sp_state, ucpkit::pickle::Object::Build::NewObj));
  json sp_truth = {
      {"t", "dict"}, {"ordered", false},
      {"entries", json::array({json::array({str_truth("patterns"), {{"t", "list"}, {"items", json::array({str_truth("attention.query_key_value.weight")})}}}),
                               json::array({str_truth("shape"), {{"t", "tuple"}, {"items", json::array({{{"t", "tuple"}, {"items", json::array({int_truth(8), int_truth(4), int_truth(4)})}}, int_truth(16)})}}}),
                               json::array({str_truth("partition_dim"), int_truth(0)})})}};
  entries.push_back(json::array({str_truth("new_subparam"),
                                 {{"t", "object"}, {"class", "deepspeed.checkpoint.universal_checkpoint.SubparamShape"},
                                  {"newobj", true}, {"args", json::array()}, {"state", sp_truth}}}));
  auto ls_state = Value::dict();
  ls_state->set_item("cur_scale", Value::real(4.0));
  ls_state->set_item("dynamic", Value::boolean(false));
  root->set_item("new_loss_scaler", Value::make_object("deepspeed.runtime.fp16.loss_scaler", "LossScaler",
                                                       Value::tuple(), ls_state, ucpkit::pickle::Object::Build::NewObj));
  double four = 4.0;
  entries.push_back(json::array(
      {str_truth("new_loss_scaler"),
       {{"t", "object"}, {"class", "deepspeed.runtime.fp16.loss_scaler.LossScaler"}, {"newobj", true},
        {"args", json::array()},
        {"state", {{"t", "dict"}, {"ordered", false},
                   {"entries", json::array({json::array({str_truth("cur_scale"), {{"t", "float"}, {"hex", to_hex(&four, 8)}, {"repr", "4.0"}}}),
                                            json::array({str_truth("dynamic"), {{"t", "bool"}, {"v", false}}})})}}}}}));
  // an int enum built as cls(value) (REDUCE)
  root->set_item("new_stage", Value::make_object("deepspeed.runtime.zero.config", "ZeroStageEnum",
                                                 Value::tuple({Value::integer(2)}), nullptr));
  entries.push_back(json::array({str_truth("new_stage"),
                                 {{"t", "enum"}, {"class", "deepspeed.runtime.zero.config.ZeroStageEnum"}, {"int", 2},
                                  {"name", "gradients"}}}));
  Built b{root, {{"t", "dict"}, {"ordered", false}, {"entries", entries}}};
  write_and_check("opaque_objects", b, json::array());
}

}  // namespace
}  // namespace torch_write_test
}  // namespace iotest

namespace iotest {
namespace torch_write_test {
namespace {

TEST(TorchSerialization, UnwritablePathIsAnError) {
  std::string bad = "/nonexistent-ucpkit-dir/sub/out.pt";
  try {
    ucpkit::save_torch_file(bad, Value::integer(1));
    ADD_FAILURE() << "no error";
  } catch (const ucpkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

// Overwriting an existing file replaces it whole (temporary name + rename).
TEST(TorchSerialization, OverwriteReplaces) {
  std::string dir = ucpkit::testing::scratch_dir("overwrite");
  std::string path = dir + "/x.pt";
  ucpkit::save_torch_file(path, Value::of_tensor(Tensor::zeros(DType::Float32, {1000})));
  ucpkit::save_torch_file(path, Value::integer(7));
  EXPECT_EQ(ucpkit::load_torch(path)->as_int(), 7);
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1u);
}


// DeferredTorchFile (ucp-load's out-of-order writer): pieces of the generated records given in a
// shuffled order from several threads give the same bytes as save_torch_file; a missing or
// doubled piece is an error at finish() and leaves no file.
ucpkit::pickle::ValuePtr deferred_root() {
  using ucpkit::pickle::Value;
  auto g32 = ucpkit::Storage::generated(DType::Float32, 300007, [](uint64_t off, std::span<uint8_t> out) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<uint8_t>((off + k) * 31 + 3);
  });
  auto g16 = ucpkit::Storage::generated(DType::BFloat16, 5, [](uint64_t off, std::span<uint8_t> out) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<uint8_t>(off + k + 100);
  });
  auto root = Value::dict();
  root->set_item("big", Value::of_tensor(Tensor(g32, 0, {300007}, {1})));
  root->set_item("stored", Value::of_tensor(Tensor::from_bytes(DType::Float32, {2}, std::vector<uint8_t>(8, 7))));
  root->set_item("tiny", Value::of_tensor(Tensor(g16, 1, {2, 2}, {2, 1})));
  return root;
}
std::vector<std::pair<uint64_t, uint64_t>> shuffled_pieces(uint64_t n, uint64_t step, unsigned seed) {
  std::vector<std::pair<uint64_t, uint64_t>> v;
  for (uint64_t a = 0; a < n; a += step) v.emplace_back(a, std::min(n, a + step));
  std::mt19937 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

TEST(TorchSerialization, DeferredFileOutOfOrderEqualsStreamed) {
  const std::string dir = ucpkit::testing::scratch_dir("deferred");
  auto root = deferred_root();
  ucpkit::save_torch_file(dir + "/streamed.pt", root);
  ucpkit::DeferredTorchFile f(dir + "/deferred.pt", root);
  ASSERT_EQ(f.records().size(), 2u);  // the two generated storages; the stored one is written already
  std::vector<std::thread> threads;
  for (size_t k = 0; k < f.records().size(); ++k) {
    const auto& st = *f.records()[k].storage;
    for (unsigned t = 0; t < 3; ++t)
      threads.emplace_back([&, k, t] {
        auto pieces = shuffled_pieces(st.nbytes(), 4 * 1009, 7);  // one order, split over threads
        for (size_t i = t; i < pieces.size(); i += 3) {
          std::vector<uint8_t> w(pieces[i].second - pieces[i].first);
          st.generate(pieces[i].first, w);
          f.write(k, pieces[i].first, w);
        }
      });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(std::filesystem::exists(dir + "/deferred.pt"));  // not before finish()
  f.finish();
  std::ifstream a(dir + "/streamed.pt", std::ios::binary), b(dir + "/deferred.pt", std::ios::binary);
  const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_GT(sa.size(), 1200000u);
  EXPECT_TRUE(sa == sb) << "out-of-order bytes differ from the streamed file";
}

TEST(TorchSerialization, DeferredFileMissingOrDoubledPieceFails) {
  const std::string dir = ucpkit::testing::scratch_dir("deferred_bad");
  for (int mode = 0; mode < 2; ++mode) {
    const std::string path = dir + "/x" + std::to_string(mode) + ".pt";
    {
      ucpkit::DeferredTorchFile f(path, deferred_root());
      for (size_t k = 0; k < f.records().size(); ++k) {
        const auto& st = *f.records()[k].storage;
        std::vector<uint8_t> w(st.nbytes());
        st.generate(0, w);
        if (mode == 0 && k == 0) w.resize(w.size() - 4);  // last element missing
        f.write(k, 0, w);
        if (mode == 1 && k == 1) f.write(k, 0, std::span<const uint8_t>(w.data(), 2));  // written twice
      }
      EXPECT_THROW(f.finish(), ucpkit::Error) << mode;
    }
    EXPECT_FALSE(std::filesystem::exists(path)) << mode;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find("x" + std::to_string(mode) + ".pt.tmp"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace torch_write_test
}  // namespace iotest
