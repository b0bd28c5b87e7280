// formats/dcp writer: every committed real DCP checkpoint (tests/formats/dcp/data) read, written by
// our writer (chunks as stored, and re-chunked for other meshes) and read back: every tensor equals
// the truth the saving script recorded, bit for bit; every stored chunk and bytes item equals the
// source's. The `.metadata` has the classes, field names and state shapes torch 2.6's own has (the
// committed torch 2.6 `.metadata` is the reference). Whether real torch's dcp.load accepts our output
// is checked outside CI by scripts/verify/dcp_verify.sh (docs/formats-dcp.md, "Writing").
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/mapped_file.h"
#include "formats/dcp/dcp_data.h"
#include "formats/dcp/reader.h"
#include "formats/dcp/rewrite.h"
#include "formats/dcp/writer.h"
#include "io/pickle/unpickler.h"
#include "io/safetensors_file.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"
#include "support/process.h"

namespace dcp_writer_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::formats::dcp;
using pickle::Kind;
using pickle::ValuePtr;
using ucpkit::testing::slurp;

namespace {

const std::string& kData = ucpkit::testing::kDcpData;

// Every variant with a truth; rank-local parts each hold the whole state (see data/README.md).
const std::vector<std::pair<std::string, std::string>> kVariants = {
    {"fsdp_w2", "fsdp_w2"},           {"twod_w4", "twod_w4"},       {"fsdp_optim_w2", "fsdp_optim_w2"},
    {"fsdp_tp_optim_w4", "fsdp_tp_optim_w4"}, {"plain_w2", "plain_w2"}, {"single_item_w1", "single_item_w1"},
    {"torch113_w2", "torch113_w2"},   {"ranklocal_w2/rank_0", "ranklocal_w2"}, {"ranklocal_w2/rank_1", "ranklocal_w2"}};

// Same dtype, shape and bytes (zero-element tensors: dtype and shape).
bool same_bytes(const Tensor& a, const Tensor& b) { return a.equal(b); }

// The truth as a tensor of `dtype` (checked to be the truth's by its safetensors name).
Tensor truth_tensor(const SafetensorsTensor& t, DType dtype) {
  EXPECT_EQ(dtype_safetensors_name(dtype), t.dtype);
  return Tensor::from_bytes(dtype, t.shape, std::vector<uint8_t>(t.bytes.begin(), t.bytes.end()));
}

// Every tensor of `dir` equals the truth (same key set): each stored chunk equals the truth's box, the
// chunks tile the tensor, and the assembled tensor (read_tensor) equals the truth, tensors with an
// empty chunk included; every bytes item equals `source`'s.
void expect_truth(const std::string& dir, const std::string& truth_variant, const Reader& source) {
  const std::string tp = kData + "/" + truth_variant + ".truth/tensors.safetensors";
  const auto truth = parse_safetensors(slurp(tp), tp);
  const Reader r(dir);
  std::set<std::string> keys, want;
  for (const auto& [k, v] : truth) want.insert(k);
  for (const Entry& e : r.metadata().entries) {
    if (e.is_bytes) {
      EXPECT_EQ(r.read_bytes(e.fqn), source.read_bytes(e.fqn)) << e.fqn;
      continue;
    }
    keys.insert(e.fqn);
    const auto it = truth.find(e.fqn);
    if (it == truth.end()) continue;
    const Tensor want_t = truth_tensor(it->second, e.dtype);
    check_chunks_cover(e, dir);
    for (size_t k = 0; k < e.chunks.size(); ++k) {
      const Tensor c = r.read_chunk(e.fqn, k);
      EXPECT_TRUE(same_bytes(c, cut_box(want_t, e.chunks[k]))) << dir << " " << e.fqn << " chunk " << k;
    }
    EXPECT_TRUE(same_bytes(r.read_tensor(e.fqn), want_t)) << dir << " " << e.fqn << ": values differ";
  }
  EXPECT_EQ(keys, want) << dir;
  EXPECT_EQ(r.metadata().entries.size(), source.metadata().entries.size());
}

// The data files hold the items back to back from byte 0, nothing else.
void expect_items_packed(const std::string& dir) {
  const Metadata md = read_metadata(dir + "/.metadata");
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> by_file;
  for (const Item& it : md.items) by_file[it.storage.relative_path].push_back({it.storage.offset, it.storage.length});
  for (auto& [file, spans] : by_file) {
    std::sort(spans.begin(), spans.end());
    uint64_t at = 0;
    for (const auto& [off, len] : spans) {
      EXPECT_EQ(off, at) << file;
      at = off + len;
    }
    EXPECT_EQ(at, fs::file_size(dir + "/" + file)) << file;
  }
}

// A rendering of a pickled value that keeps classes, field names, strings, bools and structure and
// drops the numbers (item offsets and lengths depend on the zip writer).
std::string shape_of(const ValuePtr& v) {
  switch (v->kind) {
    case Kind::Object: {
      const auto& o = *v->object;
      std::string s = v->class_path() + "<" + std::to_string(static_cast<int>(o.build)) + ">";
      if (o.args) s += shape_of(o.args);
      if (o.state) s += "." + shape_of(o.state);
      return s;
    }
    case Kind::Dict: {
      std::string s = "{";
      for (const auto& [k, x] : v->entries) s += shape_of(k) + ":" + shape_of(x) + ",";
      return s + "}";
    }
    case Kind::Tuple:
    case Kind::List: {
      std::string s = v->kind == Kind::Tuple ? "(" : "[";
      for (const auto& x : v->items) s += shape_of(x) + ",";
      return s + (v->kind == Kind::Tuple ? ")" : "]");
    }
    case Kind::Shape: return "Size" + std::to_string(v->shape.size());
    case Kind::Dtype: return "torch." + std::string(dtype_name(v->dtype));
    case Kind::Global: return "G:" + v->s + "." + v->name;
    case Kind::Str: return "'" + v->s + "'";
    case Kind::Bool: return v->b ? "True" : "False";
    default: return std::string(pickle::kind_name(v->kind));
  }
}

ValuePtr unpickled(const std::string& file) {
  const std::string b = slurp(file);
  return pickle::unpickle({reinterpret_cast<const uint8_t*>(b.data()), b.size()}, file);
}

}  // namespace

