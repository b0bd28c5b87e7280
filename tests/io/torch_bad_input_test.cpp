// Broken inputs: every one must end in a ucpkit::Error naming the file; never a crash, a hang, another
// exception type or a huge allocation. Broken files come from fixtures.py (hand-made pickles, rewritten
// zips) or are cut and damaged here from real torch.save output.
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "io/pickle/class_paths.h"
#include "io/pickle/unpickler.h"
#include "support/process.h"
#include "truth_check.h"
#include "support/errors.h"

namespace iotest {
namespace torch_bad_input_test {
namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// Loading must throw ucpkit::Error whose message names `name`; returns the message.
std::string expect_error(const std::function<void()>& load, const std::string& name) {
  std::string msg;
  ucpkit::testing::within(60s, "loading " + name, [&] {
    try {
      load();
      ADD_FAILURE() << name << ": loaded without error";
    } catch (const ucpkit::Error& e) {
      msg = e.what();
      EXPECT_NE(msg.find(name), std::string::npos) << "message does not name the file: " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << ": threw " << typeid(e).name() << " instead of ucpkit::Error: " << e.what();
    }
  });
  return msg;
}

std::string expect_file_error(const std::string& file) {
  return expect_error([&] { ucpkit::load_torch_file(fixture(file)); }, file);
}

std::string expect_bytes_error(const std::vector<uint8_t>& bytes, const std::string& name) {
  return expect_error([&] { ucpkit::load_torch_bytes(bytes, name); }, name);
}

// Loading must either succeed or throw ucpkit::Error naming the file.
void expect_clean(const std::vector<uint8_t>& bytes, const std::string& name) {
  try {
    auto tf = ucpkit::load_torch_bytes(bytes, name);
    ucpkit::pickle::release_tree(tf.root);
  } catch (const ucpkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << name << ": threw " << typeid(e).name() << " instead of ucpkit::Error: " << e.what();
  }
}

TEST(TorchInputRejection, WrongMagic) {
  expect_file_error("bad_magic.pt");
  expect_file_error("bad_text.pt");
  expect_file_error("bad_empty.pt");
}

TEST(TorchInputRejection, MissingFile) { expect_file_error("does_not_exist.pt"); }

TEST(TorchInputRejection, UnknownOpcode) { expect_file_error("bad_unknown_opcode.pt"); }
TEST(TorchInputRejection, PickleWithoutStop) { expect_file_error("bad_no_stop.pt"); }
TEST(TorchInputRejection, StackUnderflow) { expect_file_error("bad_stack_underflow.pt"); }
TEST(TorchInputRejection, MemoGetOfUnsetSlot) { expect_file_error("bad_memo_get.pt"); }

TEST(TorchInputRejection, AbsurdLengths) {
  long before = max_rss_kib();
  expect_file_error("bad_huge_unicode.pt");
  expect_file_error("bad_huge_bytes8.pt");
  expect_file_error("bad_huge_long4.pt");
  expect_file_error("bad_legacy_count.pt");
  EXPECT_LT(max_rss_kib() - before, 256 * 1024) << "absurd length fields must not be allocated";
}

TEST(TorchInputRejection, DeepNesting) {
  expect_file_error("bad_deep_lists.pt");
  expect_file_error("bad_deep_tuples.pt");
  expect_file_error("bad_deep_dicts.pt");
}

TEST(TorchInputRejection, ReferenceCycles) {
  expect_file_error("bad_cycle_list.pt");
  expect_file_error("bad_cycle_dict.pt");
}

TEST(TorchInputRejection, StorageShorterThanItsTensors) {
  expect_file_error("bad_short_storage.pt");
  expect_file_error("bad_view_past_storage.pt");
  expect_file_error("bad_legacy_short.pt");
}

TEST(TorchInputRejection, MissingRecords) {
  expect_file_error("bad_missing_storage.pt");
  expect_file_error("bad_missing_pickle.pt");
  expect_file_error("bad_pid_key.pt");
}

// Every prefix of a valid file is invalid (zip: the directory is at the end; legacy: the last storage
// is cut). Many cut points in the directory, the pickle and the storages.
void check_truncations(const std::string& file, size_t max_cuts) {
  auto bytes = read_bytes(fixture(file));
  ASSERT_GT(bytes.size(), 100u);
  std::vector<size_t> cuts;
  for (size_t i = 0; i < 200 && i < bytes.size(); ++i) cuts.push_back(i);                 // the header
  for (size_t i = 1; i <= 300 && i < bytes.size(); ++i) cuts.push_back(bytes.size() - i);  // directory / tail
  std::mt19937_64 rng(7);
  while (cuts.size() < max_cuts) cuts.push_back(rng() % bytes.size());
  for (size_t cut : cuts) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(cut));
    std::string name = file + "@cut" + std::to_string(cut);
    expect_bytes_error(prefix, name);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "first failing cut: " << cut << " of " << bytes.size();
      return;
    }
  }
}
TEST(TorchInputRejection, TruncatedZip) { check_truncations("basic.pt", 1000); }
TEST(TorchInputRejection, TruncatedZipTensors) { check_truncations("shared_storage.pt", 1000); }
TEST(TorchInputRejection, TruncatedZipCheckpoint) { check_truncations("zero_pp_rank_0_mp_rank_00_optim_states.pt", 800); }
TEST(TorchInputRejection, TruncatedLegacy) { check_truncations("legacy_basic.pt", 1000); }
TEST(TorchInputRejection, TruncatedLegacyTensors) { check_truncations("legacy_single.pt", 400); }
TEST(TorchInputRejection, TruncatedLegacyCheckpoint) { check_truncations("legacy_mp_rank_00_model_states.pt", 800); }

