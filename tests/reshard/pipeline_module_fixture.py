"""A DeepSpeed PipelineModule checkpoint of a model that is not Megatron's (issue 33 item 3), and the
checks of ucp-load's output against it. Run with Debian's /usr/bin/python3 (torch 1.13, numpy).

  write   OUT --pp P --dp D [--partition-method M]   the checkpoint (OUT/latest, OUT/global_step10/)
  compare GOT REF                                     every tensor of REF's step folder equal in GOT's

The model: PipelineModule(layers=[nn.Embedding(V, H), Block() x 6, <function>, nn.Linear(H, V,
bias=False)], partition_method=M): no attention parameters, no tied modules, layer 7 a function
(no file, counted by `uniform`). Training: fp16, ZeRO stage 1, one param group of every parameter
(`deepspeed.initialize(model=net, model_parameters=net.parameters())`), Adam. The stage bounds are
DeepSpeed's own: partition_uniform / partition_balanced below are the text of
deepspeed/runtime/utils.py v0.14.5 :562-611 (numpy), applied as pipe/module.py _partition_layers
:387-412 does, to _count_layer_params :294-309 (trainable elements per layer, 0 for a function).

What DeepSpeed writes, v0.14.5 line numbers:
* engine.py _save_checkpoint :3335-3378: mp_rank_XX_model_states.pt = dict(module=..., buffer_names,
  optimizer=None (ZeRO), param_shapes, frozen_param_shapes=None (ZeRO-1), shared_params,
  frozen_param_fragments=None, lr_scheduler, data_sampler, random_ltd, sparse_tensor_module_names,
  skipped_steps, global_steps, global_samples, dp_world_size, mp_world_size, ds_config, ds_version)
  updated with client_state; module is None for a PipelineEngine (pipe/engine.py module_state_dict
  :1367-1384 saves the layers and returns None). XX = mpu.get_model_parallel_rank() (engine.py
  :2701-2716) = the grid's ds_model_rank (pipe/topology.py :436-437): the stage with TP 1;
  mp_world_size = the grid's model-parallel size, the PP x TP ranks of one data coordinate.
* param_shapes (_get_zero_param_shapes :3418-): one OrderedDict per param group, name -> shape, the
  names of module.named_parameters(): "<layer index>.<name in the layer>" (pipe/module.py _build
  :226-268 registers every built layer as add_module(str(layer_idx), module)).
* pipe/module.py save_state_dict :584-615: DP rank 0 writes layer.state_dict(), cloned, of every layer
  with a state dict to ckpt_layer_path :565-573 `layer_{idx:02d}-{rank_repr}-model_states.pt`; with a
  topology that has a 'model' axis (PipeModelDataParallelTopology) rank_repr is 'model_00'
  (topology.py get_rank_repr :69-, data and pipe omitted).
* engine.py _save_zero_checkpoint :3519-3522: zero_pp_rank_D_mp_rank_XX_optim_states.pt =
  {optimizer_state_dict, ds_config, ds_version}; optimizer_state_dict is zero/stage_1_and_2.py
  state_dict :2140-2180 (loss_scaler, dynamic_loss_scale, overflow, clip_grad, base_optimizer_state,
  single_partition_of_fp32_groups without padding, zero_stage, group_paddings, partition_count,
  ds_version, param_slice_mappings); the flat buffer is padded to a multiple of 2 * DP and split
  equally (tests/generator/dsgen/writer.py build_group, the same rule).
"""
import argparse
import collections
import os
import sys
import zlib

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "generator"))
from dsgen import stubs  # noqa: E402  (DeepSpeed's class paths for torch.save)
from dsgen.writer import build_group, fragment_map, padding_of, _rng_state  # noqa: E402

V, H, F, BLOCKS, STEP = 96, 16, 48, 6, 10
FUNCTION_LAYER = 1 + BLOCKS  # a lambda between the blocks and the head: no parameters, no file
TYPE_NAMES = ["Embedding"] + ["Block"] * BLOCKS + ["<lambda>", "Linear"]


def layer_params():
    """[layer] -> [(name in the layer, shape)] in registration order (nn.Embedding: weight; Block:
    norm (LayerNorm), fc1, fc2 (Linear); nn.Linear without bias: weight)."""
    block = [("norm.weight", (H,)), ("norm.bias", (H,)), ("fc1.weight", (F, H)), ("fc1.bias", (F,)),
             ("fc2.weight", (H, F)), ("fc2.bias", (H,))]
    return [[("weight", (V, H))]] + [block] * BLOCKS + [[]] + [[("weight", (V, H))]]