// Read -> write with the chunks as stored -> read: every tensor and every stored chunk bit-exact.
TEST(DcpWriter, RoundTripOfEveryFixtureAsStored) {
  const std::string root = ucpkit::testing::scratch_dir("dcp_writer_as_stored");
  for (const auto& [variant, truth] : kVariants) {
    SCOPED_TRACE(variant);
    const std::string in = kData + "/" + variant, out = root + "/" + std::to_string(&variant - &kVariants[0].first);
    const WriteResult w = rewrite_dcp(in, out, std::nullopt);
    const Reader src(in), ours(out);
    expect_truth(out, truth, src);
    expect_items_packed(out);
    size_t chunks = 0;
    for (const Entry& e : src.metadata().entries) {
      if (e.is_bytes) continue;
      const Entry* o = ours.metadata().find(e.fqn);
      ASSERT_NE(o, nullptr);
      ASSERT_EQ(o->chunks.size(), e.chunks.size());
      for (size_t k = 0; k < e.chunks.size(); ++k, ++chunks) {
        EXPECT_EQ(o->chunks[k].offsets, e.chunks[k].offsets);
        EXPECT_TRUE(same_bytes(ours.read_chunk(e.fqn, k), src.read_chunk(e.fqn, k))) << e.fqn << " chunk " << k;
      }
    }
    EXPECT_EQ(w.storage.size(), src.metadata().items.size());
    EXPECT_GT(chunks, 0u);
    EXPECT_EQ(ours.metadata().era, ClassEra::Current);
    // Each chunk stays with the rank that wrote it.
    for (const Item& it : ours.metadata().items)
      EXPECT_EQ(it.storage.relative_path, data_file_name(rank_of_data_file(src.metadata().item_of(it.fqn, it.offset ? &*it.offset : nullptr).storage.relative_path)));
  }
}

