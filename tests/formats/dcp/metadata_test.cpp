// lib/formats/dcp/metadata: `.metadata` files written by real torch (tests/formats/dcp/data, README.md
// there) parsed into Metadata and compared, field by field, with what /usr/bin/python3's own pickle
// module reads from the same bytes (every class replaced by a stub that keeps its state: no torch
// needed, no ucpkit code involved); the class eras; refusals of damaged or foreign metadata (pickles
// written by Python with fake DCP modules, at protocol 2 for the general unpickler and 4 as torch writes them,
// for the one-pass reader); index_metadata, find and item_of.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/dcp/metadata.h"
#include "formats/dcp/metadata_direct.h"
#include "formats/dcp/dcp_data.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace dcp_metadata_test {

using namespace ucpkit;
using namespace ucpkit::formats::dcp;

namespace {

const std::string kData = std::string(UCPKIT_SOURCE_DIR) + "/tests/formats/dcp/data";

std::string thrown(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

// Python's pickle with stub classes: the independent reading of a `.metadata`, printed as ucpkit::testing::describe_metadata() does.
const char* kPython = R"PY(
import pickle, sys, types, os

class Stub:
    def __init__(self, *a, **k): self.args = a
    def __setstate__(self, st): self.state = st

class U(pickle.Unpickler):
    def find_class(self, mod, name):
        if mod == 'torch' and name == 'Size': return lambda x=(): list(x)
        if mod == 'torch': return 'torch.' + name
        if (mod, name) == ('builtins', 'getattr'): return lambda o, n: getattr(o, n, ('enum member', n))
        if mod in ('builtins', 'collections', 'copyreg', '_codecs'): return super().find_class(mod, name)
        return type(name, (Stub,), {'path': mod + '.' + name})

def ints(v): return '[' + ','.join(str(int(x)) for x in v) + ']'

def dump(path):
    md = U(open(path, 'rb')).load().state
    out = []
    for fqn, v in md['state_dict_metadata'].items():
        if v.path.endswith('BytesStorageMetadata'):
            out.append('B ' + fqn); continue
        s = v.state
        props = s['properties'].state
        line = 'E %s %s %s' % (fqn, props[0][len('torch.'):], ints(s['size']))
        for c in s['chunks']: line += ' ' + ints(c.state['offsets']) + ints(c.state['sizes'])
        out.append(line)
    for k, v in md['storage_data'].items():
        ks, vs = k.state, v.state
        off = ks.get('offset')
        line = 'I %s %s %s %d %d' % (ks['fqn'], 'None' if off is None else ints(off), vs['relative_path'],
                                     vs['offset'], vs['length'])
        for t in vs.get('transform_descriptors') or []: line += ' ' + t
        out.append(line)
    pd = md.get('planner_data')
    if isinstance(pd, dict):
        for flat in sorted(pd):
            out.append(' '.join(['F', flat] + [str(p) for p in pd[flat]]))
    sm = md.get('storage_meta')
    if sm is not None:
        for tag, f in (('C', 'checkpoint_id'), ('S', 'save_id')):
            if isinstance(sm.state.get(f), str): out.append(tag + ' ' + sm.state[f])
    if isinstance(md.get('version'), str): out.append('V ' + md['version'])
    return '\n'.join(out) + '\n'

for path in sys.argv[2:]:
    text = dump(os.path.join(sys.argv[1], '..', 'data', path))
    open(os.path.join(sys.argv[1], path.replace('/', '_') + '.txt'), 'w').write(text)
)PY";

}  // namespace

TEST(DcpMetadata, RealFilesParseAsPythonsPickleReadsThem) {
  const std::vector<std::string> files = {"fsdp_optim_w2/.metadata",
                                          "fsdp_tp_optim_w4/.metadata",
                                          "fsdp_w2/.metadata",
                                          "plain_w2/.metadata",
                                          "ranklocal_w2/rank_0/.metadata",
                                          "single_item_w1/.metadata",
                                          "t214_plain_w2/.metadata",
                                          "t214_zstd_w2/.metadata",
                                          "t215_loop_gsd_bf16_w2/.metadata",
                                          "t215_loop_torchtitan_w2/.metadata",
                                          "t26_shardprops_w2/.metadata",
                                          "torch113_w2/.metadata",
                                          "twod_w4/.metadata"};
  // The script reads data/<file> relative to its output folder's parent: give it a folder beside data/.
  const std::string out = ucpkit::testing::scratch_dir("dcp_metadata_python");
  std::filesystem::create_directories(out + "/py");
  std::filesystem::create_directory_symlink(kData, out + "/data");
  std::ofstream(out + "/dump.py") << kPython;
  std::string cmd = std::string(UCPKIT_PYTHON) + " " + out + "/dump.py " + out + "/py";
  for (const auto& f : files) cmd += " " + f;
  std::string log;
  ASSERT_EQ(ucpkit::testing::run_command(cmd, &log), 0) << log;
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const Metadata md = read_metadata(kData + "/" + f);
    EXPECT_EQ(md.path, kData + "/" + f);
    std::string want = ucpkit::testing::file_bytes(out + "/py/" + [&] {
      std::string n = f;
      for (char& c : n)
        if (c == '/') c = '_';
      return n;
    }() + ".txt");
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(ucpkit::testing::describe_metadata(md), want);
    EXPECT_FALSE(md.entries.empty());
  }
}