def truth(name, state):
    g = torch.Generator().manual_seed(zlib.crc32((name + "/" + state).encode()))
    shape = dict((f"{i}.{n}", s) for i, ps in enumerate(layer_params()) for n, s in ps)[name]
    t = torch.randn(shape, generator=g)
    return t.abs() if state == "exp_avg_sq" else t


# --- deepspeed/runtime/utils.py v0.14.5 :562-611, verbatim but for the docstring
def partition_uniform(num_items, num_parts):
    import numpy
    parts = [0] * (num_parts + 1)
    # First check for the trivial edge case
    if num_items <= num_parts:
        for p in range(num_parts + 1):
            parts[p] = min(p, num_items)
        return parts

    chunksize = num_items // num_parts
    residual = num_items - (chunksize * num_parts)

    parts = numpy.arange(0, (num_parts + 1) * chunksize, chunksize)

    for i in range(residual):
        parts[i + 1:] += 1
    parts = parts.tolist()

    return parts


def partition_balanced(weights, num_parts):
    import numpy as np
    n = len(weights)
    m = num_parts

    if n <= m:
        return partition_uniform(n, m)

    dp_max = np.full((n + 1, m + 1), np.inf)
    dp_min = np.full((n + 1, m + 1), np.inf)
    dp_cost = np.full((n + 1, m + 1), np.inf)
    position = np.zeros((n + 1, m + 1), dtype=int)
    prefix_sum = np.zeros((n + 1))
    prefix_sum[1:] = np.cumsum(weights)

    dp_max[0, 0] = 0
    dp_cost[0, 0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                max_sum = max(dp_max[k, j - 1], prefix_sum[i] - prefix_sum[k])
                min_sum = min(dp_min[k, j - 1], prefix_sum[i] - prefix_sum[k])
                cost = max_sum - min_sum
                if dp_cost[i, j] >= cost:
                    dp_cost[i, j] = cost
                    dp_max[i, j] = max_sum
                    dp_min[i, j] = min_sum
                    position[i, j] = k

    parts = [n]
    for i in reversed(range(1, m + 1)):
        parts.append(position[parts[-1], i])
    parts.reverse()

    return parts


def partition(method, stages):
    """pipe/module.py _partition_layers v0.14.5 :387-412 over this model's layer specs."""
    import re
    method = method.lower()
    if method == "uniform":
        return partition_uniform(len(layer_params()), stages)
    if method == "parameters":
        counts = [sum(int(torch.Size(s).numel()) for _, s in ps) for ps in layer_params()]
        return partition_balanced(counts, stages)
    if method.startswith("type:"):
        rx = re.compile(method.split(":")[1], re.IGNORECASE)
        return partition_balanced([1 if rx.search(n) else 0 for n in TYPE_NAMES], stages)
    raise NotImplementedError(method)


def write(out, pp, dp, method):
    parts = partition(method, pp)
    tag = f"global_step{STEP}"
    ck = os.path.join(out, tag)
    os.makedirs(ck, exist_ok=True)
    with open(os.path.join(out, "latest"), "w") as f:
        f.write(tag)
    ds_config = {"train_batch_size": 8 * dp, "zero_optimization": {"stage": 1}, "fp16": {"enabled": True},
                 "pipeline": {"partition_method": method}}
    for s in range(pp):
        layers = [L for L in range(parts[s], parts[s + 1]) if layer_params()[L]]
        names = [f"{L}.{n}" for L in layers for n, _ in layer_params()[L]]
        sizes = [truth(n, "fp32").numel() for n in names]
        g = build_group(names, names, sizes, dp)
        flats = {st: torch.zeros(g.padded) for st in ("fp32", "exp_avg", "exp_avg_sq")}
        for n, off, k in zip(names, g.offsets, sizes):
            for st in flats:
                flats[st][off:off + k] = truth(n, st).reshape(-1)
        for L in layers:  # pipe/module.py save_state_dict: the fp16 module weights, cloned
            sd = collections.OrderedDict((n, truth(f"{L}.{n}", "fp32").half().clone()) for n, _ in layer_params()[L])
            torch.save(sd, os.path.join(ck, f"layer_{L:02d}-model_00-model_states.pt"))
        shapes = collections.OrderedDict((n, truth(n, "fp32").shape) for n in names)
        state = collections.OrderedDict(
            module=None, buffer_names=[], optimizer=None, param_shapes=[shapes], frozen_param_shapes=None,
            shared_params={}, frozen_param_fragments=None,
            lr_scheduler={"last_batch_iteration": STEP, "_last_lr": [1e-3]}, data_sampler=None, random_ltd=None,
            sparse_tensor_module_names=set(), skipped_steps=0, global_steps=STEP, global_samples=STEP * 8 * dp,
            dp_world_size=dp, mp_world_size=pp, ds_config=ds_config, ds_version="0.14.5")
        state["rng_state"] = _rng_state()  # client_state of the training script
        torch.save(state, os.path.join(ck, f"mp_rank_{s:02d}_model_states.pt"))
        for d in range(dp):
            lo, hi = d * g.partition, (d + 1) * g.partition
            pad = padding_of(g, d)
            osd = collections.OrderedDict()
            osd["loss_scaler"] = stubs.DynamicLossScaler(init_scale=2.0 ** 12, dtype=torch.float16)
            osd["dynamic_loss_scale"] = True
            osd["overflow"] = False
            osd["clip_grad"] = 1.0
            osd["base_optimizer_state"] = {
                "state": {0: {"step": STEP, "exp_avg": flats["exp_avg"][lo:hi].clone(),
                              "exp_avg_sq": flats["exp_avg_sq"][lo:hi].clone()}},
                "param_groups": [{"lr": 1e-3, "bias_correction": True, "betas": (0.9, 0.999), "eps": 1e-8,
                                  "weight_decay": 0.01, "amsgrad": False, "params": [0]}]}
            osd["single_partition_of_fp32_groups"] = [flats["fp32"][lo:hi - pad].clone()]
            osd["zero_stage"] = stubs.ZeroStageEnum(1)
            osd["group_paddings"] = [pad]
            osd["partition_count"] = [dp]
            osd["ds_version"] = "0.14.5"
            osd["param_slice_mappings"] = [fragment_map(g, sizes, d)]
            torch.save({"optimizer_state_dict": osd, "ds_config": ds_config, "ds_version": "0.14.5"},
                       os.path.join(ck, f"zero_pp_rank_{d}_mp_rank_{s:02d}_optim_states.pt"))
    print("stages", ";".join(",".join(str(L) for L in range(parts[s], parts[s + 1]) if layer_params()[L])
                             for s in range(pp)))


def _step(d):
    with open(os.path.join(d, "latest")) as f:
        return os.path.join(d, f.read().strip())


def _same(a, b, where, bad):
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b)):
            bad.append(where)
    elif isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            bad.append(f"{where}: keys {list(a)} != {list(b)}")
        for k in a:
            if k in b:
                _same(a[k], b[k], f"{where}.{k}", bad)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            bad.append(f"{where}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]", bad)
    elif isinstance(a, stubs.fragment_address) or isinstance(b, stubs.fragment_address):
        if (a.numel, a.start) != (b.numel, b.start):
            bad.append(where)
    elif a != b:
        bad.append(f"{where}: {a!r} != {b!r}")


