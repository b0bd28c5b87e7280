// Bugs found by the hostile-input sweep of issue 16 (items 6, 7, 9, 10, 12): each case fails on the
// code before the fix (a signal, exit 0 with wrong or unreadable output, a silent overflow) and is
// refused with one short line naming the file, or converted correctly, after it. Fixtures:
// bugs_fixtures.py (torch 1.13 files; what torch itself does with each one is asserted there).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/pickle/unpickler.h"
#include "io/tensor.h"
#include "pec/tokens.h"
#include "placement/loads.h"
#include "to_universal/shard_reader.h"
#include "support/paths.h"
#include "support/process.h"
#include "support/files.h"

namespace bugs_test {

namespace fs = std::filesystem;

using ucpkit::testing::file_bytes;

namespace {


// Exit status of `cmd` (128 + signal when a signal ended it), stdout and stderr in *out.
int sh(const std::string& cmd, std::string* out = nullptr) { return ucpkit::testing::run_command_status(cmd, out); }

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("ucpkit_bugs_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// One line: no newline before the final one, and not longer than `max`.
void expect_one_short_line(const std::string& out, size_t max = 400) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  EXPECT_EQ(s.find('\n'), std::string::npos) << out.substr(0, 2000);
  EXPECT_LE(s.size(), max) << out.substr(0, 2000);
}

std::string union_cmd(const std::string& in, const fs::path& out, const std::string& extra = "") {
  return kBin + "/ucp-union -q --no-sync " + extra + " --input " + kFx + "/" + in + " --output " + out.string();
}

}  // namespace

// Item 6: a valid stride-0 (expanded) optimizer partition. release_pages() used numel * element size
// from the view's start, so it told the kernel to drop pages past the one-element storage: the rest
// of the file mapping and whatever memory followed it (heap), a SIGSEGV in about half of the runs.
TEST(StrideZero, ReleasePagesStaysInsideTheStorage) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Bytes "in memory" (a heap copy, like the memory past a file mapping): 64 pages of 0x5a.
  std::vector<uint8_t> bytes(64 * page, 0x5a);
  auto file = ucpkit::MappedFile::from_bytes(bytes, "heap.bin");
  auto st = ucpkit::Storage::mapped(ucpkit::DType::Float32, 1, file, 2 * page);
  const ucpkit::Tensor expanded(st, 0, {static_cast<int64_t>(32 * page / 4)}, {0});
  ucpkit::to_universal::release_pages(expanded);
  for (size_t off = 0; off < file->size(); off += page / 2)
    ASSERT_EQ(file->data()[off], 0x5a) << "byte " << off << " was dropped (zeroed) by release_pages";
}

TEST(StrideZero, UnionOfExpandedEqualsUnionOfDense) {
  const fs::path d = scratch("expanded");
  std::string out;
  ASSERT_EQ(sh(union_cmd("dense", d / "dense"), &out), 0) << out;
  // The crash depended on the memory layout: several runs.
  for (int run = 0; run < 4; ++run) {
    fs::remove_all(d / "exp");
    ASSERT_EQ(sh(union_cmd("expanded", d / "exp"), &out), 0) << "run " << run << ": " << out;
  }
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(d / "dense")) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), d / "dense");
    std::string a = file_bytes(e.path()), b = file_bytes(d / "exp" / rel);
    if (rel == "manifest.json") {  // names its input folder
      for (size_t at; (at = a.find(kFx + "/dense")) != std::string::npos;) a.replace(at, kFx.size() + 6, "IN");
      for (size_t at; (at = b.find(kFx + "/expanded")) != std::string::npos;) b.replace(at, kFx.size() + 9, "IN");
    }
    EXPECT_TRUE(a == b) << rel << " differs between the expanded and the dense input";
    ++files;
  }
  EXPECT_GT(files, 10u);
  fs::remove_all(d);
}

