// lib/io/torch/torch_file: loading torch.save files (zip and legacy containers) from a path, bytes or a
// mapped slice, and writing them (save_torch_file, append_torch_file, DeferredTorchFile). The truth is
// torch's own files (build/fixtures/io, made by tests/io/fixtures.py; values from their .json), files
// built here byte by byte (pickles and storage bytes written by hand), and /usr/bin/python3's zipfile
// and pickle for what ucpkit writes. Whole-fixture round trips live in torch_read_test / torch_write_test.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "io/torch/torch_file.h"
#include "io/zip/zip_reader.h"
#include "io/zip/zip_writer.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace torch_torch_file_test {

using namespace ucpkit;
using namespace std::string_view_literals;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using ucpkit::testing::error_of;

namespace {

std::string fixture(const std::string& name) { return std::string(UCPKIT_FIXTURES_DIR) + "/" + name; }

std::span<const uint8_t> span_of(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

// 1.5, -2, 0.25 as float32, little- and big-endian.
constexpr std::string_view kValuesLE = "\x00\x00\xc0\x3f\x00\x00\x00\xc0\x00\x00\x80\x3e"sv;
constexpr std::string_view kValuesBE = "\x3f\xc0\x00\x00\xc0\x00\x00\x00\x3e\x80\x00\x00"sv;

// torch._utils._rebuild_tensor_v2(storage, 0, (3,), (1,), False, ()) where the storage's persistent id
// is ('storage', torch.<cls>, '0', 'cpu', 3[, None]): what torch.save pickles for one 3-element tensor.
std::string tensor_pickle(std::string_view storage_class = "FloatStorage", bool legacy = false) {
  std::string s =
      "\x80\x02"
      "ctorch._utils\n_rebuild_tensor_v2\n((\x8c\x07storagectorch\n";
  s += storage_class;
  s += "\n\x8c\x01"
       "0\x8c\x03"
       "cpuK\x03";
  if (legacy) s += "N";
  s += "tQK\x00K\x03\x85K\x01\x85\x89)tR."sv;
  return s;
}

// A zip written by ZipWriter with the given records (names relative to "archive/").
std::string zip_of(const std::string& name, const std::vector<std::pair<std::string, std::string>>& records) {
  const std::string path = ucpkit::testing::scratch_dir("torch_file_" + name) + "/" + name + ".pt";
  ZipWriter zip(path);
  for (const auto& [rec, bytes] : records) zip.add("archive/" + rec, span_of(bytes));
  zip.finish();
  return path;
}

std::string load_error(const std::string& path, TorchLoadOptions o = {}) {
  return error_of([&] { load_torch_file(path, o); }, "(accepted)");
}

std::vector<float> floats(const ValuePtr& v) { return v->as_tensor().to_vector<float>(); }

std::vector<uint8_t> values_le() { return {kValuesLE.begin(), kValuesLE.end()}; }

// torch's legacy (pre-1.6) format for {'t': tensor [1.5, -2, 0.25]}: five pickles, then the storage.
std::string legacy_bytes(bool little_endian = true, std::string_view count = "\x03\x00\x00\x00\x00\x00\x00\x00"sv) {
  std::string s("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19."sv);  // magic 0x1950a86a20f9469cfc6c
  s += "\x80\x02M\xe9\x03."sv;                                                   // protocol version 1001
  s += "\x80\x02}(\x8c\x0dlittle_endian";
  s += little_endian ? "\x88u." : "\x89u.";
  s += "\x80\x02}\x8c\x01t" + tensor_pickle("FloatStorage", true).substr(2, std::string::npos);
  s.back() = 's';  // SETITEM instead of STOP, then STOP
  s += ".";
  s += "\x80\x02]\x8c\x01"
       "0a.";  // storage keys
  s += count;
  s += kValuesLE;
  return s;
}

}  // namespace

TEST(TorchFile, ZipFixtureKeepsPrefixAndSharesStoragesBetweenViews) {
  // shared_storage.pt (torch.save): a = randn(10, 10), b = a[2:5], c = a.t(), d = randn(3), nested views.
  TorchFile tf = load_torch_file(fixture("shared_storage.pt"));
  EXPECT_EQ(tf.container, TorchContainer::Zip);
  EXPECT_EQ(tf.archive_prefix, "shared_storage");
  const Tensor& a = tf.root->at("a")->as_tensor();
  const Tensor& b = tf.root->at("b")->as_tensor();
  const Tensor& c = tf.root->at("c")->as_tensor();
  const Tensor& d = tf.root->at("d")->as_tensor();
  EXPECT_EQ(a.storage(), b.storage());
  EXPECT_EQ(a.storage(), c.storage());
  EXPECT_NE(a.storage(), d.storage());
  EXPECT_EQ(b.storage_offset(), 20);
  EXPECT_EQ(b.shape(), (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(c.strides(), (std::vector<int64_t>{1, 10}));
  EXPECT_TRUE(a.storage()->is_mapped());  // zero-copy
  EXPECT_EQ(a.storage()->location, "cpu");
  auto db = d.contiguous_bytes();
  EXPECT_EQ(std::string(db.begin(), db.end()), "\x44\x6f\x83\x3f\x07\x39\x08\xc0\xb3\xbb\xcb\xbf");  // the .json's hex
}

TEST(TorchFile, LegacyFixtureHasNoPrefix) {
  TorchFile tf = load_torch_file(fixture("legacy_single.pt"));
  EXPECT_EQ(tf.container, TorchContainer::Legacy);
  EXPECT_EQ(tf.archive_prefix, "");
  EXPECT_EQ(floats(tf.root->at("t")), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(load_torch(fixture("single_int.pt"))->i, 5);
}

TEST(TorchFile, BytesAndMappedSlicesLoadWithTheirNameInErrors) {
  const std::string bytes = ucpkit::testing::file_bytes(fixture("legacy_single.pt"));
  ASSERT_FALSE(bytes.empty());
  TorchFile tf = load_torch_bytes(span_of(bytes), "mem.pt");
  EXPECT_EQ(floats(tf.root->at("t")), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  // A torch file 37 bytes into a larger one (a DCP data item), junk after it.
  const std::string big = std::string(37, 'x') + ucpkit::testing::file_bytes(fixture("single_list.pt")) + "junk";
  auto whole = MappedFile::from_bytes(span_of(big), "big.bin");
  auto slice = MappedFile::slice(whole, 37, big.size() - 41, "big.bin[37]");
  TorchFile s = load_torch_mapped(slice);
  EXPECT_TRUE(s.root->is(Kind::List));
  EXPECT_EQ(error_of([&] { load_torch_bytes({}, "empty.pt"); }), "empty.pt: empty file");
  std::string msg = error_of([&] { load_torch_bytes(span_of("hello"sv), "text.pt"); });
  EXPECT_EQ(msg, "text.pt: not a torch file (wrong magic: neither zip nor pickle)");
  msg = load_error("/nonexistent/x.pt");
  EXPECT_EQ(msg.rfind("/nonexistent/x.pt", 0), 0u) << msg;
}

TEST(TorchFile, HandMadeZipLoadsItsStorage) {
  auto path = zip_of("ok", {{"data.pkl", tensor_pickle()}, {"data/0", std::string(kValuesLE)}});
  TorchFile tf = load_torch_file(path);
  EXPECT_EQ(tf.archive_prefix, "archive");
  EXPECT_EQ(floats(tf.root), (std::vector<float>{1.5f, -2.f, 0.25f}));
  EXPECT_EQ(tf.root->as_tensor().storage()->key, "0");
  // A HalfStorage over the same record: 3 halves need 6 of its 12 bytes (a longer record is fine).
  auto half = zip_of("half", {{"data.pkl", tensor_pickle("HalfStorage")}, {"data/0", std::string(kValuesLE)}});
  EXPECT_EQ(load_torch(half)->as_tensor().dtype(), DType::Float16);
}

TEST(TorchFile, BigEndianRecordsAreSwappedOnLoad) {
  auto path = zip_of("big", {{"byteorder", "big"}, {"data.pkl", tensor_pickle()}, {"data/0", std::string(kValuesBE)}});
  auto v = load_torch(path);
  EXPECT_EQ(floats(v), (std::vector<float>{1.5f, -2.f, 0.25f}));
  EXPECT_FALSE(v->as_tensor().storage()->is_mapped());  // swapped into memory
  auto little = zip_of("little",
                       {{"byteorder", "little"}, {"data.pkl", tensor_pickle()}, {"data/0", std::string(kValuesLE)}});
  EXPECT_EQ(floats(load_torch(little)), (std::vector<float>{1.5f, -2.f, 0.25f}));
  auto odd = zip_of("odd",
                    {{"byteorder", "middle"}, {"data.pkl", tensor_pickle()}, {"data/0", std::string(kValuesLE)}});
  std::string msg = load_error(odd);
  EXPECT_NE(msg.find("zip: unknown byte order middle in record 'byteorder'"), std::string::npos) << msg;
}

TEST(TorchFile, DamagedZipsAreRefusedNamingWhatIsWrong) {
  auto check = [](const std::string& name, const std::vector<std::pair<std::string, std::string>>& recs,
                  const std::string& words) {
    const std::string path = zip_of(name, recs);
    const std::string msg = load_error(path);
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(words), std::string::npos) << name << ": " << msg;
  };
  check("no_pkl", {{"data/0", std::string(kValuesLE)}}, "zip: no data.pkl record");
  check("no_storage", {{"data.pkl", tensor_pickle()}}, "storage record 'data/0' is missing");
  check("short", {{"data.pkl", tensor_pickle()}, {"data/0", std::string(kValuesLE.substr(0, 8))}},
        "storage record 'data/0' holds 8 bytes but its 3 float32 elements need 12");
  check("complex", {{"data.pkl", tensor_pickle("ComplexFloatStorage")}, {"data/0", std::string(kValuesLE)}},
        "unsupported storage type torch.ComplexFloatStorage");
  check("pid",
        {{"data.pkl",
          "\x80\x02(\x8c\x04"
          "blobK\x01K\x02K\x03K\x04tQ."}},
        "unsupported persistent id");
  check("short_pid", {{"data.pkl", "\x80\x02\x8c\x01xQ."}}, "persistent id is not a storage tuple");
  // One key used as float32 then as float16.
  std::string two = "\x80\x02(" + tensor_pickle().substr(2);
  two.pop_back();
  two += tensor_pickle("HalfStorage").substr(2);
  two.pop_back();
  two += "t.";
  check("two_dtypes", {{"data.pkl", two}, {"data/0", std::string(kValuesLE)}}, "storage '0' is used with two dtypes");
}

TEST(TorchFile, RecordCrcsAreCheckedAtOpenOrOnRequest) {
  auto path = zip_of("crc", {{"data.pkl", tensor_pickle()}, {"data/0", std::string(kValuesLE)}});
  std::string bytes = ucpkit::testing::file_bytes(path);
  const size_t at = bytes.find(std::string(kValuesLE));
  ASSERT_NE(at, std::string::npos);
  bytes[at] = 1;  // the storage's first byte; its CRC-32 in the directory no longer matches
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  std::string msg = load_error(path);
  EXPECT_NE(msg.find("CRC-32 mismatch in record"), std::string::npos) << msg;
  TorchLoadOptions no_check;
  no_check.crc_at_open = false;
  EXPECT_EQ(load_torch(path, no_check)->as_tensor().to_vector<float>()[1], -2.f);
  TorchLoadOptions verify;
  verify.verify_crc = true;
  msg = error_of([&] { load_torch_bytes(span_of(bytes), "m.pt", verify); });
  EXPECT_NE(msg.find("m.pt: zip: CRC-32 mismatch in record"), std::string::npos) << msg;
  EXPECT_NO_THROW(load_torch_bytes(span_of(bytes), "m.pt"));  // bytes are not checked unless asked
}

TEST(TorchFile, HandMadeLegacyFileBindsStoragesAfterThePickles) {
  const std::string ok = legacy_bytes();
  TorchFile tf = load_torch_bytes(span_of(ok), "legacy.pt");
  EXPECT_EQ(tf.container, TorchContainer::Legacy);
  EXPECT_EQ(floats(tf.root->at("t")), (std::vector<float>{1.5f, -2.f, 0.25f}));
  auto refused = [](const std::string& bytes) { return error_of([&] { load_torch_bytes(span_of(bytes), "l.pt"); }); };
  std::string msg = refused(legacy_bytes(false));
  EXPECT_NE(msg.find("written on a big-endian host"), std::string::npos) << msg;
  msg = refused(legacy_bytes(true, "\x02\x00\x00\x00\x00\x00\x00\x00"sv));
  EXPECT_NE(msg.find("storage '0' holds 2 elements, its tensors need 3"), std::string::npos) << msg;
  msg = refused(legacy_bytes(true, "\x09\x00\x00\x00\x00\x00\x00\x00"sv));
  EXPECT_NE(msg.find("truncated: storage '0' runs past the end of the file"), std::string::npos) << msg;
  msg = refused(ok.substr(0, ok.size() - 16));
  EXPECT_NE(msg.find("truncated: storage '0' header past the end of the file"), std::string::npos) << msg;
  std::string bad_magic = ok;
  bad_magic[4] = 0x6d;
  msg = refused(bad_magic);
  EXPECT_NE(msg.find("not a torch file (wrong magic number)"), std::string::npos) << msg;
  std::string bad_version = ok;
  bad_version[bad_version.find("M\xe9\x03") + 1] = static_cast<char>(0xea);  // 1002
  msg = refused(bad_version);
  EXPECT_NE(msg.find("unsupported legacy protocol version 1002"), std::string::npos) << msg;
}

TEST(TorchFile, SavedFileIsReadByPythonsZipfileAndPickle) {
  auto w = Value::of_tensor(Tensor::from_bytes(DType::Float32, {3}, values_le()));
  auto root = Value::dict();
  root->set_item("w", w);
  root->set_item("v", Value::of_tensor(w->as_tensor().narrow(0, 1, 2)));
  root->set_item("n", Value::integer(7));
  const std::string dir = ucpkit::testing::scratch_dir("torch_file_save");
  TorchSaveOptions o;
  o.archive_prefix = "mine";
  save_torch_file(dir + "/s.pt", root, o);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "s.pt") << "temporary file left behind";
  // torch.load itself reads what save_torch_file writes in torch_write_test (importing torch takes
  // over a second); here the records and the pickle's torch constructs, with stubs for torch's names.
  const std::string script = R"(
import sys, zipfile, pickle, struct
z = zipfile.ZipFile(sys.argv[1])
names = z.namelist()
assert all(n.startswith('mine/') for n in names), names
assert 'mine/data.pkl' in names and 'mine/data/0' in names and 'mine/data/1' not in names, names
assert z.read('mine/byteorder') == b'little'
assert struct.unpack('<3f', z.read('mine/data/0')) == (1.5, -2.0, 0.25)
class U(pickle.Unpickler):
    def find_class(self, mod, name):
        if (mod, name) == ('torch._utils', '_rebuild_tensor_v2'):
            return lambda st, off, size, stride, grad, hooks: ('T', st, off, tuple(size), tuple(stride), grad)
        if mod == 'torch': return 'torch.' + name
        return super().find_class(mod, name)
    def persistent_load(self, pid): return pid
d = U(z.open('mine/data.pkl')).load()
storage = ('storage', 'torch.FloatStorage', '0', 'cpu', 3)
assert d['w'] == ('T', storage, 0, (3,), (1,), False), d
assert d['v'] == ('T', storage, 1, (2,), (1,), False), d
assert d['n'] == 7
print('ok')
)";
  std::ofstream(dir + "/check.py") << script;
  std::string out;
  EXPECT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + dir + "/check.py " + dir + "/s.pt", &out),
            0)
      << out;
}