// Read -> write re-chunked (whole tensors; rows, columns and a 2-D grid for 2, 3 and 4 ranks) -> read.
TEST(DcpWriter, RoundTripOfEveryFixtureRechunked) {
  const std::string root = ucpkit::testing::scratch_dir("dcp_writer_rechunked");
  const std::vector<std::pair<std::string, Target>> targets = {
      {"whole", Target::whole()}, {"rows2", Target::rows(2)},     {"rows3", Target::rows(3)},
      {"cols4", Target::columns(4)}, {"grid4", Target::grid(4, 2)}};
  for (const auto& [variant, truth] : kVariants)
    for (const auto& [name, target] : targets) {
      SCOPED_TRACE(variant + " -> " + name);
      const std::string in = kData + "/" + variant;
      const std::string out = root + "/" + std::to_string(&variant - &kVariants[0].first) + "_" + name;
      rewrite_dcp(in, out, target);
      const Reader src(in);
      expect_truth(out, truth, src);
      expect_items_packed(out);
      // The chunks are the plan's (torch's boxes for that mesh), in the plan's files.
      const SavePlan plan = make_save_plan(src.metadata().entries, target);
      const Metadata md = read_metadata(out + "/.metadata");
      for (const Entry& e : plan.entries) {
        const Entry* o = md.find(e.fqn);
        ASSERT_NE(o, nullptr);
        ASSERT_EQ(o->chunks.size(), e.chunks.size()) << e.fqn;
        for (size_t k = 0; k < e.chunks.size(); ++k) EXPECT_EQ(o->chunks[k].sizes, e.chunks[k].sizes) << e.fqn;
      }
      std::set<std::string> files;
      for (const Item& it : md.items) files.insert(it.storage.relative_path);
      EXPECT_EQ(files.size(), plan.files.size());
    }
}

// Our `.metadata` for fsdp_w2 (chunks as stored) has, entry by entry and item by item, the classes,
// constructors, field names and state tuples of torch 2.6's own (numbers aside); planner_data is
// carried over exactly. StorageMeta differs only in values (checkpoint_id a str, not a PosixPath).
TEST(DcpWriter, MetadataHasTorch26ClassesAndStates) {
  for (const std::string variant : {"fsdp_w2", "fsdp_optim_w2", "twod_w4"}) {
    SCOPED_TRACE(variant);
    const std::string in = kData + "/" + variant;
    const std::string out = ucpkit::testing::scratch_dir("dcp_writer_classes_" + variant) + "/out";
    rewrite_dcp(in, out, std::nullopt);
    const ValuePtr theirs = unpickled(in + "/.metadata"), ours = unpickled(out + "/.metadata");
    EXPECT_EQ(ours->class_path(), "torch.distributed.checkpoint.metadata.Metadata");
    EXPECT_EQ(ours->class_path(), theirs->class_path());
    const ValuePtr ts = theirs->object->state, os = ours->object->state;
    ASSERT_EQ(ts->entries.size(), os->entries.size());
    for (size_t k = 0; k < ts->entries.size(); ++k) EXPECT_EQ(shape_of(os->entries[k].first), shape_of(ts->entries[k].first));
    // state_dict_metadata, by fqn
    std::map<std::string, std::string> t_sdm, o_sdm;
    for (const auto& [k, v] : theirs->attr("state_dict_metadata")->entries) t_sdm[k->s] = shape_of(v);
    for (const auto& [k, v] : ours->attr("state_dict_metadata")->entries) o_sdm[k->s] = shape_of(v);
    EXPECT_EQ(o_sdm, t_sdm);
    EXPECT_NE(o_sdm.begin()->second.find("TensorProperties<1>().(torch.float32,torch.serialization._get_layout<0>('torch.strided',),False,"
                                         "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING<0>(int,),False,)"),
              std::string::npos)
        << o_sdm.begin()->second;
    // storage_data, as a multiset of (key, value) renderings
    std::multiset<std::string> t_sd, o_sd;
    for (const auto& [k, v] : theirs->attr("storage_data")->entries) t_sd.insert(shape_of(k) + "=" + shape_of(v));
    for (const auto& [k, v] : ours->attr("storage_data")->entries) o_sd.insert(shape_of(k) + "=" + shape_of(v));
    EXPECT_EQ(o_sd, t_sd);
    EXPECT_EQ(shape_of(ours->attr("planner_data")), shape_of(theirs->attr("planner_data")));
    std::vector<std::string> t_meta, o_meta;
    for (const auto& [k, v] : theirs->attr("storage_meta")->object->state->entries) t_meta.push_back(k->s);
    for (const auto& [k, v] : ours->attr("storage_meta")->object->state->entries) o_meta.push_back(k->s);
    EXPECT_EQ(o_meta, t_meta);
    EXPECT_EQ(ours->attr("storage_meta")->class_path(), theirs->attr("storage_meta")->class_path());
  }
}