// Item 12: a flipped bit inside a tensor record (CRC-32 left as written) was converted, exit 0.
TEST(ZipCrc, FlippedBitInATensorRecordIsRefused) {
  const fs::path d = scratch("crc");
  std::string out;
  EXPECT_EQ(sh(union_cmd("crcflip", d / "u"), &out), 1) << out;
  EXPECT_NE(out.find("CRC-32 mismatch"), std::string::npos) << out;
  EXPECT_NE(out.find("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"), std::string::npos) << out;
  expect_one_short_line(out);
  EXPECT_FALSE(fs::exists(d / "u"));
  // ucp-extract too.
  EXPECT_EQ(sh(kBin + "/ucp-extract -q --input " + kFx + "/crcflip --output " + (d / "w").string(), &out), 1) << out;
  EXPECT_NE(out.find("CRC-32 mismatch"), std::string::npos) << out;
  // --no-verify: the bytes are taken as they are.
  EXPECT_EQ(sh(union_cmd("crcflip", d / "nv", "--no-verify"), &out), 0) << out;
  fs::remove_all(d);
}

// Item 7: invalid UTF-8 in a pickle string was accepted and written back; torch.load then failed on
// the output (bugs_fixtures.py asserts torch.load refuses the input and accepts the surrogate one).
TEST(PickleUtf8, InvalidUtf8StringIsRefused) {
  const fs::path d = scratch("utf8");
  std::string out;
  EXPECT_EQ(sh(union_cmd("badutf8", d / "u"), &out), 1) << out;
  EXPECT_NE(out.find("invalid UTF-8"), std::string::npos) << out;
  EXPECT_NE(out.find("mp_rank_00_model_states.pt"), std::string::npos) << out;
  EXPECT_EQ(out.find('\xff'), std::string::npos) << "the raw byte is echoed";
  expect_one_short_line(out);
  EXPECT_FALSE(fs::exists(d / "u"));
  // An encoded surrogate is what CPython's BINUNICODE decoding accepts ('surrogatepass'): kept.
  EXPECT_EQ(sh(union_cmd("surrogate", d / "s"), &out), 0) << out;
  fs::remove_all(d);
}