// ---- damaged zip directories (offsets from the end-of-central-directory record) ----

struct ZipLayout {
  size_t eocd = 0, cd_offset = 0, first_cd = 0;
};
ZipLayout layout(const std::vector<uint8_t>& b) {
  ZipLayout l;
  for (size_t i = b.size() - 22;; --i) {
    if (b[i] == 'P' && b[i + 1] == 'K' && b[i + 2] == 5 && b[i + 3] == 6) {
      l.eocd = i;
      break;
    }
    if (i == 0) throw std::runtime_error("no EOCD");
  }
  uint32_t off;
  std::memcpy(&off, &b[l.eocd + 16], 4);
  l.cd_offset = l.first_cd = off;
  return l;
}
template <typename T>
std::vector<uint8_t> poke(std::vector<uint8_t> b, size_t at, T v) {
  std::memcpy(&b[at], &v, sizeof(T));
  return b;
}

TEST(TorchInputRejection, DamagedZipDirectory) {
  auto b = read_bytes(fixture("single_dict.pt"));
  ZipLayout l = layout(b);
  ASSERT_EQ(b[l.first_cd], 'P');
  ASSERT_EQ(b[l.first_cd + 2], 1);
  expect_bytes_error(poke<uint32_t>(b, l.eocd + 16, 0xFFFFFF00u), "cd-offset-past-end.pt");
  expect_bytes_error(poke<uint32_t>(b, l.eocd + 16, static_cast<uint32_t>(l.cd_offset + 7)), "cd-offset-skewed.pt");
  expect_bytes_error(poke<uint32_t>(b, l.eocd + 12, 0xFFFFFF00u), "cd-size-huge.pt");
  expect_bytes_error(poke<uint16_t>(poke<uint16_t>(b, l.eocd + 10, 0xFF), l.eocd + 8, 0xFF), "cd-count-too-big.pt");
  // torch (miniz) also writes ZIP64 end records; 0xFFFF in the plain record defers to them
  if (l.eocd >= 20 && b[l.eocd - 20] == 'P' && b[l.eocd - 19] == 'K' && b[l.eocd - 18] == 6 && b[l.eocd - 17] == 7) {
    uint64_t z64;
    std::memcpy(&z64, &b[l.eocd - 20 + 8], 8);
    ASSERT_LT(z64 + 56, b.size());
    auto marked = poke<uint16_t>(poke<uint16_t>(b, l.eocd + 10, 0xFFFF), l.eocd + 8, 0xFFFF);
    expect_bytes_error(poke<uint64_t>(marked, z64 + 32, uint64_t{1} << 60), "zip64-count-huge.pt");
    expect_bytes_error(poke<uint64_t>(poke<uint32_t>(b, l.eocd + 16, 0xFFFFFFFFu), z64 + 48, uint64_t{1} << 62),
                       "zip64-cd-offset-huge.pt");
    expect_bytes_error(poke<uint64_t>(poke<uint32_t>(b, l.eocd + 16, 0xFFFFFFFFu), l.eocd - 20 + 8, uint64_t{1} << 62),
                       "zip64-locator-offset-huge.pt");
  }
  expect_bytes_error(poke<uint32_t>(b, l.first_cd, 0x12345678u), "cd-signature.pt");
  expect_bytes_error(poke<uint32_t>(b, l.first_cd + 42, 0xFFFFFF00u), "local-offset-past-end.pt");
  expect_bytes_error(poke<uint16_t>(b, l.first_cd + 28, 0xFFFF), "name-length-huge.pt");
  expect_bytes_error(poke<uint32_t>(b, l.eocd, 0x0u), "eocd-signature.pt");
  // every directory entry's sizes made absurd in turn (some entry is a storage or the pickle)
  for (size_t at = l.first_cd; at + 46 < l.eocd;) {
    uint16_t n, x, c;
    std::memcpy(&n, &b[at + 28], 2);
    std::memcpy(&x, &b[at + 30], 2);
    std::memcpy(&c, &b[at + 32], 2);
    std::string entry(reinterpret_cast<const char*>(&b[at + 46]), n);
    if (entry.find("data") != std::string::npos) {
      auto big = poke<uint32_t>(poke<uint32_t>(b, at + 20, 0xFFFFFF00u), at + 24, 0xFFFFFF00u);
      expect_bytes_error(big, "record-size-huge-" + std::to_string(at) + ".pt");
      auto past = poke<uint32_t>(b, at + 42, static_cast<uint32_t>(l.cd_offset - 10));
      expect_bytes_error(past, "record-at-end-" + std::to_string(at) + ".pt");
    }
    at += 46 + n + x + c;
  }
}