// Each tensor item is a complete torch.save zip of its chunk alone (its own storage, no more bytes).
TEST(DcpWriter, TensorItemsAreWholeTorchSaveZips) {
  const std::string out = ucpkit::testing::scratch_dir("dcp_writer_zips") + "/out";
  rewrite_dcp(kData + "/fsdp_w2", out, Target::rows(4));
  const Metadata md = read_metadata(out + "/.metadata");
  for (const Item& it : md.items) {
    const std::string all = slurp(out + "/" + it.storage.relative_path);
    const std::span<const uint8_t> item(reinterpret_cast<const uint8_t*>(all.data()) + it.storage.offset, it.storage.length);
    ASSERT_EQ(item[0], 'P');
    ASSERT_EQ(item[1], 'K');
    TorchFile tf = load_torch_bytes(item, it.fqn);
    ASSERT_EQ(tf.root->kind, Kind::Tensor);
    const Tensor& t = tf.root->as_tensor();
    EXPECT_EQ(t.storage()->numel(), t.numel()) << it.fqn;
    EXPECT_EQ(t.storage_offset(), 0);
  }
}

// Rows cut from tensors stored whole: the writer takes each part's CRC-32 of a large one from the whole's, checked as
// it was read (the last part's found from the whole's and the others'), not from a pass of its own; every record's
// CRC-32 of every item of 2, 3 and 4 parts equals zlib's of its bytes (rows that do not divide evenly too).
TEST(DcpWriter, PartsOfAWholeItemHaveTheirOwnCrcs) {
  const std::string dir = ucpkit::testing::scratch_dir("dcp_writer_part_crcs");
  const std::vector<Entry> entries = {{"big", false, DType::Float32, {96, 256}, {}},
                                      {"odd", false, DType::Float32, {7, 4096}, {}},
                                      {"small", false, DType::Float32, {6, 4}, {}}};
  const ChunkSource values{[](const Entry& e, size_t) {
                             std::vector<float> v(static_cast<size_t>(e.size[0] * e.size[1]));
                             for (size_t i = 0; i < v.size(); ++i)
                               v[i] = static_cast<float>(i % 1000) + 0.25f * e.fqn.size();
                             return Tensor::from_vector(DType::Float32, e.size, v);
                           },
                           {}};
  write_dcp(make_save_plan(entries, Target::whole()), values, dir + "/in");
  for (const int64_t ranks : {2, 3, 4}) {
    SCOPED_TRACE(ranks);
    const std::string out = dir + "/rows" + std::to_string(ranks);
    rewrite_dcp(dir + "/in", out, Target::rows(ranks));
    const Metadata md = read_metadata(out + "/.metadata");
    size_t parts = 0;
    for (const Item& it : md.items) {
      const std::string all = slurp(out + "/" + it.storage.relative_path);
      const std::span<const uint8_t> item(reinterpret_cast<const uint8_t*>(all.data()) + it.storage.offset,
                                          it.storage.length);
      TorchLoadOptions check;
      check.verify_crc = true;
      EXPECT_NO_THROW(load_torch_bytes(item, it.fqn, check)) << it.fqn;
      ++parts;
    }
    EXPECT_EQ(parts, 3u * static_cast<size_t>(ranks));
    const Reader src(dir + "/in"), ours(out);
    for (const Entry& e : entries) EXPECT_TRUE(same_bytes(ours.read_tensor(e.fqn), src.read_tensor(e.fqn))) << e.fqn;
  }
}

