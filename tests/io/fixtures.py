"""Writes real torch.save files (Debian's PyTorch) and their ground truth for the lib/io tests.

Usage: /usr/bin/python3 tests/io/fixtures.py <outdir>
For each fixture <name>.pt there is <name>.json: {"value": encoding, "storages": [...], "container",
"prefix"} (see truth.py). manifest.json lists them. bad_*.pt are deliberately broken inputs."""
import collections
import io
import json
import os
import random
import struct
import sys
import zipfile
from argparse import Namespace

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import truth  # noqa: E402
from truth import (DynamicLossScaler, LossScaler, SubparamShape, ZeroStageEnum,  # noqa: E402
                   fragment_address)

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(1234)
random.seed(1234)
np.random.seed(1234)
sys.setrecursionlimit(20000)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool]

manifest = []


def rand(shape, dtype):
    """Random, distinct-ish values for any dtype."""
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, dtype=torch.float64) * 3).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -2**40), min(info.max, 2**40), shape, dtype=torch.int64).to(dtype)


def zip_prefix(path):
    with zipfile.ZipFile(path) as z:
        return z.namelist()[0].split("/")[0]


def save(name, obj, legacy=False, pickle_module=None, check=True, protocol=None):
    path = os.path.join(OUT, name + ".pt")
    kw = {} if protocol is None else {"pickle_protocol": protocol}
    if legacy:
        kw["_use_new_zipfile_serialization"] = False
    if pickle_module is not None:
        kw["pickle_module"] = pickle_module
    torch.save(obj, path, **kw)
    write_truth(name, obj, path, legacy)
    if check:  # the truth must describe what torch itself loads back
        back = torch.load(path, weights_only=False)
        problems = truth.diff(truth.describe(obj), truth.describe(back))
        assert not problems, (name, problems)
    return path


def write_truth(name, obj, path, legacy):
    d = truth.describe(obj)
    d["container"] = "legacy" if legacy else "zip"
    d["prefix"] = None if legacy else zip_prefix(path)
    d["file"] = os.path.basename(path)
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(d, f)
    manifest.append({"name": name, "file": os.path.basename(path), "container": d["container"]})


# ---------------- basic Python values ----------------

def nested(depth):
    v = ["leaf", depth]
    for i in range(depth):
        v = [v] if i % 2 else (v, i)
    return v


basic = {
    "none": None, "true": True, "false": False,
    "ints": [0, 1, -1, 255, 256, 65535, 65536, -129, 2**31 - 1, -2**31, 2**31, 2**40 + 7, -2**40 - 3,
             2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64, 2**100, -2**70, 3**90, -(7**60),
             random.getrandbits(200), -random.getrandbits(333)],
    "floats": [0.0, -0.0, 1.5, -2.25, 1e-310, 1.7976931348623157e308, float("inf"), float("-inf"), float("nan"),
               random.random(), 3.141592653589793],
    "str": ["", "ascii", "ünïcødé ✓ 漢字 🚀", "with\nnewline and \"quotes\" and \\", "x" * 300],
    "bytes": [b"", b"\x00\x01\x02\xff\xfe", bytes(range(256)), random.randbytes(1000)],
    "single_list": [42], "single_dict": {"only": 1}, "empty_list": [], "empty_dict": {}, "empty_tuple": (),
    "single_tuple": (7,), "pair": (1, "two"), "triple": (1, 2.0, "3"), "quad": (1, 2, 3, (4, 5)),
    "nested": [[1, [2, [3, [4, []]]]], ((), ((),)), {"a": {"b": {"c": [None]}}}],
    "deep": nested(300),
    "ordered": collections.OrderedDict([("zeta", 1), ("alpha", 2), ("mid", [3]), ("beta", None)]),
    "ordered_single": collections.OrderedDict([("k", "v")]),
    "ordered_empty": collections.OrderedDict(),
    "int_keys": {3: "three", 1: "one", -5: "minus five", 2**70: "big"},
    "mixed_keys": {(1, 2): "tuple key", 1.5: "float key", None: "none key", True: "bool key", b"b": "bytes key"},
    "set": {1, 2, 3, "four"}, "frozenset": frozenset({"a", "b"}), "empty_set": set(), "single_set": {9},
    "sizes": [torch.Size([]), torch.Size([0]), torch.Size([3, 4, 5]), torch.Size([2**33, 1])],
    "dtypes": [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32,
               torch.int64, torch.uint8, torch.bool],
    "random_state": random.getstate(),
}
shared_list = [1, 2, 3]
basic["shared_a"] = shared_list
basic["shared_b"] = shared_list  # memoized (BINGET): must read as equal values
save("basic", basic)
save("legacy_basic", basic, legacy=True)
save("single_int", 5)
save("single_list", ["only"])
save("single_dict", {"only": torch.arange(3)})

