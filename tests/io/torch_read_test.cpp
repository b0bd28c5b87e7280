// Reading real torch.save files (written by tests/io/fixtures.py with Debian's PyTorch) and comparing
// every value, kind, order, tensor layout and byte with the ground truth.
#include <fstream>
#include <iterator>

#include "core/mapped_file.h"
#include "core/crc32.h"
#include "io/zip/zip_reader.h"
#include "io/zip/zip_writer.h"
#include "truth_check.h"

namespace iotest {
namespace torch_read_test {
namespace {

TEST(TorchDeserialization, Basic) { check_fixture("basic"); }
TEST(TorchDeserialization, LegacyBasic) { check_fixture("legacy_basic"); }
TEST(TorchDeserialization, SingleInt) { check_fixture("single_int"); }
TEST(TorchDeserialization, SingleItemList) { check_fixture("single_list"); }
TEST(TorchDeserialization, SingleItemDict) { check_fixture("single_dict"); }
TEST(TorchDeserialization, TensorsAllDtypesAndLayouts) { check_fixture("tensors"); }
TEST(TorchDeserialization, LegacyTensors) { check_fixture("legacy_tensors"); }
TEST(TorchDeserialization, PickleProtocol1Legacy) { check_fixture("legacy_tensors_proto1"); }
TEST(TorchDeserialization, PickleProtocol1Zip) { check_fixture("tensors_proto1"); }
TEST(TorchDeserialization, PickleProtocol4Zip) { check_fixture("basic_proto4"); }
TEST(TorchDeserialization, PickleProtocol5Legacy) { check_fixture("legacy_basic_proto5"); }
TEST(TorchDeserialization, CheckpointObjects) { check_fixture("objects"); }
TEST(TorchDeserialization, LegacyCheckpointObjects) { check_fixture("legacy_objects"); }
TEST(TorchDeserialization, EnumPy310) { check_fixture("enum_py310"); }
TEST(TorchDeserialization, EnumPy311) { check_fixture("enum_py311"); }
TEST(TorchDeserialization, MegatronModelStates) { check_fixture("mp_rank_00_model_states"); }
TEST(TorchDeserialization, LegacyMegatronModelStates) { check_fixture("legacy_mp_rank_00_model_states"); }
TEST(TorchDeserialization, ZeroOptimizerShard) { check_fixture("zero_pp_rank_0_mp_rank_00_optim_states"); }
TEST(TorchDeserialization, ZeroOptimizerShardPy311) { check_fixture("zero_pp_rank_0_mp_rank_00_optim_states_py311"); }
TEST(TorchDeserialization, LegacyZeroOptimizerShard) { check_fixture("legacy_zero_pp_rank_0_mp_rank_00_optim_states"); }
TEST(TorchDeserialization, PrefixIsFileStemAtSaveTime) { check_fixture("renamed_after_save"); }
TEST(TorchDeserialization, PrefixArchiveFromBuffer) { check_fixture("from_buffer"); }
TEST(TorchDeserialization, SharedStorage) { check_fixture("shared_storage"); }
TEST(TorchDeserialization, HandmadePickle) { check_fixture("handmade_ok"); }
TEST(TorchDeserialization, LegacySingle) { check_fixture("legacy_single"); }
TEST(TorchDeserialization, TensorOpsFixture) { check_fixture("ops"); }

// The accessors a tool uses, on the Megatron file: Namespace attributes, param_shapes, views of one buffer.
TEST(TorchDeserialization, MegatronAccessors) {
  json truth = truth_of("mp_rank_00_model_states");
  auto root = ucpkit::load_torch(fixture("mp_rank_00_model_states.pt"));
  ASSERT_TRUE(root && root->is(Kind::Dict));
  // args.params_dtype is torch.bfloat16, args.hidden_size an int: truth from the Namespace's state
  const ValuePtr& args = root->at("args");
  EXPECT_EQ(args->class_path(), "argparse.Namespace");
  json args_truth;
  for (const auto& e : truth["value"]["entries"])
    if (e[0]["v"] == "args") args_truth = e[1];
  ASSERT_FALSE(args_truth.is_null());
  for (const auto& e : args_truth["state"]["entries"]) {
    std::string name = e[0]["v"];
    ValuePtr a = args->attr(name);
    ASSERT_TRUE(a) << name;
    if (e[1]["t"] == "dtype") {
      ASSERT_TRUE(a->is(Kind::Dtype)) << name;
      EXPECT_EQ(ucpkit::dtype_name(a->dtype), e[1]["v"].get<std::string>()) << name;
    } else if (e[1]["t"] == "int") {
      EXPECT_EQ(a->as_int(), e[1]["i"].get<int64_t>()) << name;
    }
  }
  // module: every tensor is a view of the same storage (one flat buffer), as DeepSpeed saves it
  const ValuePtr& module = root->at("module");
  ASSERT_TRUE(module->ordered);
  std::shared_ptr<ucpkit::Storage> first;
  for (const auto& [k, v] : module->entries) {
    ASSERT_TRUE(v->is(Kind::Tensor)) << k->repr();
    if (!first) first = v->tensor->storage();
    EXPECT_EQ(v->tensor->storage().get(), first.get()) << k->s;
    EXPECT_EQ(v->tensor->dtype(), DType::BFloat16);
  }
  // param_shapes: OrderedDict name -> torch.Size, read with as_shape()
  const ValuePtr& shapes = root->at("param_shapes");
  ASSERT_TRUE(shapes->is(Kind::List));
  for (const auto& group : shapes->items) {
    ASSERT_TRUE(group->is(Kind::Dict) && group->ordered);
    for (const auto& [k, v] : group->entries) EXPECT_EQ(v->as_shape(), module->at(k->s)->tensor->shape()) << k->s;
  }
  EXPECT_EQ(root->at("checkpoint_version")->as_float(), 3.0);
  EXPECT_EQ(root->at("iteration")->as_int(), 100);
}

// fragment_address via as_fragment_address(), ZeroStageEnum via as_int(), loss scaler attributes.
void check_zero_accessors(const std::string& name) {
  json truth = truth_of(name);
  auto root = ucpkit::load_torch(fixture(name + ".pt"));
  const ValuePtr& osd = root->at("optimizer_state_dict");
  EXPECT_EQ(osd->at("zero_stage")->as_int(), 1) << name;  // ZeroStageEnum.optimizer_states
  json osd_truth, mappings_truth;
  for (const auto& e : truth["value"]["entries"])
    if (e[0]["v"] == "optimizer_state_dict") osd_truth = e[1];
  for (const auto& e : osd_truth["entries"])
    if (e[0]["v"] == "param_slice_mappings") mappings_truth = e[1];
  const ValuePtr& mappings = osd->at("param_slice_mappings");
  ASSERT_EQ(mappings->items.size(), mappings_truth["items"].size());
  size_t checked = 0;
  for (size_t g = 0; g < mappings->items.size(); ++g) {
    const auto& m = mappings->items[g];
    const auto& mt = mappings_truth["items"][g]["entries"];
    ASSERT_TRUE(m->ordered);
    ASSERT_EQ(m->entries.size(), mt.size());
    for (size_t i = 0; i < mt.size(); ++i) {
      EXPECT_EQ(m->entries[i].first->as_str(), mt[i][0]["v"].get<std::string>());
      EXPECT_EQ(m->entries[i].second->class_path(), "deepspeed.utils.tensor_fragment.fragment_address");
      auto [numel, start] = m->entries[i].second->as_fragment_address();
      const auto& st = mt[i][1]["state"]["entries"];  // dataclass __dict__: numel, start
      EXPECT_EQ(numel, st[0][1]["i"].get<int64_t>());
      EXPECT_EQ(start, st[1][1]["i"].get<int64_t>());
      ++checked;
    }
  }
  EXPECT_GT(checked, 10u);
  const ValuePtr& scaler = osd->at("loss_scaler");
  EXPECT_EQ(scaler->class_path(), "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler");
  EXPECT_EQ(scaler->attr("cur_scale")->as_int(), 65536);
  EXPECT_EQ(scaler->attr("dtype")->dtype, DType::BFloat16);
  EXPECT_TRUE(scaler->attr("dynamic")->as_bool());
}
TEST(TorchDeserialization, ZeroAccessors) { check_zero_accessors("zero_pp_rank_0_mp_rank_00_optim_states"); }
TEST(TorchDeserialization, ZeroAccessorsPy311Enum) { check_zero_accessors("zero_pp_rank_0_mp_rank_00_optim_states_py311"); }
TEST(TorchDeserialization, ZeroAccessorsLegacy) { check_zero_accessors("legacy_zero_pp_rank_0_mp_rank_00_optim_states"); }

TEST(TorchDeserialization, OrderedDictKeepsOrder) {
  auto root = ucpkit::load_torch(fixture("basic.pt"));
  const ValuePtr& od = root->at("ordered");
  ASSERT_TRUE(od->ordered);
  std::vector<std::string> keys;
  for (const auto& e : od->entries) keys.push_back(e.first->as_str());
  json truth = truth_of("basic");
  std::vector<std::string> want;
  for (const auto& e : truth["value"]["entries"])
    if (e[0]["v"] == "ordered")
      for (const auto& k : e[1]["entries"]) want.push_back(k[0]["v"]);
  EXPECT_EQ(keys, want);
}

// Storages of a zip file are memory-mapped views of the file (zero-copy), not copies.
TEST(TorchDeserialization, ZipStoragesAreMapped) {
  auto tf = ucpkit::load_torch_file(fixture("tensors.pt"));
  const auto& t = tf.root->at("large")->as_tensor();
  ASSERT_TRUE(t.storage()->is_mapped());
  const uint8_t* p = t.storage()->bytes().data();
  EXPECT_GE(p, tf.file->data());
  EXPECT_LE(p + t.storage()->nbytes(), tf.file->data() + tf.file->size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << "torch aligns records to 64 bytes";
}

TEST(TorchDeserialization, BytesAndFileGiveTheSameTree) {
  std::ifstream in(fixture("objects.pt"), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto tf = ucpkit::load_torch_bytes(bytes, "objects-in-memory.pt");
  json truth = truth_of("objects");
  Checker c(truth["storages"]);
  c.check(tf.root, truth["value"], "$");
  EXPECT_TRUE(c.errors.empty()) << c.report();
}

TEST(TorchDeserialization, VerifyCrc) {
  std::ifstream in(fixture("tensors.pt"), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ucpkit::TorchLoadOptions opt;
  opt.verify_crc = true;
  EXPECT_NO_THROW(ucpkit::load_torch_bytes(bytes, "crc-ok.pt", opt));
  // flip one byte inside the storage of "large": the CRC check must notice, a plain load must not care
  auto tf = ucpkit::load_torch_bytes(bytes, "crc-probe.pt");
  const auto& t = tf.root->at("large")->as_tensor();
  size_t at = static_cast<size_t>(t.storage()->bytes().data() - tf.file->data()) + 1000;
  bytes[at] ^= 0x40;
  EXPECT_NO_THROW(ucpkit::load_torch_bytes(bytes, "crc-bad.pt"));
  try {
    ucpkit::load_torch_bytes(bytes, "crc-bad.pt", opt);
    ADD_FAILURE() << "CRC mismatch not detected";
  } catch (const ucpkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("crc-bad.pt"), std::string::npos) << e.what();
  }
}

TEST(TorchDeserialization, ZipReaderRecords) {
  json truth = truth_of("renamed_after_save");
  auto file = ucpkit::MappedFile::open(fixture("renamed_after_save.pt"));
  ucpkit::ZipReader zip(file);
  EXPECT_EQ(zip.prefix(), truth["prefix"].get<std::string>());
  ASSERT_TRUE(zip.find("data.pkl"));
  ASSERT_TRUE(zip.find("version"));
  EXPECT_FALSE(zip.find("nonexistent"));
  for (const auto& [name, rec] : zip.records()) {
    EXPECT_LE(rec.data_offset + rec.size, file->size()) << name;
    EXPECT_EQ(ucpkit::crc32_parallel(zip.bytes(rec)), rec.crc32) << name;
  }
}

}  // namespace
}  // namespace torch_read_test
}  // namespace iotest