TEST(DcpMetadata, ClassErasAreRecognised) {
  EXPECT_EQ(read_metadata(kData + "/torch113_w2/.metadata").era, ClassEra::Prototype);
  EXPECT_EQ(read_metadata(kData + "/t26_shardprops_w2/.metadata").era, ClassEra::ShardedProps);
  EXPECT_EQ(read_metadata(kData + "/plain_w2/.metadata").era, ClassEra::Current);
  EXPECT_EQ(era_name(ClassEra::Prototype), "torch 1.13 (torch.distributed._shard.checkpoint)");
  EXPECT_EQ(era_name(ClassEra::Current), "torch >= 2.3");
  EXPECT_EQ(era_name(ClassEra::Safetensors), "safetensors flavour (no pickled classes)");
}

TEST(DcpMetadata, Torch113ShardsAndBytesItems) {
  // torch113_w2 (README): `row` split by rows (float32), `col` by columns (bfloat16), `step` a bytes item.
  const Metadata md = read_metadata(kData + "/torch113_w2/.metadata");
  const Entry* col = md.find("col");
  ASSERT_NE(col, nullptr);
  EXPECT_EQ(col->dtype, DType::BFloat16);
  ASSERT_EQ(col->chunks.size(), 2u);
  EXPECT_EQ(col->chunks[0].offsets[0], 0);
  EXPECT_EQ(col->chunks[1].offsets[0], 0);  // split by columns: row offsets 0
  EXPECT_EQ(col->chunks[0].sizes[1] + col->chunks[1].sizes[1], col->size[1]);
  const Entry* step = md.find("step");
  ASSERT_NE(step, nullptr);
  EXPECT_TRUE(step->is_bytes);
  EXPECT_FALSE(md.item_of("step", nullptr).offset);
  const Item& second = md.item_of("col", &col->chunks[1].offsets);
  ASSERT_TRUE(second.offset);
  EXPECT_EQ(*second.offset, col->chunks[1].offsets);
  EXPECT_EQ(md.find("nope"), nullptr);
}

TEST(DcpMetadata, ItemOfNamesTheMissingChunk) {
  const Metadata md = read_metadata(kData + "/plain_w2/.metadata");
  const std::vector<int64_t> at{5, 7};
  const std::string msg = thrown([&] { md.item_of(md.entries[0].fqn, &at); });
  EXPECT_EQ(msg, md.path + ": DCP metadata: no storage_data item for '" + md.entries[0].fqn + "' at offsets [5, 7]");
  EXPECT_EQ(thrown([&] { md.item_of("ghost", nullptr); }),
            md.path + ": DCP metadata: no storage_data item for 'ghost'");
}

TEST(DcpMetadata, IndexRefusesAFqnListedTwice) {
  Metadata md;
  md.path = "x/.metadata";
  md.entries.resize(2);
  md.entries[0].fqn = "w";
  md.entries[1].fqn = "b";
  md.items.resize(3);
  md.items[0].fqn = "w";
  md.items[1].fqn = "w";
  md.items[2].fqn = "b";
  index_metadata(md);
  EXPECT_EQ(md.find("b"), &md.entries[1]);
  EXPECT_EQ(md.items_of("w"), (std::vector<size_t>{0, 1}));
  md.entries[1].fqn = "w";
  EXPECT_EQ(thrown([&] { index_metadata(md); }), "x/.metadata: DCP metadata: state_dict_metadata lists 'w' twice");
}