TEST(TorchFile, AppendedFileLoadsFromItsOffset) {
  auto root = Value::of_tensor(Tensor::from_bytes(DType::Float32, {3}, values_le()));
  const std::string path = ucpkit::testing::scratch_dir("torch_file_append") + "/item.bin";
  uint64_t n = 0;
  {
    AtomicFile out(path);
    out.write(span_of("0123456789"sv));
    n = append_torch_file(out, root);
    out.write(span_of("tail"sv));
    out.commit();
  }
  EXPECT_EQ(std::filesystem::file_size(path), 10 + n + 4);
  auto slice = MappedFile::slice(MappedFile::open(path), 10, n, "item");
  EXPECT_EQ(floats(load_torch_mapped(slice).root), (std::vector<float>{1.5f, -2.f, 0.25f}));
}

// TensorZipWriter's copies of a zip made once per signature: the bytes append_torch_file writes, item for
// item, for tensors that share a signature with different values, every part of the signature changed
// one at a time, storages it leaves to append_torch_file (zeros, above kMaxBytes), at any offset.
TEST(TorchFile, TensorZipWriterWritesWhatAppendTorchFileWrites) {
  std::vector<Tensor> ts;
  auto floats_of = [](std::vector<float> v, std::vector<int64_t> shape) {
    return Tensor::from_vector(DType::Float32, std::move(shape), v);
  };
  ts.push_back(floats_of({1.5f, -2.f, 0.25f}, {3}));
  ts.push_back(floats_of({7.f, 8.f, 9.f}, {3}));  // same signature, other values
  ts.push_back(floats_of({7.f, 8.f, 9.f, 1.f}, {2, 2}));
  ts.push_back(floats_of({7.f, 8.f, 9.f, 1.f}, {4}));
  ts.push_back(floats_of({3.f}, {}));
  ts.push_back(floats_of({}, {0}));
  ts.push_back(floats_of({}, {0, 5}));
  ts.push_back(Tensor::from_vector(DType::Int64, {2}, std::vector<int64_t>{5, -6}));
  ts.push_back(Tensor::from_vector(DType::BFloat16, {2}, std::vector<uint16_t>{0x3f80, 0x4000}));
  ts.push_back(Tensor::from_vector(DType::Bool, {3}, std::vector<uint8_t>{1, 0, 1}));
  Tensor base = floats_of({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  ts.push_back(Tensor(base.storage(), 1, {2, 2}, {3, 1}));  // a view: the whole storage is its record
  ts.push_back(Tensor(base.storage(), 0, {3, 2}, {1, 3}));  // transposed strides
  Tensor p = floats_of({1.f, 2.f}, {2});
  p.is_parameter = true;
  ts.push_back(p);
  Tensor g = floats_of({1.f, 2.f}, {2});
  g.requires_grad = true;
  ts.push_back(g);
  Tensor cuda = floats_of({1.f, 2.f}, {2});
  cuda.storage()->location = "cuda:0";
  ts.push_back(cuda);
  auto ramp = [](uint64_t off, std::span<uint8_t> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(off + i);
  };
  ts.push_back(Tensor(Storage::generated(DType::Float32, 6, ramp), 0, {6}, {1}));
  ts.push_back(Tensor(Storage::zero_filled(DType::Float32, 6), 0, {6}, {1}));
  const int64_t big = TensorZipWriter::kMaxBytes / 4 + 1;
  ts.push_back(Tensor(Storage::generated(DType::Float32, big, ramp), 0, {big}, {1}));
  ts.push_back(floats_of({1.5f, -2.f, 0.25f}, {3}));  // the first signature again
  const std::string dir = ucpkit::testing::scratch_dir("torch_file_tensor_zip");
  std::vector<uint64_t> sizes[2];
  for (int way = 0; way < 2; ++way) {
    AtomicFile out(dir + "/" + std::to_string(way));
    out.write(span_of("0123456"sv));  // an offset no multiple of the alignment
    TensorZipWriter zips;
    for (const Tensor& t : ts) sizes[way].push_back(way ? zips.append(out, t) : append_torch_file(out, Value::of_tensor(t)));
    out.commit();
  }
  EXPECT_EQ(sizes[0], sizes[1]);
  const std::string a = ucpkit::testing::file_bytes(dir + "/0"), b = ucpkit::testing::file_bytes(dir + "/1");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b) << "first difference at byte " << std::mismatch(a.begin(), a.end(), b.begin()).first - a.begin();
  // And torch's reader takes each item back with its values.
  auto map = MappedFile::open(dir + "/1");
  uint64_t at = 7;
  auto item = [&](size_t i) {
    uint64_t from = at;
    for (size_t k = 0; k < i; ++k) from += sizes[1][k];
    return load_torch_mapped(MappedFile::slice(map, from, sizes[1][i], "item")).root;
  };
  EXPECT_EQ(floats(item(1)), (std::vector<float>{7.f, 8.f, 9.f}));
  EXPECT_EQ(floats(item(ts.size() - 1)), (std::vector<float>{1.5f, -2.f, 0.25f}));
  EXPECT_TRUE(item(12)->tensor->is_parameter);
  EXPECT_EQ(item(14)->tensor->storage()->location, "cuda:0");
}

// The zips TensorZipWriter makes in an O_DIRECT file's block (AtomicFile::room) and the templates a thread reuses
// without a lock: two writers of other archive prefixes taking turns on one thread, their items crossing the 4 MiB
// blocks, each file the bytes append_torch_file writes with its writer's options.
TEST(TorchFile, TensorZipWritersTakingTurnsWriteWhatAppendTorchFileWrites) {
  const std::string dir = ucpkit::testing::scratch_dir("torch_file_tensor_zip_turns");
  std::vector<Tensor> ts;
  for (int k = 0; k < 4000; ++k) {
    const float v = static_cast<float>(k);
    ts.push_back(k % 3 ? Tensor::from_vector(DType::Float32, {2, 2}, std::vector<float>{v, -v, v, 1.f})
                       : Tensor::from_vector(DType::Float32, {}, std::vector<float>{v}));
  }
  const TorchSaveOptions first{"archive"}, second{"other/prefix"};
  {
    AtomicFile a(dir + "/a", false, AtomicFile::Cache::bypass), b(dir + "/b", false, AtomicFile::Cache::bypass);
    TensorZipWriter za(first), zb(second);
    for (const Tensor& t : ts) {
      za.append(a, t);
      zb.append(b, t);
    }
    a.commit();
    b.commit();
  }
  for (const auto& [name, options] : {std::pair{"a", first}, std::pair{"b", second}}) {
    {
      AtomicFile out(dir + "/want_" + name);
      for (const Tensor& t : ts) append_torch_file(out, Value::of_tensor(t), options);
      out.commit();
    }
    const std::string got = ucpkit::testing::file_bytes(dir + "/" + name);
    const std::string want = ucpkit::testing::file_bytes(dir + "/want_" + name);
    ASSERT_GT(got.size(), size_t{4} << 20) << name;
    EXPECT_TRUE(got == want) << name << ": first difference at byte "
                             << std::mismatch(got.begin(), got.end(), want.begin(), want.end()).first - got.begin();
  }
}

// TensorZipReader: a zip that matches a remembered one but for its data (and serialization id) gives the tensor
// load_torch_mapped gives, over its own bytes, with its CRC-32; any other byte changed, CRC copies that disagree
// or a remembered zip not checked under `verify` send the caller back to parsing (no match).
TEST(TorchFile, TensorZipReaderMatchesZipsThatDifferOnlyInTheirData) {
  const std::string dir = ucpkit::testing::scratch_dir("torch_file_tensor_zip_reader");
  std::vector<uint64_t> at, len;
  {
    AtomicFile out(dir + "/items");
    TensorZipWriter zips;
    for (float v : {1.f, 2.f, 3.f}) {
      at.push_back(out.offset());
      len.push_back(zips.append(out, Tensor::from_vector(DType::Float32, {2, 2}, std::vector<float>{v, v, v, -v})));
    }
    out.commit();
  }
  const std::string bytes = ucpkit::testing::file_bytes(dir + "/items");
  int files = 0;
  auto map_of = [&](const std::string& b) {
    const std::string path = dir + "/variant" + std::to_string(files++);
    std::ofstream(path, std::ios::binary) << b;
    return MappedFile::open(path);
  };
  auto item = [&](const std::shared_ptr<const MappedFile>& map, size_t i) { return MappedFile::slice(map, at[i], len[i], "item"); };
  TensorZipReader reader;
  auto map = MappedFile::open(dir + "/items");
  const Tensor first = load_torch_mapped(item(map, 0)).root->as_tensor();
  const auto records = ZipReader(item(map, 0)).records();
  EXPECT_FALSE(reader.match(map, at[1], len[1], false));  // nothing remembered yet
  reader.remember(map->bytes().subspan(at[0], len[0]), first, records, "archive/data/0", false);
  auto hit = reader.match(map, at[1], len[1], false);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->tensor.to_vector<float>(), (std::vector<float>{2.f, 2.f, 2.f, -2.f}));
  EXPECT_EQ(hit->tensor.shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(hit->record, "archive/data/0");
  EXPECT_EQ(hit->crc, ZipReader(item(map, 1)).find("data/0")->crc32);
  EXPECT_FALSE(reader.match(map, at[1], len[1], true));  // remembered unchecked: parsed under --verify
  reader.remember(map->bytes().subspan(at[0], len[0]), first, records, "archive/data/0", true);
  EXPECT_TRUE(reader.match(map, at[2], len[2], true));
  // A byte of item 2's pickle changed: no match (item 1 still matches).
  std::string damaged = bytes;
  const size_t pkl = damaged.find("FloatStorage", at[2]);
  ASSERT_NE(pkl, std::string::npos);
  damaged[pkl] = 'G';
  auto map1 = map_of(damaged);
  EXPECT_FALSE(reader.match(map1, at[2], len[2], false));
  EXPECT_TRUE(reader.match(map1, at[1], len[1], false));
  // Item 2's data CRC changed in its central entry only: no match.
  damaged = bytes;
  damaged[at[2] + ZipReader(item(map, 2)).find("data/0")->central_entry + 16] ^= 1;
  EXPECT_FALSE(reader.match(map_of(damaged), at[2], len[2], false));
}

TEST(TorchFile, GeneratedStoragesAreListedOnceInPickleOrder) {
  auto fill = [](uint64_t, std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 0); };
  auto a = Storage::generated(DType::Float32, 4, fill);
  auto b = Storage::generated(DType::Float16, 2, fill);
  auto root = Value::list({Value::of_tensor(Tensor(b, 0, {2}, {1})),
                           Value::of_tensor(Tensor::zeros(DType::Float32, {2})),
                           Value::of_tensor(Tensor(a, 0, {4}, {1})), Value::of_tensor(Tensor(b, 1, {1}, {1}))});
  auto g = generated_storages(root);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0], b);
  EXPECT_EQ(g[1], a);
}