// Random single-byte and multi-byte corruption of real files: load or a clean Error, nothing else.
void mutate_file(const std::string& file, int rounds, uint64_t seed) {
  auto b = read_bytes(fixture(file));
  std::mt19937_64 rng(seed);
  ucpkit::testing::within(300s, "mutations of " + file, [&] {
    for (int r = 0; r < rounds; ++r) {
      auto m = b;
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) m[rng() % m.size()] = static_cast<uint8_t>(rng());
      expect_clean(m, file + "#mut" + std::to_string(r));
      if (::testing::Test::HasFailure()) return;
    }
  });
}
TEST(TorchInputRejection, RandomMutationsZip) { mutate_file("basic.pt", 3000, 1); }
// real torch 2.11 files (_rebuild_from_type_v2, _rebuild_parameter_with_state, torch 2.x records)
TEST(TorchInputRejection, TruncatedTorch2Zero3) { check_truncations("torch2_real_zero3.pt", 800); }
TEST(TorchInputRejection, RandomMutationsTorch2) { mutate_file("torch2_real_values.pt", 1500, 3); }
TEST(TorchInputRejection, RandomMutationsZipCheckpoint) { mutate_file("zero_pp_rank_0_mp_rank_00_optim_states.pt", 1500, 2); }
TEST(TorchInputRejection, RandomMutationsLegacy) { mutate_file("legacy_objects.pt", 3000, 3); }

// Constructing a view that does not fit its storage is an Error, not a later out-of-bounds read.
TEST(TorchInputRejection, TensorViewOutsideStorage) {
  auto s = ucpkit::Storage::zeros(DType::Float32, 10);
  EXPECT_THROW(Tensor(s, 0, {11}, {1}), ucpkit::Error);
  EXPECT_THROW(Tensor(s, 5, {2, 3}, {3, 1}), ucpkit::Error);
  EXPECT_THROW(Tensor(s, -1, {2}, {1}), ucpkit::Error);
  EXPECT_THROW(Tensor(s, 0, {2}, {-1}), ucpkit::Error);
  EXPECT_THROW(Tensor(s, 0, {int64_t{1} << 62, 4}, {4, 1}), ucpkit::Error);
  EXPECT_NO_THROW(Tensor(s, 4, {2, 3}, {3, 1}));
  EXPECT_NO_THROW(Tensor(s, 10, {0}, {1}));
}