// A source chunk of the wrong shape: one Error naming the output folder and the fqn, nothing left where the folder was to be.
TEST(DcpWriter, BadSourceLeavesNothing) {
  const std::string dir = ucpkit::testing::scratch_dir("dcp_writer_bad");
  const std::string out = dir + "/out";
  std::vector<Entry> entries{{"a", false, DType::Float32, {4, 2}, {}}};
  const SavePlan plan = make_save_plan(entries, Target::rows(2));
  ChunkSource src{[](const Entry&, size_t) { return Tensor::zeros(DType::Float32, {3, 2}); }, {}};
  const std::string msg = ucpkit::testing::error_of([&] { write_dcp(plan, src, out); });
  EXPECT_NE(msg.find("'a'"), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind(out + ": ", 0), 0u) << msg;  // names the folder being written
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(dir)) << "staging folder left behind";
  // An existing folder is kept unless overwrite.
  fs::create_directories(out);
  ChunkSource good{[](const Entry&, size_t) { return Tensor::zeros(DType::Float32, {2, 2}); }, {}};
  EXPECT_NE(ucpkit::testing::error_of([&] { write_dcp(plan, good, out); }), "");
  EXPECT_TRUE(fs::is_empty(out));
  WriteOptions o;
  o.overwrite = true;
  write_dcp(plan, good, out, o);
  EXPECT_TRUE(fs::exists(out + "/.metadata"));
  // A plan whose chunks leave a gap is refused before anything is written.
  SavePlan gap = plan;
  gap.entries[0].chunks.pop_back();
  EXPECT_NE(ucpkit::testing::error_of([&] { write_dcp(gap, good, dir + "/gap"); }).find("leave a gap"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/gap"));
}

// A write order sets the order of each data file's items (a source called in that order); the .metadata lists them in
// plan order and every value reads back. An order that leaves an item out or names one twice is refused, nothing left.
TEST(DcpWriter, AWriteOrderOrdersEachFilesItemsAndTheMetadataStaysInPlanOrder) {
  const std::string dir = ucpkit::testing::scratch_dir("dcp_writer_order");
  std::vector<Entry> entries{{"a", false, DType::Float32, {4, 2}, {}}, {"b", false, DType::Float32, {4, 2}, {}},
                             {"n", true, DType::Float32, {}, {}}};
  SavePlan plan = make_save_plan(entries, Target::rows(2));
  ASSERT_EQ(plan.files.size(), 2u);
  plan.write_order = {{2, PlannedItem::kBytes}, {1, 0}, {0, 0}, {1, 1}, {0, 1}};
  std::vector<std::string> called;
  auto value = [](const Entry& e, size_t c) {
    std::vector<float> v(4);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((e.fqn == "a" ? 100 : 200) + 10 * c + i);
    return Tensor::from_vector(DType::Float32, {2, 2}, v);
  };
  ChunkSource src{[&](const Entry& e, size_t c) {
                    called.push_back(e.fqn + std::to_string(c));
                    return value(e, c);
                  },
                  [](const Entry&) { return std::vector<uint8_t>{1, 2, 3}; }};
  write_dcp(plan, src, dir + "/out");
  EXPECT_EQ(called, (std::vector<std::string>{"b0", "a0", "b1", "a1"}));
  const Metadata md = read_metadata(dir + "/out/.metadata");
  std::vector<std::string> listed;
  for (const Item& it : md.items) listed.push_back(it.fqn);
  EXPECT_EQ(listed, (std::vector<std::string>{"a", "a", "b", "b", "n"}));
  std::map<std::string, std::vector<std::string>> by_offset;  // file -> fqns in the order they lie in it
  std::map<std::string, std::map<uint64_t, std::string>> at;
  for (const Item& it : md.items) at[it.storage.relative_path][it.storage.offset] = it.fqn;
  for (const auto& [file, items] : at)
    for (const auto& [off, fqn] : items) by_offset[file].push_back(fqn);
  const int64_t bytes_rank = plan.files[0].items.size() == 3 ? plan.files[0].rank : plan.files[1].rank;
  for (int64_t r = 0; r < 2; ++r)
    EXPECT_EQ(by_offset.at(data_file_name(r)), r == bytes_rank ? (std::vector<std::string>{"n", "b", "a"})
                                                               : (std::vector<std::string>{"b", "a"}));
  const Reader r(dir + "/out");
  for (const Entry& e : entries)
    if (!e.is_bytes)
      for (size_t c = 0; c < 2; ++c) EXPECT_TRUE(r.read_chunk(e.fqn, c).equal(value(e, c))) << e.fqn << c;
  EXPECT_EQ(r.read_bytes("n"), (std::vector<uint8_t>{1, 2, 3}));

  for (auto bad : {std::vector<PlannedItem>{{2, PlannedItem::kBytes}, {1, 0}, {0, 0}, {1, 1}},
                   std::vector<PlannedItem>{{2, PlannedItem::kBytes}, {1, 0}, {0, 0}, {1, 1}, {1, 1}}}) {
    plan.write_order = bad;
    EXPECT_NE(ucpkit::testing::error_of([&] { write_dcp(plan, src, dir + "/bad"); }).find("write order"), std::string::npos);
    EXPECT_FALSE(fs::exists(dir + "/bad"));
  }
}

TEST(DcpWriter, MetadataPickledWhileTheItemsAreWrittenIsThePickleOfThemAll) {
  // write_dcp pickles each item on its own thread as the data files take it; the bytes must be those of the items
  // pickled at the end: 2,401 items, so SETITEMS batches of 1,000 and a rest, a bytes item last. With names of 4,000
  // characters the pickle is over 4 MiB: written to the file as it grows (O_DIRECT blocks, a part of one at the end).
  for (const size_t name_length : {size_t{0}, size_t{4000}}) {
    const std::string dir = ucpkit::testing::scratch_dir("dcp_writer_streamed_" + std::to_string(name_length));
    std::vector<Entry> entries;
    for (int k = 0; k < 1200; ++k)
      entries.push_back({std::string(name_length, 'p') + "t" + std::to_string(k), false, DType::Float32, {2, 2}, {}});
    entries.push_back({"n", true, DType::Float32, {}, {}});
    const SavePlan plan = make_save_plan(entries, Target::rows(2));
    const ChunkSource src{
        [](const Entry&, size_t c) {
          return Tensor::from_vector(DType::Float32, {1, 2}, std::vector<float>{1.0f, static_cast<float>(c)});
        },
        [](const Entry&) { return std::vector<uint8_t>{7}; }};
    const WriteResult r = write_dcp(plan, src, dir + "/out");
    ASSERT_EQ(r.storage.size(), 2401u);
    const std::string pickled = ucpkit::testing::slurp(dir + "/out/.metadata");
    EXPECT_EQ(pickled, metadata_pickle(plan, r, {}, fs::absolute(dir + "/out").lexically_normal().string()));
    if (name_length) EXPECT_GT(pickled.size(), size_t{4} << 20);
    EXPECT_EQ(read_metadata(dir + "/out/.metadata").items.size(), 2401u);
    for (const auto& f : fs::directory_iterator(dir + "/out"))  // no temporary file left beside them
      EXPECT_EQ(f.path().filename().string().find(".tmp."), std::string::npos) << f.path();
  }
}

}  // namespace dcp_writer_test
