// torch >= 2.0 pickle constructs assembled by tests/io/torch2_fixtures.py (torch 1.13 cannot write
// them): _rebuild_tensor_v3, layouts through _get_layout, and the tensors ucpkit refuses by name.
// The constructs found in the real torch 2.11 files are covered by torch2_real_test.cpp.
#include <filesystem>

#include "io/pickle/unpickler.h"
#include "support/process.h"
#include "truth_check.h"
#include "support/errors.h"

namespace iotest {
namespace torch2_constructs_test {
namespace {

std::string load_error(const std::string& file) {
  return ucpkit::testing::error_of([&] { ucpkit::load_torch_file(fixture(file)); }, "(no error)");
}

std::string written(const std::string& name) {
  auto dir = std::filesystem::path(UCPKIT_BUILD_DIR) / "torch2_constructs";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

TEST(Torch2Constructs, RebuildTensorV3) { check_fixture("torch2_v3"); }

// Written back as torch writes a bfloat16 tensor (_rebuild_tensor_v2 over a BFloat16Storage): torch
// 1.13 loads the same values (check_roundtrip.py against the truth of the original tensors).
TEST(Torch2Constructs, RebuildTensorV3WrittenBack) {
  auto tf = ucpkit::load_torch_file(fixture("torch2_v3.pt"));
  const std::string out = written("torch2_v3.pt");
  ucpkit::save_torch_file(out, tf.root);
  std::string log;
  int rc = ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + UCPKIT_SOURCE_DIR +
                                            "/tests/io/check_roundtrip.py " + out + " " + fixture("torch2_v3.json"),
                                        &log);
  EXPECT_EQ(rc, 0) << log;
}

TEST(Torch2Constructs, LayoutKeptAndWrittenBack) {
  auto tf = ucpkit::load_torch_file(fixture("torch2_layout.pt"));
  const ValuePtr& layout = tf.root->at("layout");
  ASSERT_TRUE(layout->is(Kind::Object));
  EXPECT_EQ(layout->class_path(), "torch.serialization._get_layout");
  EXPECT_EQ(layout->object->args->items.at(0)->as_str(), "torch.strided");
  const std::string out = written("torch2_layout.pt");
  ucpkit::save_torch_file(out, tf.root);
  std::string log;
  int rc = ucpkit::testing::run_command(
      std::string(UCPKIT_PYTHON) + " -c \"import sys, torch; o = torch.load(sys.argv[1], weights_only=False); "
      "sys.exit(0 if o['layout'] is torch.strided and o['t'].tolist() == [1.0, 1.0] else 1)\" " + out, &log);
  EXPECT_EQ(rc, 0) << log;
}

// Each refused construct: an Error naming the file and the construct.
TEST(Torch2Constructs, UnrepresentableTensorsRefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"torch2_v3_float8.pt", "_rebuild_tensor_v3: unsupported dtype <torch.float8_e4m3fn>"},
      {"torch2_sparse.pt", "unsupported sparse tensor (torch._utils._rebuild_sparse_tensor)"},
      {"torch2_nested.pt", "unsupported nested tensor (torch._utils._rebuild_nested_tensor)"},
      {"torch2_wrapper.pt", "unsupported tensor wrapper subclass (torch._utils._rebuild_wrapper_subclass)"},
      // the quantized storage comes first in the record: its storage type is what is named
      {"torch2_qtensor.pt", "unsupported storage type torch.QUInt8Storage"},
  };
  for (const auto& [file, what] : cases) {
    const std::string msg = load_error(file);
    EXPECT_NE(msg.find(fixture(file)), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

// torch never nests _rebuild_from_type_v2 in itself; a pickle that does is refused (the reader
// calls func(*args) itself, so nesting would otherwise recurse as deep as the input goes).
TEST(Torch2Constructs, RebuildFromTypeNestedInItselfRefused) {
  // (adjacent literals: a hex escape such as \x00 would otherwise swallow the following 'c')
  static const char raw[] = "\x80\x02" "ctorch._tensor\n_rebuild_from_type_v2\n" "q\x00" "(" "h\x00"
                            "ctorch\nTensor\n" "(" "h\x00" "ctorch\nTensor\n" ")}t}tR.";
  const std::string pkl(raw, sizeof(raw) - 1);  // holds NUL bytes
  std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size());
  try {
    ucpkit::pickle::unpickle(bytes, "nested.pkl");
    ADD_FAILURE() << "no error";
  } catch (const ucpkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nested.pkl"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("_rebuild_from_type_v2 nested in itself"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace torch2_constructs_test
}  // namespace iotest