# ---------------- tensors ----------------

tensors = collections.OrderedDict()
for dt in DTYPES:
    n = truth.dtype_name(dt)
    tensors[n] = rand((3, 5), dt)
    tensors[n + "_0d"] = rand((), dt)
    tensors[n + "_empty"] = rand((0,), dt)
    tensors[n + "_empty2d"] = rand((4, 0), dt)
    base = rand((6, 7), dt)
    tensors[n + "_transposed"] = base.t()
    tensors[n + "_sliced"] = base[2:5, 1:6:2]  # offset and strides, shares `base`'s storage
    tensors[n + "_base"] = base
    tensors[n + "_1d"] = rand((37,), dt)
    tensors[n + "_4d"] = rand((2, 3, 1, 4), dt)
big = torch.randn(64, 65)
tensors["views"] = [big, big[1], big[3:7, 5:], big.view(-1)[100:1000], big.t(), big.narrow(1, 10, 3)]
tensors["expanded"] = torch.randn(3, 1).expand(3, 4)  # stride 0
tensors["param"] = torch.nn.Parameter(torch.randn(4, 4))
tensors["param_frozen"] = torch.nn.Parameter(torch.randn(2, 3).to(torch.bfloat16), requires_grad=False)
tensors["requires_grad"] = torch.randn(5, requires_grad=True)
tensors["large"] = torch.randn(300, 301)  # > 64 KiB record
tensors["tuple_of_tensors"] = (torch.ones(2), torch.zeros(2, dtype=torch.int64))
save("tensors", tensors)
save("legacy_tensors", tensors, legacy=True)
# Other pickle protocols than torch.save's default 2: 1 (text LONG magic in legacy files), 4 and 5.
save("legacy_tensors_proto1", tensors, legacy=True, protocol=1)
save("tensors_proto1", tensors, protocol=1)
save("basic_proto4", basic, protocol=4)
save("legacy_basic_proto5", basic, legacy=True, protocol=5)

# ---------------- objects found in real checkpoints ----------------

np_state = np.random.get_state()
objects = {
    "namespace": Namespace(params_dtype=torch.bfloat16, fp16=False, bf16=True, num_layers=4, hidden_size=64,
                           seq_length=128, lr=3e-4, tokenizer_type="GPT2BPETokenizer", data_path=["a", "b"],
                           vocab_file=None, rank=0, world_size=8, betas=(0.9, 0.95), nested=Namespace(x=1)),
    "fragment_address": fragment_address(numel=4096, start=12288),
    "fragment_list": [fragment_address(1, 0), fragment_address(2**40, 2**35)],
    "zero_stage_py311": ZeroStageEnum.optimizer_states,
    "loss_scaler": LossScaler(1.0),
    "dynamic_loss_scaler": DynamicLossScaler(init_scale=2**16, scale_window=500, dtype=torch.float16),
    "subparam_shape": SubparamShape(patterns=["self_attention.query_key_value.weight"],
                                    shape=((64, 32, 32), 64), partition_dim=0),
    "np_array_f8": np.random.randn(3, 4),
    "np_array_u4": np.arange(10, dtype=np.uint32) * 7919,
    "np_array_0d": np.array(3.5),
    "np_dtype": np.dtype("float32"),
    "np_rng_state": np_state,
    "torch_rng_state": torch.get_rng_state(),
    "random_state": random.getstate(),
}
save("objects", objects)
save("legacy_objects", objects, legacy=True)
# int enums as Python <= 3.10 pickles them: ZeroStageEnum(1)
save("enum_py310", {"zero_stage": ZeroStageEnum.optimizer_states, "gradients": ZeroStageEnum.gradients},
     pickle_module=truth.Py310Pickler)
save("enum_py311", {"zero_stage": ZeroStageEnum.optimizer_states, "gradients": ZeroStageEnum.gradients})