TEST(TorchFile, DeferredFileTakesRecordBytesOutOfOrder) {
  auto gen = Storage::generated(DType::Float32, 3, [](uint64_t, std::span<uint8_t>) { FAIL() << "not generated"; });
  auto root = Value::dict();
  root->set_item("g", Value::of_tensor(Tensor(gen, 0, {3}, {1})));
  const std::string dir = ucpkit::testing::scratch_dir("torch_file_deferred");
  {
    DeferredTorchFile d(dir + "/d.pt", root);
    ASSERT_EQ(d.records().size(), 1u);
    EXPECT_EQ(d.records()[0].storage, gen);
    d.write(0, 8, span_of(kValuesLE.substr(8)));
    d.write(0, 0, span_of(kValuesLE.substr(0, 8)));
    const uint64_t n = d.finish();  // before file_size: the name exists once finished
    EXPECT_EQ(n, std::filesystem::file_size(dir + "/d.pt"));
  }
  EXPECT_EQ(floats(load_torch(dir + "/d.pt")->at("g")), (std::vector<float>{1.5f, -2.f, 0.25f}));
  {
    DeferredTorchFile d(dir + "/e.pt", root);
    d.write(0, 0, span_of(kValuesLE.substr(0, 4)));
    std::string msg = error_of([&] { d.finish(); });
    EXPECT_NE(msg.find("internal error: record 0 has 4 of 12 bytes"), std::string::npos) << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/e.pt"));
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "d.pt") << "temporary file left behind";
}

}  // namespace torch_torch_file_test