TEST(DcpMetadata, LookupsInFileOrderAndOutOfItAcrossTwoFilesFindTheirOwn) {
  // find / item_of try the position after this thread's last find first: two files holding the same fqns in other
  // orders and chunks, asked alternately, in order, backwards and for what they lack.
  auto make = [](std::vector<std::string> fqns, int64_t chunk_rows) {
    Metadata md;
    md.path = "m/.metadata";
    for (const std::string& f : fqns) {
      md.entries.push_back({f, false, DType::Float32, {4}, {}});
      for (int64_t r = 0; r < 4; r += chunk_rows) md.items.push_back({f, std::vector<int64_t>{r}, {}});
    }
    md.items.push_back({"bytes", std::nullopt, {}});
    index_metadata(md);
    return md;
  };
  const Metadata a = make({"x", "y", "z"}, 2), b = make({"z", "x", "y"}, 1);
  for (const Metadata* md : {&a, &b, &a, &b}) {
    for (const std::string f : {"x", "y", "z", "z", "y", "x"}) {
      ASSERT_NE(md->find(f), nullptr);
      EXPECT_EQ(md->find(f)->fqn, f);
      for (int64_t r : {0, 2, 0}) {
        const std::vector<int64_t> at{r};
        const Item& it = md->item_of(f, &at);
        EXPECT_EQ(it.fqn, f);
        EXPECT_EQ(*it.offset, at);
      }
    }
    EXPECT_EQ(md->find("bytes"), nullptr);
    EXPECT_FALSE(md->item_of("bytes", nullptr).offset);
    const std::vector<int64_t> odd{1};
    if (md == &a) EXPECT_THROW(md->item_of("x", &odd), Error);
    else EXPECT_EQ(*md->item_of("x", &odd).offset, odd);
  }
}

TEST(DcpMetadata, UnsupportedDtypeIsRefusedByName) {
  const std::string msg = thrown([] { read_metadata(kData + "/float8_w1/.metadata"); });
  EXPECT_NE(msg.find("DCP metadata: state_dict_metadata['f8']: dtype torch.float8_e4m3fn is not supported"),
            std::string::npos)
      << msg;
}