TEST(PickleUtf8, DecodingFollowsCPython) {
  using ucpkit::pickle::unpickle;
  auto pk = [](uint8_t op, const std::string& s) {
    std::string b = "\x80\x02";
    b += static_cast<char>(op);
    if (op == 0x8c || op == 'U') {
      b += static_cast<char>(s.size());
    } else {
      for (int k = 0; k < 4; ++k) b += static_cast<char>((s.size() >> (8 * k)) & 0xff);
    }
    b += s + ".";
    return std::vector<uint8_t>(b.begin(), b.end());
  };
  // Valid: ASCII, 2/3/4-byte forms; a surrogate only in the BINUNICODE family.
  for (uint8_t op : {uint8_t{'X'}, uint8_t{0x8c}, uint8_t{'T'}, uint8_t{'U'}})
    for (const std::string s : {"abc", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"})
      EXPECT_EQ(unpickle(pk(op, s), "t")->s, s);
  EXPECT_EQ(unpickle(pk('X', "\xed\xa0\x80"), "t")->s, "\xed\xa0\x80");
  EXPECT_THROW(unpickle(pk('T', "\xed\xa0\x80"), "t"), ucpkit::Error);
  // Refused as Python refuses them: stray continuation, overlong, > U+10FFFF, truncated, 0xff.
  for (uint8_t op : {uint8_t{'X'}, uint8_t{0x8c}, uint8_t{'T'}, uint8_t{'U'}})
    for (const std::string s : {"\x80", "\xc0\xaf", "\xe0\x80\xaf", "\xf4\x90\x80\x80", "\xe2\x82", "a\xff"}) {
      try {
        unpickle(pk(op, s), "bad.pkl");
        ADD_FAILURE() << "accepted op " << int(op);
      } catch (const ucpkit::Error& e) {
        EXPECT_NE(std::string(e.what()).find("invalid UTF-8"), std::string::npos) << e.what();
      }
    }
}

// Item 9: token counts of 1e300 became INT64_MIN (static_cast of an out-of-range double), NaN/inf
// likewise; a ragged matrix was padded with zeros.
TEST(TokenCounts, OutOfRangeNonFiniteAndRaggedAreRefused) {
  using ucpkit::pec::parse_tokens;
  for (const char* text : {"[[1e300, 2]]", "[[1, 2], [3, 1e19]]", "1e300,2\n", "nan,1\n", "inf,1\n",
                           "moe_layer,expert,tokens\n0,0,1e300\n", "{\"moe_layer\": 0, \"counts\": [1e300]}\n",
                           "[[1, 2, 3], [4, 5]]", "1,2,3\n4,5\n"})
    EXPECT_THROW(
        {
          auto m = parse_tokens(text, "tokens.json");
          ADD_FAILURE() << text << " -> " << (m.empty() || m[0].empty() ? 0 : m[0][0]);
        },
        ucpkit::Error)
        << text;
  // 1,100 rows of 2^53 add up past INT64_MAX: refused, not wrapped.
  std::string sum = "moe_layer,expert,tokens\n";
  for (int i = 0; i < 1100; ++i) sum += "0,0,9007199254740992\n";
  EXPECT_THROW(parse_tokens(sum, "tokens.csv"), ucpkit::Error);
  // The largest exact count is still taken.
  EXPECT_EQ(parse_tokens("[[9007199254740992, 0]]", "t")[0][0], 9007199254740992LL);
}

TEST(TokenCounts, MoeReplaceRefusesLoadsOutOfRange) {
  const fs::path d = scratch("loads");
  const std::string cl = " --nodes 2 --gpus-per-node 2 --slots-per-gpu 2 --output " + (d / "plan.json").string();
  std::string out;
  for (const char* loads : {"[[1e300, 1, 2, 3]]", "[[1e308, 1e308, 1e308, 1e308]]"}) {
    write(d / "loads.json", loads);
    EXPECT_EQ(sh(kBin + "/moe-replace --loads " + (d / "loads.json").string() + cl, &out), 1) << loads << out;
    EXPECT_NE(out.find("out of range"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(d / "plan.json"));
  }
  write(d / "loads.json", "[[9007199254740992, 1, 2, 3]]");
  EXPECT_EQ(sh(kBin + "/moe-replace -q --loads " + (d / "loads.json").string() + cl, &out), 0) << out;
  fs::remove_all(d);
}

// Item 10: 100,000-deep JSON overflowed the stack formatting the error (SIGSEGV); shallower input was
// echoed whole into the error line.
TEST(DeepJson, DepthIsBoundedAndMessagesShort) {
  const fs::path d = scratch("deep");
  const std::string cl = " --nodes 2 --gpus-per-node 2 --slots-per-gpu 2 --output " + (d / "plan.json").string();
  std::string out;
  for (int depth : {100000, 1000, 60}) {
    write(d / "loads.json", "[[[" + std::string(depth, '[') + "1" + std::string(depth, ']') + "]]]");
    EXPECT_EQ(sh(kBin + "/moe-replace --loads " + (d / "loads.json").string() + cl, &out), 1) << depth;
    EXPECT_NE(out.find("loads.json"), std::string::npos) << out.substr(0, 500);
    expect_one_short_line(out, 300);
  }
  // The same bound on previous plans (--previous) and on pec token files.
  write(d / "prev.json", std::string(100000, '[') + std::string(100000, ']'));
  write(d / "loads.json", "[[1, 2, 3, 4]]");
  EXPECT_EQ(sh(kBin + "/moe-replace --loads " + (d / "loads.json").string() + " --previous " +
                   (d / "prev.json").string() + cl,
               &out),
            1);
  EXPECT_NE(out.find("nested deeper"), std::string::npos) << out.substr(0, 500);
  expect_one_short_line(out, 300);
  EXPECT_THROW(ucpkit::pec::parse_tokens(std::string(100000, '[') + std::string(100000, ']'), "t"), ucpkit::Error);
  // A string with control bytes in a bad place: escaped, cut.
  write(d / "loads.json", "[[\"" + std::string(5000, 'x') + "\x01\x1b[2J\"]]");
  EXPECT_EQ(sh(kBin + "/moe-replace --loads " + (d / "loads.json").string() + cl, &out), 1);
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << "control byte echoed";
  expect_one_short_line(out, 300);
  fs::remove_all(d);
}


// Found by the mutation campaign: NEWFALSE turned into EMPTY_LIST for _rebuild_tensor_v2's
// requires_grad; torch.load refuses it ("requires_grad must be a bool", asserted in
// bugs_fixtures.py), ucp-union converted it with exit 0.
TEST(PickleTensor, RequiresGradMustBeABool) {
  const fs::path d = scratch("rgrad");
  std::string out;
  EXPECT_EQ(sh(union_cmd("rgrad_list", d / "u"), &out), 1) << out;
  EXPECT_NE(out.find("requires_grad is a list, not a bool"), std::string::npos) << out;
  expect_one_short_line(out);
  EXPECT_FALSE(fs::exists(d / "u"));
  fs::remove_all(d);
}

// The mutation campaign's last failure kind: a class path damaged into another well-formed one
// (`__builtin__ set` -> `_Wbuiltin__ set`; `collections OrderedDict` -> `collections OrderedDicu`).
// torch.load refuses both (bugs_fixtures.py asserts it); ucp-union copied the model file into its
// output with exit 0. Refused now, with the file and the class named; --trust-module accepts it.
TEST(PickleClassPath, DamagedClassPathIsRefused) {
  const fs::path d = scratch("classpath");
  std::string out;
  EXPECT_EQ(sh(union_cmd("renamed_root", d / "u"), &out), 1) << out;
  EXPECT_NE(out.find("mp_rank_00_model_states.pt"), std::string::npos) << out;
  EXPECT_NE(out.find("_Wbuiltin__.set"), std::string::npos) << out;
  EXPECT_NE(out.find("--trust-module _Wbuiltin__"), std::string::npos) << out;
  expect_one_short_line(out);
  EXPECT_FALSE(fs::exists(d / "u"));
  EXPECT_EQ(sh(kBin + "/ucp-extract -q --input " + kFx + "/renamed_root --output " + (d / "w").string(), &out), 1)
      << out;
  EXPECT_NE(out.find("_Wbuiltin__.set"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(d / "w"));

  EXPECT_EQ(sh(union_cmd("renamed_name", d / "n"), &out), 1) << out;
  EXPECT_NE(out.find("'collections' has no 'OrderedDicu'"), std::string::npos) << out;
  expect_one_short_line(out);
  EXPECT_FALSE(fs::exists(d / "n"));

  // A checkpoint that really pickles such a class: the user says so, and the file is carried through.
  EXPECT_EQ(sh(union_cmd("renamed_root", d / "t", "--trust-module other --trust-module _Wbuiltin__"), &out), 0) << out;
  EXPECT_EQ(file_bytes(fs::path(kFx) / "renamed_root/global_step10/mp_rank_00_model_states.pt"),
            file_bytes(d / "t/mp_rank_00_model_states.pt"));
  // Trusting collections gets past the class check; the root is then no dict (torch.load would fail too).
  EXPECT_EQ(sh(union_cmd("renamed_name", d / "t2", "--trust-module collections"), &out), 1) << out;
  EXPECT_NE(out.find("not a model-states dict"), std::string::npos) << out;
  fs::remove_all(d);
}

}  // namespace bugs_test