# ---------------- Megatron-DeepSpeed model states ----------------


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=96, hidden=32, layers=2):
        super().__init__()
        self.word_embeddings = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            blk = torch.nn.Module()
            blk.input_layernorm = torch.nn.LayerNorm(hidden)
            blk.query_key_value = torch.nn.Linear(hidden, 3 * hidden)
            blk.dense = torch.nn.Linear(hidden, hidden)
            blk.dense_h_to_4h = torch.nn.Linear(hidden, 4 * hidden)
            blk.dense_4h_to_h = torch.nn.Linear(4 * hidden, hidden)
            self.layers.append(blk)
        self.final_layernorm = torch.nn.LayerNorm(hidden)


model = TinyGPT().to(torch.bfloat16)
sd = model.state_dict()  # OrderedDict with a _metadata attribute, as in real checkpoints
names = list(sd.keys())
# DeepSpeed's module tensors are views into one flat bf16 buffer per group: emulate the sharing.
flat = torch.cat([t.reshape(-1) for t in sd.values()])
module = collections.OrderedDict()
off = 0
for k, t in sd.items():
    module[k] = flat[off:off + t.numel()].view(t.shape)
    off += t.numel()
module._metadata = sd._metadata

args = Namespace(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=64, max_position_embeddings=64,
                 padded_vocab_size=96, params_dtype=torch.bfloat16, bf16=True, fp16=False,
                 tensor_model_parallel_size=1, pipeline_model_parallel_size=1, world_size=2, data_parallel_size=2,
                 lr=6e-4, min_lr=6e-5, adam_beta1=0.9, adam_beta2=0.95, clip_grad=1.0, iteration=100,
                 deepspeed=True, zero_stage=1, tokenizer_type="GPT2BPETokenizer", train_iters=1000,
                 seed=1234, consumed_train_samples=6400, universal_checkpoint=False, load=None,
                 save="/tmp/ckpt", data_path=["/data/x_text_document"], split="969,30,1")