TEST(DcpMetadata, ForeignAndDamagedMetadataIsRefused) {
  // Pickles of fake DCP classes (modules made up in sys.modules, torch.float32 a made-up global of the
  // same path) with one thing wrong each.
  const std::string dir = ucpkit::testing::scratch_dir("dcp_metadata_bad");
  const std::string stub = R"PY(
import pickle, sys, types, os
C = 'torch.distributed.checkpoint.'
P = 'torch.distributed._shard.checkpoint.'
def cls(path):
    mod, name = path.rsplit('.', 1)
    m = sys.modules.get(mod) or types.ModuleType(mod)
    sys.modules[mod] = m
    if not hasattr(m, name):
        setattr(m, name, type(name, (), {'__module__': mod, '__qualname__': name}))
    return getattr(m, name)
def obj(path, **fields):
    o = cls(path)(); o.__dict__.update(fields); return o
float32 = cls('torch.float32')
def Props(st, path=C + 'metadata.TensorProperties'):  # a tuple state, pickled as torch's: NEWOBJ + BUILD
    c = cls(path)
    c.__getstate__ = lambda self: self.__dict__.get('_st', self.__dict__)
    o = c(); o._st = st; return o
def tensor(size=(4,), chunks=(((0,), (4,)),), props=None, pre=C):
    props = props or Props((float32, None, False, 0, False), pre + 'metadata.TensorProperties')
    chunks = [obj(pre + 'metadata.ChunkStorageMetadata', offsets=list(o), sizes=list(s)) for o, s in chunks]
    return obj(pre + 'metadata.TensorStorageMetadata', properties=props, size=list(size), chunks=chunks)
def item(fqn='w', offset=(0,), rel='__0_0.distcp', off=0, length=16, pre=C):
    return (obj(pre + 'metadata.MetadataIndex', fqn=fqn, offset=list(offset) if offset is not None else None, index=0),
            obj(pre + 'filesystem._StorageInfo', relative_path=rel, offset=off, length=length))
def md(entries=None, items=None, pre=C, top=None, planner_data=None, **extra):
    entries = {'w': tensor()} if entries is None else entries
    items = dict([item()]) if items is None else items
    return obj(top or pre + 'metadata.Metadata', state_dict_metadata=entries, storage_data=items,
               planner_data=planner_data, **extra)
cases = {
  'ok': md(planner_data={'a.b': ('a', 'b'), 'l.0': ('l', 0)}, version='1.0.0',
           storage_meta=obj(C + 'metadata.StorageMeta', checkpoint_id='ck', save_id='s1')),
  'top': md(top=C + 'metadata.Other'),
  'mixed': md(pre=P, entries={'w': tensor()}, items=dict([item(pre=P)])),
  'chunk_rank': md(entries={'w': tensor(size=(4, 2))}),
  'negative': md(entries={'w': tensor(size=(-4,))}),
  'no_chunks': md(entries={'w': obj(C + 'metadata.TensorStorageMetadata', properties=Props((float32,)), size=[4])}),
  'props_class': md(entries={'w': tensor(props=Props((float32,), C + 'metadata.Other'))}),
  'props_state': md(entries={'w': tensor(props=Props(('x',)))}),
  'item_class': md(items={item()[0]: obj(C + 'filesystem.Other', relative_path='a', offset=0, length=1)}),
  'length': md(items=dict([item(length=-1)])),
  'path': md(items=dict([item(rel=5)])),
  'sd_list': md(items=[]),
  'long': md(items=dict([item(off=5_000_000_000, length=2**31 + 1)])),
  'long_negative': md(items=dict([item(length=-2**40)])),
  'tuple': ('not', 'metadata'),
}
for name, v in cases.items():  # protocol 4 as torch's dcp.save writes (read in one pass), 2 (general unpickler)
    for proto, suffix in ((2, ''), (4, '.p4')):
        open(os.path.join(sys.argv[1], name + suffix + '.metadata'), 'wb').write(pickle.dumps(v, protocol=proto))
)PY";
  std::ofstream(dir + "/make.py") << stub;
  std::string log;
  ASSERT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + dir + "/make.py " + dir, &log), 0) << log;
  auto refusal = [&](const std::string& name) {
    return thrown([&] { read_metadata(dir + "/" + name + ".metadata"); });
  };

  for (const std::string suffix : {"", ".p4"}) {
    const Metadata ok = read_metadata(dir + "/ok" + suffix + ".metadata");
    EXPECT_EQ(ucpkit::testing::describe_metadata(ok),
              "E w float32 [4] [0][4]\nI w [0] __0_0.distcp 0 16\nF a.b a b\nF l.0 l 0\nC ck\nS s1\nV 1.0.0\n");
    ASSERT_TRUE(ok.planner);
    EXPECT_EQ(ok.planner->size(), 2u);
    EXPECT_FALSE(ok.other_planner_data);
    if (suffix[0]) {  // protocol 4: the one-pass reader's, which so meets each case below first
      const std::string bytes = ucpkit::testing::file_bytes(dir + "/ok.p4.metadata");
      EXPECT_TRUE(parse_metadata_direct({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "ok"));
    }
    // Offsets past 2 GiB: LONG1 integers.
    EXPECT_EQ(ucpkit::testing::describe_metadata(read_metadata(dir + "/long" + suffix + ".metadata")),
              "E w float32 [4] [0][4]\nI w [0] __0_0.distcp 5000000000 2147483649\n");
  }

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"top", "DCP metadata: unknown class torch.distributed.checkpoint.metadata.Other at the top"},
      {"mixed", "its entries' classes are of another torch era than its Metadata"},
      {"chunk_rank", "state_dict_metadata['w'].chunks[0]: 1-d offsets / 1-d sizes for a 2-d tensor"},
      {"negative", "state_dict_metadata['w'].size: negative size or offset -4"},
      {"no_chunks", "state_dict_metadata['w']: no field 'chunks'"},
      {"props_class", "unknown class torch.distributed.checkpoint.metadata.Other (expected TensorProperties)"},
      {"props_state", "TensorProperties state is not a tuple starting with a torch dtype"},
      {"item_class",
       "storage_data['w']: unknown class torch.distributed.checkpoint.filesystem.Other (expected "
       "torch.distributed.checkpoint.filesystem._StorageInfo)"},
      {"length", "storage_data['w'].length: negative -1"},
      {"path", "storage_data['w'].relative_path: expected a str"},
      {"sd_list", "storage_data is not a dict"},
      {"long_negative", "storage_data['w'].length: negative -1099511627776"},
      {"tuple", "unknown class tuple at the top"},
  };
  for (const auto& [name, words] : cases)
    for (const std::string file : {name, name + ".p4"}) {
      const std::string msg = refusal(file);
      EXPECT_EQ(msg.rfind(dir + "/" + file + ".metadata: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(words), std::string::npos) << file << ": " << msg;
    }
}

TEST(DcpMetadata, ParseNamesTheBytesSourceAndRefusesNonPickles) {
  const std::string bytes = ucpkit::testing::file_bytes(kData + "/single_item_w1/.metadata");
  const Metadata md = parse_metadata({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "mem");
  EXPECT_EQ(md.path, "mem");
  ASSERT_EQ(md.entries.size(), 1u);
  EXPECT_EQ(md.entries[0].fqn, "w");
  ASSERT_EQ(md.items.size(), 1u);
  const std::string junk = "not a pickle";
  const std::string msg = thrown([&] {
    parse_metadata({reinterpret_cast<const uint8_t*>(junk.data()), junk.size()}, "junk");
  });
  EXPECT_EQ(msg.rfind("junk: pickle: ", 0), 0u) << msg;
  EXPECT_NE(thrown([] { read_metadata("/nonexistent/.metadata"); }).find("/nonexistent/.metadata"), std::string::npos);
}

}  // namespace dcp_metadata_test