// Mutation campaign findings (docs/reliability.md): damage that CPython's unpickler, and so torch.load,
// refuses must be refused here too, or ucp-union copies the damaged file into its output with exit 0.
std::string unpickle_error(const std::string& pkl) {
  std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size());
  return ucpkit::testing::error_of([&] { ucpkit::pickle::unpickle(bytes, "damaged.pkl"); });
}

TEST(PickleDamage, MemoIndexBeyondThePickleIsRefused) {
  // [] memoized at index 0xf6000000 (a flipped high byte of LONG_BINPUT): CPython raises MemoryError.
  static const char huge[] = "\x80\x02]r\x00\x00\x00\xf6.";
  const std::string msg = unpickle_error(std::string(huge, sizeof(huge) - 1));
  EXPECT_NE(msg.find("damaged.pkl"), std::string::npos) << msg;
  EXPECT_NE(msg.find("memo index"), std::string::npos) << msg;
  // The same list memoized at 5 (indices need not be dense) and fetched back is fine.
  static const char ok[] = "\x80\x02]r\x05\x00\x00\x00" "0" "h\x05.";
  EXPECT_EQ(unpickle_error(std::string(ok, sizeof(ok) - 1)), "");
}

TEST(PickleDamage, ReduceOfAValueThatCannotBeCalledIsRefused) {
  // BINGET fetched a tuple where the callable was: REDUCE((), ()) -> "'tuple' object is not callable".
  static const char tuple_call[] = "\x80\x02))R.";
  std::string msg = unpickle_error(std::string(tuple_call, sizeof(tuple_call) - 1));
  EXPECT_NE(msg.find("REDUCE of a value that cannot be called"), std::string::npos) << msg;
  static const char list_new[] = "\x80\x02])\x81.";  // NEWOBJ with a list as the class
  msg = unpickle_error(std::string(list_new, sizeof(list_new) - 1));
  EXPECT_NE(msg.find("NEWOBJ of a value that cannot be called"), std::string::npos) << msg;
  // A class reference (memoized, fetched back by BINGET as torch's pickles do) is fine.
  static const char ok[] = "\x80\x02" "ccollections\nOrderedDict\n" "q\x00" "0" "h\x00" ")R.";
  EXPECT_EQ(unpickle_error(std::string(ok, sizeof(ok) - 1)), "");
}

// A class path damaged into another well-formed one (the campaign's last failure kind): torch.load
// cannot import it; refused unless trusted (lib/io/pickle/class_paths, tests/io/class_paths_test.cpp).
TEST(PickleDamage, ClassPathOutsideTheAllowListIsRefused) {
  ucpkit::pickle::reset_trusted_modules();
  const std::string global = "\x80\x02" "c_Wbuiltin__\nset\n" ")R.";
  std::string msg = unpickle_error(global);
  EXPECT_NE(msg.find("damaged.pkl"), std::string::npos) << msg;
  EXPECT_NE(msg.find("_Wbuiltin__.set"), std::string::npos) << msg;
  // Protocol 4's STACK_GLOBAL (two SHORT_BINUNICODE strings).
  const std::string stack = std::string("\x80\x04\x8c\x0b" "collections" "\x8c\x0b" "OrderedDicu" "\x93" ")R.", 32);
  msg = unpickle_error(stack);
  EXPECT_NE(msg.find("OrderedDicu"), std::string::npos) << msg;
  EXPECT_EQ(unpickle_error("\x80\x02" "c__builtin__\nset\n" ")R."), "");
  ucpkit::pickle::trust_modules({"_Wbuiltin__"});
  EXPECT_EQ(unpickle_error(global), "");
  ucpkit::pickle::reset_trusted_modules();
}


}  // namespace
}  // namespace torch_bad_input_test
}  // namespace iotest