def rng_entry():
    return {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.get_rng_state(),
            "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()}}


param_shapes = [collections.OrderedDict((k, t.shape) for k, t in sd.items() if "layernorm" not in k),
                collections.OrderedDict((k, t.shape) for k, t in sd.items() if "layernorm" in k)]
model_states = {
    "module": module,
    "buffer_names": [],
    "optimizer": None,
    "param_shapes": param_shapes,
    "frozen_param_shapes": None,
    "shared_params": {},
    "frozen_param_fragments": None,
    "lr_scheduler": {"start_lr": 6e-4, "warmup_steps": 10, "num_steps": 100, "decay_style": "cosine"},
    "data_sampler": None,
    "random_ltd": None,
    "sparse_tensor_module_names": set(),
    "skipped_steps": 0,
    "global_steps": 100,
    "global_samples": 6400,
    "dp_world_size": 2,
    "mp_world_size": 1,
    "ds_config": {"train_batch_size": 64, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
    "ds_version": "0.16.4",
    "args": args,
    "checkpoint_version": 3.0,
    "iteration": 100,
    "tokens": 409600,
    "rng_state": [rng_entry()],
    "universal_checkpoint_info": {
        "universal_checkpoint_version": 0.2, "original_vocab_size": 90, "padded_vocab_size": 96,
        "vocabulary_parameter_patterns": ["word_embeddings.weight"],
        "pipeline_replicated_parameter_patterns": [],
        "parameter_to_average_patterns": [r"layers\.\d+\.input_layernorm\.weight"],
        "parameter_with_row_parallelism_patterns": [r"layers\.\d+\.dense\.weight", r"layers\.\d+\.dense_4h_to_h\.weight"],
        "tp_replicated_parameter_patterns": ["final_layernorm.weight", "final_layernorm.bias"],
        "parameter_with_2_sub_params_cat_dim_0": [],
        "parameter_with_sub_params": [],
    },
}
save("mp_rank_00_model_states", model_states)
save("legacy_mp_rank_00_model_states", model_states, legacy=True)

# ---------------- ZeRO-1 optimizer shard ----------------
dp = 2
group_names = [list(param_shapes[0]), list(param_shapes[1])]
group_numels = [sum(sd[k].numel() for k in g) for g in group_names]
state, partitions, paddings, mappings = {}, [], [], []
for gi, (gnames, numel) in enumerate(zip(group_names, group_numels)):
    padded = (numel + 2 * dp - 1) // (2 * dp) * (2 * dp)
    part = padded // dp
    pad = max(0, part - numel)  # rank 0 of 2: padding lies at the end of the flat buffer
    fp32 = torch.randn(part)
    state[gi] = {"step": torch.tensor(100.0), "exp_avg": torch.randn(part), "exp_avg_sq": torch.rand(part)}
    partitions.append(fp32[: part - pad] if pad else fp32)
    paddings.append(pad)
    m = collections.OrderedDict()
    off = 0
    for k in gnames:
        n = sd[k].numel()
        if off < part:
            m[k] = fragment_address(numel=min(n, part - off), start=off)
        off += n
    mappings.append(m)
optim = {
    "optimizer_state_dict": {
        "loss_scaler": DynamicLossScaler(init_scale=2**16, dtype=torch.bfloat16),
        "dynamic_loss_scale": True,
        "overflow": False,
        "clip_grad": 1.0,
        "base_optimizer_state": {
            "state": state,
            "param_groups": [{"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": wd, "amsgrad": False,
                              "foreach": None, "maximize": False, "capturable": False, "differentiable": False,
                              "fused": None, "params": [gi]} for gi, wd in enumerate([0.1, 0.0])],
        },
        "single_partition_of_fp32_groups": partitions,
        "zero_stage": ZeroStageEnum.optimizer_states,
        "group_paddings": paddings,
        "partition_count": [dp, dp],
        "ds_version": "0.16.4",
        "param_slice_mappings": mappings,
    },
    "ds_config": {"zero_optimization": {"stage": 1}},
    "ds_version": "0.16.4",
}
save("zero_pp_rank_0_mp_rank_00_optim_states", optim, pickle_module=truth.Py310Pickler)
save("legacy_zero_pp_rank_0_mp_rank_00_optim_states", optim, legacy=True, pickle_module=truth.Py310Pickler)
save("zero_pp_rank_0_mp_rank_00_optim_states_py311", optim)

# ---------------- archive prefix other than "archive" ----------------
prefixed = {"w": torch.randn(3, 3).to(torch.bfloat16), "n": 3}
p = save("odd_prefix_name", prefixed)  # torch 1.13 names the prefix after the file stem
os.replace(p, os.path.join(OUT, "renamed_after_save.pt"))
os.replace(os.path.join(OUT, "odd_prefix_name.json"), os.path.join(OUT, "renamed_after_save.json"))
manifest[-1] = {"name": "renamed_after_save", "file": "renamed_after_save.pt", "container": "zip"}
d = json.load(open(os.path.join(OUT, "renamed_after_save.json")))
d["file"] = "renamed_after_save.pt"
json.dump(d, open(os.path.join(OUT, "renamed_after_save.json"), "w"))
buf = io.BytesIO()  # saved through a file object: prefix "archive"
torch.save(prefixed, buf)
with open(os.path.join(OUT, "from_buffer.pt"), "wb") as f:
    f.write(buf.getvalue())
write_truth("from_buffer", prefixed, os.path.join(OUT, "from_buffer.pt"), False)

# ---------------- tensor ops: conversions, narrow, cat, equal (truth computed by torch) ----------------


def f32_bits(*bits):
    return torch.tensor(list(bits), dtype=torch.int32).view(torch.float32)


special32 = torch.cat([
    torch.tensor([0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 70000.0, -70000.0, 1e-8, 6e-8, 3e-5, -3e-5, 1e-40, 3.0e38,
                  3.3895e38, 3.4e38, float("inf"), float("-inf"), float("nan")]),
    f32_bits(0x3F808000, 0x3F818000, 0x3F808001, 0xBF808000 - 2**32, 0x7F7FFFFF, 0x00000001, 0x7FC00001,
             0x3F801000, 0x3F803000, 0x3F801001, 0x33000000, 0x33000001, 0x387FC000, 0x38800000),
    torch.randn(200) * torch.logspace(-12, 12, 200),
])
one = 1.0
special64 = torch.cat([
    special32.to(torch.float64),
    torch.tensor([1 + 2**-11 + 2**-40, 1 + 2**-11 - 2**-40, 1 + 2**-9 + 2**-40, 1 + 2**-8 + 2**-30,
                  1 + 2**-8 - 2**-30, 1e300, -1e300, 1e-300, 2**-24 * (1 + 2**-30), 2**-25 * (1 + 2**-40),
                  3 * 2**-26, 2**-149, 2**-150 * (1 + 2**-20)], dtype=torch.float64),
    torch.randn(200, dtype=torch.float64) * torch.logspace(-12, 12, 200, dtype=torch.float64),
])
conv = collections.OrderedDict()
srcs = {"float32": special32, "float64": special64, "float16": special32.to(torch.float16),
        "bfloat16": special32.to(torch.bfloat16)}
for sname, src in srcs.items():
    conv[sname] = collections.OrderedDict([("src", src)] + [(truth.dtype_name(dt), src.to(dt)) for dt in
                                                            [torch.float32, torch.float16, torch.bfloat16,
                                                             torch.float64]])
    conv[sname + "_strided"] = collections.OrderedDict(
        [("src", src[1::3])] + [(truth.dtype_name(dt), src[1::3].to(dt)) for dt in [torch.float32, torch.bfloat16]])
a = torch.randn(4, 6, 5)
b16 = torch.randn(7, 3).to(torch.bfloat16)
ops = {
    "conv": conv,
    "narrow": [[a, d, s, l, a.narrow(d, s, l)] for d, s, l in [(0, 1, 2), (1, 0, 6), (1, 5, 1), (2, 2, 3), (0, 4, 0)]]
    + [[b16, 1, 1, 2, b16.narrow(1, 1, 2)], [a.transpose(0, 2), 1, 2, 3, a.transpose(0, 2).narrow(1, 2, 3)]],
    "cat": [[[a, a * 2, a[:, :2]], 1, torch.cat([a, a * 2, a[:, :2]], 1)],
            [[a, a[1:3]], 0, torch.cat([a, a[1:3]], 0)],
            [[a.transpose(1, 2), a.transpose(1, 2)], 2, torch.cat([a.transpose(1, 2), a.transpose(1, 2)], 2)],
            [[b16, b16[:, :1], torch.zeros(7, 0, dtype=torch.bfloat16)], 1,
             torch.cat([b16, b16[:, :1], torch.zeros(7, 0, dtype=torch.bfloat16)], 1)],
            [[torch.arange(5), torch.arange(3)], 0, torch.cat([torch.arange(5), torch.arange(3)])]],
    "equal": [[a, a.clone(), True], [a, a.transpose(0, 1).contiguous().transpose(0, 1), True],
              [a, a + 1e-7, bool(torch.equal(a, a + 1e-7))], [a[0], a[1], False],
              [b16, b16.clone(), True], [torch.zeros(2), torch.zeros(3), False],
              [torch.tensor([0.0]), torch.tensor([-0.0]), None], [torch.tensor([float("nan")]) * 2, torch.tensor([float("nan")]) * 2, None],
              [torch.zeros(2, 3), torch.zeros(3, 2), False], [torch.zeros(2), torch.zeros(2, dtype=torch.float64), False]],
    "contiguous": [a.transpose(0, 2), a[:, 1::2, ::2], b16.t(), torch.randn(3, 1).expand(3, 5)],
}
# Tensor::equal is documented as bitwise (dtype, shape, element bytes): the truth is computed that way.
ops["equal"] = [[x, y, x.dtype == y.dtype and x.shape == y.shape and truth.tensor_bytes(x) == truth.tensor_bytes(y)]
                for x, y, _ in ops["equal"]]
save("ops", ops)

# ---------------- shared-storage write-once check input ----------------
shared = torch.randn(10, 10)
save("shared_storage", {"a": shared, "b": shared[2:5], "c": shared.t(), "d": torch.randn(3),
                        "nested": [shared[0], {"e": shared.view(-1)}]})

# ---------------- inputs that must be rejected cleanly ----------------


def rewrite_zip(src, dst, mutate):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = mutate(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)


bad = []
src = os.path.join(OUT, "single_dict.pt")
rewrite_zip(src, os.path.join(OUT, "bad_short_storage.pt"),
            lambda n, d: d[:-5] if "/data/" in n else d)
rewrite_zip(src, os.path.join(OUT, "bad_missing_storage.pt"),
            lambda n, d: None if "/data/" in n else d)
rewrite_zip(src, os.path.join(OUT, "bad_missing_pickle.pt"),
            lambda n, d: None if n.endswith("data.pkl") else d)


def pkl_only(name, payload):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/version", "3\n")
    open(os.path.join(OUT, name), "wb").write(buf.getvalue())


pkl_only("bad_unknown_opcode.pt", b"\x80\x02}q\x00(X\x01\x00\x00\x00a\xfe\x00\x00\x00u.")
pkl_only("bad_huge_unicode.pt", b"\x80\x02X\xf0\xff\xff\xffabc.")
pkl_only("bad_huge_bytes8.pt", b"\x80\x04\x8e\xf0\xff\xff\xff\xff\xff\xff\x7fabc.")
pkl_only("bad_huge_long4.pt", b"\x80\x02\x8b\xff\xff\xff\x7f\x01\x02.")
pkl_only("bad_no_stop.pt", b"\x80\x02]q\x00(K\x01K\x02e")
pkl_only("bad_stack_underflow.pt", b"\x80\x02e.")
pkl_only("bad_memo_get.pt", b"\x80\x02h\x05.")
pkl_only("bad_deep_lists.pt", b"\x80\x02" + b"]" * 100000 + b"a" * 99999 + b".")
pkl_only("bad_deep_tuples.pt", b"\x80\x02" + b"(" * 100000 + b"N" + b"t" * 100000 + b".")
pkl_only("bad_deep_dicts.pt", b"\x80\x02" + b"}X\x01\x00\x00\x00k" * 50000 + b"}" + b"s" * 50000 + b".")
# A list containing itself (Python pickles `l = []; l.append(l)` like this) and a dict cycle.
pkl_only("bad_cycle_list.pt", b"\x80\x02]q\x00h\x00a.")
pkl_only("bad_cycle_dict.pt", b"\x80\x02}q\x00X\x01\x00\x00\x00kh\x00s.")
# persistent id naming a storage key that is not in the archive, and a bad storage type
pkl_only("bad_pid_key.pt", b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
         b"ctorch\nFloatStorage\nX\x02\x00\x00\x0099X\x03\x00\x00\x00cpuK\x04tQK\x00K\x04\x85K\x01\x85\x89"
         b"ccollections\nOrderedDict\n)RtR.")
# a tensor whose size/stride reach past its storage (storage has 4 elements, tensor wants 100)
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
    z.writestr("archive/data.pkl", b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
               b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00Kd\x85K\x01\x85\x89"
               b"ccollections\nOrderedDict\n)RtR.")
    z.writestr("archive/data/0", struct.pack("<4f", 1, 2, 3, 4))
    z.writestr("archive/version", "3\n")
open(os.path.join(OUT, "bad_view_past_storage.pt"), "wb").write(buf.getvalue())
# the same tensor, but valid (4 elements): proves the hand-written pickle above is otherwise fine
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
    z.writestr("archive/data.pkl", b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
               b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00K\x04\x85K\x01\x85\x89"
               b"ccollections\nOrderedDict\n)RtR.")
    z.writestr("archive/data/0", struct.pack("<4f", 1, 2, 3, 4))
    z.writestr("archive/version", "3\n")
open(os.path.join(OUT, "handmade_ok.pt"), "wb").write(buf.getvalue())
assert torch.equal(torch.load(os.path.join(OUT, "handmade_ok.pt"), weights_only=False), torch.tensor([1.0, 2, 3, 4]))
write_truth("handmade_ok", torch.tensor([1.0, 2, 3, 4]), os.path.join(OUT, "handmade_ok.pt"), False)
# legacy file whose storage count claims far more elements than follow
lp = os.path.join(OUT, "legacy_single.pt")
torch.save({"t": torch.arange(6, dtype=torch.float32)}, lp, _use_new_zipfile_serialization=False)
write_truth("legacy_single", {"t": torch.arange(6, dtype=torch.float32)}, lp, True)
raw = open(lp, "rb").read()
count_at = len(raw) - 6 * 4 - 8
assert struct.unpack("<q", raw[count_at:count_at + 8])[0] == 6
open(os.path.join(OUT, "bad_legacy_count.pt"), "wb").write(raw[:count_at] + struct.pack("<q", 2**40) + raw[count_at + 8:])
open(os.path.join(OUT, "bad_legacy_short.pt"), "wb").write(raw[:-3])
open(os.path.join(OUT, "bad_magic.pt"), "wb").write(b"\x80\x02\x8a\x0a" + random.randbytes(200))
open(os.path.join(OUT, "bad_empty.pt"), "wb").write(b"")
open(os.path.join(OUT, "bad_text.pt"), "wb").write(b"this is not a checkpoint\n" * 20)

import zip_fixtures  # noqa: E402
zip_fixtures.main(os.path.join(OUT, "zip"))

import torch2_fixtures  # noqa: E402  (torch >= 2.0 constructs; last: it registers stand-ins in torch modules)
torch2_fixtures.main(OUT)

with open(os.path.join(OUT, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
print(f"wrote {len(manifest)} fixtures to {OUT}")