def compare(got, ref):
    """The files of REF's step folder in GOT's (same names, no other), and in each the content that
    holds the model and optimizer: layer files whole; param_shapes; the optimizer shards' fp32
    partitions, Adam moments and step, paddings, partition counts and slice mappings."""
    g, r = _step(got), _step(ref)
    fg = sorted(f for f in os.listdir(g) if f.endswith(".pt"))
    fr = sorted(f for f in os.listdir(r) if f.endswith(".pt"))
    bad = [] if fg == fr else [f"files {fg} != {fr}"]
    for f in fr:
        if f not in fg:
            continue
        a = torch.load(os.path.join(g, f), map_location="cpu")
        b = torch.load(os.path.join(r, f), map_location="cpu")
        if f.startswith("layer_"):
            _same(a, b, f, bad)
        elif f.startswith("mp_rank_"):
            _same(a["param_shapes"], b["param_shapes"], f + ":param_shapes", bad)
            _same(a["module"], b["module"], f + ":module", bad)
        else:
            oa, ob = a["optimizer_state_dict"], b["optimizer_state_dict"]
            for k in ("single_partition_of_fp32_groups", "group_paddings", "partition_count", "param_slice_mappings"):
                _same(oa[k], ob[k], f"{f}:{k}", bad)
            _same(oa["base_optimizer_state"]["state"], ob["base_optimizer_state"]["state"], f + ":state", bad)
    for line in bad[:20]:
        print("DIFF", line)
    print(f"{len(fr)} files compared, {len(bad)} differences")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out")
    w.add_argument("--pp", type=int, required=True)
    w.add_argument("--dp", type=int, required=True)
    w.add_argument("--partition-method", default="parameters")
    c = sub.add_parser("compare")
    c.add_argument("got")
    c.add_argument("ref")
    a = ap.parse_args()
    if a.cmd == "write":
        write(a.out, a.pp, a.dp, a.partition_method)
        return 0
    return compare(a.got, a.ref)


if __name__ == "__main__":
    sys.exit(main())
