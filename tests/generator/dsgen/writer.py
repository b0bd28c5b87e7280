"""Writes a DeepSpeed / Megatron-DeepSpeed training checkpoint (formats.md section 2) for one
parallel layout from seeded ground truth, and the ground truth itself (unsharded master weights,
Adam moments, step) in the universal layout ds_to_universal would produce (formats.md section 3)."""
import argparse
import collections
import json
import os
import random
import zlib
from dataclasses import dataclass

import torch

from . import dsmoe as dsmoe_files
from . import stubs
from .models import Model, Param

STATES = ("fp32", "exp_avg", "exp_avg_sq")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 1               # 1, 2 or 3 (3: PP = 1, dense models)
    dtype: str = "bf16"         # fp16 | bf16 | fp32
    bf16_optimizer: bool = False  # Megatron-DeepSpeed BF16_Optimizer files (no zero_stage key)
    ep: int = 1                 # dsmoe only
    data_before_expert: bool = False
    step: int = 100
    step_tensor: bool = False   # Adam step as a 0-d tensor instead of an int
    seed: int = 1234
    uc_info: bool = True        # write universal_checkpoint_info into model files
    elastic: bool = False
    sub_group_size: int = 1_000_000_000  # ZeRO-3: elements per rank in one sub-group       # elastic_checkpoint: base_optimizer_state is a list of lean group states
    ds_version: str = "0.16.4"
    # Storage location tags as a GPU job writes them: "cuda:<local rank>" for the tensors DeepSpeed
    # holds on the device when it saves (module weights, optimizer partitions and states, a tensor
    # step); RNG states and pipeline layer files (cloned to CPU first, deepspeed/checkpoint/utils.py:41
    # clone_tensors_for_torch_save(device=cpu), used by pipe/module.py:637-641) stay "cpu".
    device_tags: bool = False
    ds_line: str = "0.14"       # dsmoe: DeepSpeed version line of the MoE save path (dsmoe.LINES)
    # dsmoe: "megatron" (Megatron-DeepSpeed's decay / no-decay groups, each split by
    # split_params_into_different_moe_groups_for_optimizer) or "tutorial" (DeepSpeed's MoE tutorial:
    # one group of every parameter split into a dense and an expert group, dsmoe.tutorial_groups)
    moe_groups: str = "megatron"


# ---------------------------------------------------------------- ground truth

class Truth:
    """Seeded full tensors: the same (name, state, copy) always gives the same values, so a
    parameter can be regenerated wherever it is needed without holding the model in memory."""

    def __init__(self, seed):
        self.seed = seed

    def _gen(self, name, state, copy):
        g = torch.Generator()
        g.manual_seed((zlib.crc32(f"{name}|{state}|{copy}".encode()) ^ self.seed) & 0x7FFFFFFF)
        return g

    def full(self, p: Param, state, copy=0):
        g = self._gen(p.name, state, copy)
        if state == "exp_avg_sq":
            return torch.rand(p.shape, generator=g, dtype=torch.float32) * 1e-4 + 1e-8
        scale = 0.02 if state == "fp32" else 1e-3
        return torch.randn(p.shape, generator=g, dtype=torch.float32) * scale

    def universal(self, p: Param, state, tp):
        """What the universal checkpoint must hold for `p` (vocabulary padding cut)."""
        if p.kind == "average":
            copies = [self.full(p, state, t) for t in range(tp)]
            t = sum(copies) / len(copies)
        else:
            t = self.full(p, state)
        if p.vocab:
            t = t[:self.vocab_rows]
        return t


def tp_slice(truth: Truth, p: Param, state, t, tp):
    """Rank t's tensor-parallel slice of `p` (before flattening)."""
    if p.kind == "average":
        return truth.full(p, state, t)
    full = truth.full(p, state)
    if p.kind == "replicate":
        return full
    if p.kind == "col":
        return full.chunk(tp, 0)[t].clone()
    if p.kind == "row":
        return full.chunk(tp, 1)[t].clone()
    if p.kind == "swiglu":
        a, b = full.chunk(2, 0)
        return torch.cat([a.chunk(tp, 0)[t], b.chunk(tp, 0)[t]], 0)
    if p.kind == "subparams":
        parts = torch.split(full, list(p.subs), 0)
        return torch.cat([x.chunk(tp, 0)[t] for x in parts], 0)
    raise ValueError(p.kind)


def universal_metadata(p: Param, uc_info):
    md = {}
    if p.kind == "swiglu":
        md = {"cat_dim": 0, "param_n_sub_params": 2}
    elif p.kind == "subparams":
        sp = uc_info["parameter_with_sub_params"][0]
        md = {"sub_param_shape": stubs.SubparamShape(patterns=list(sp["patterns"]),
                                                     shape=(tuple(sp["shape"][0]), sp["shape"][1]),
                                                     partition_dim=sp["partition_dim"])}
    elif p.kind == "col":
        md = {"cat_dim": 0}
    elif p.kind == "row":
        md = {"cat_dim": 1}
    if p.vocab:
        md["vocab_tensor"] = True
    return md


# ---------------------------------------------------------------- flat groups and partitions

@dataclass
class GroupLayout:
    names: list       # parameter names in flat-buffer order (local expert names for dsmoe)
    params: list      # Param objects, same order
    offsets: list
    numel: int
    padded: int
    partition: int
    count: int        # partition_count
    moe: bool = False


def make_group(params, names, count):
    offsets, n = [], 0
    for p in params:
        offsets.append(n)
        n += 0
    sizes = []
    return offsets


def build_group(params, names, sizes, count, moe=False):
    offsets, n = [], 0
    for s in sizes:
        offsets.append(n)
        n += s
    align = 2 * count
    padded = (n + align - 1) // align * align if n else align
    return GroupLayout(names, params, offsets, n, padded, padded // count, count, moe)


def fragment_map(g: GroupLayout, sizes, r):
    """param_slice_mappings of partition r: name -> fragment_address(numel, start in partition)."""
    lo, hi = r * g.partition, (r + 1) * g.partition
    out = collections.OrderedDict()
    for name, off, size in zip(g.names, g.offsets, sizes):
        a, b = max(off, lo), min(off + size, hi)
        if b > a:
            out[name] = stubs.fragment_address(numel=b - a, start=a - lo)
    return out


def padding_of(g: GroupLayout, r):
    lo, hi = r * g.partition, (r + 1) * g.partition
    return hi - max(lo, min(hi, g.numel))


# ---------------------------------------------------------------- the checkpoint

def _save(obj, path, device=None, tensors=()):
    """torch.save; with `device`, the storages of `tensors` get that location tag (torch 1.13 asks
    torch.serialization.location_tag for every storage it writes)."""
    if device is None:
        torch.save(obj, path)
        return
    ptrs = {t.storage().data_ptr() for t in tensors if torch.is_tensor(t) and t.numel() > 0}
    orig = torch.serialization.location_tag

    def tag(storage):
        return device if storage.data_ptr() in ptrs else orig(storage)
    torch.serialization.location_tag = tag
    try:
        torch.save(obj, path)
    finally:
        torch.serialization.location_tag = orig


def _tensors(x):
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def nest_megatron_module(flat):
    """The module as Megatron-DeepSpeed saves it without pipeline parallelism: checkpointing.py swaps
    the module's state_dict for state_dict_for_save_checkpoint (deepspeedai/Megatron-DeepSpeed
    megatron/checkpointing.py, `args.no_pipeline_parallel`), which nests it as GPTModel
    (gpt_model.py:266-283: {'language_model': ...}) -> TransformerLanguageModel (language_model.py:
    603-645: 'embedding', 'encoder', 'output_layer') -> Embedding (language_model.py:269-285:
    'word_embeddings', 'position_embeddings', each a module state_dict {'weight': ...}); the encoder
    (ParallelTransformer) keeps flat keys ('layers.0.input_layernorm.weight', 'final_layernorm.weight')."""
    out = collections.OrderedDict()
    for name, t in flat.items():
        parts = name.split(".")
        if parts[0] != "language_model":
            out[name] = t
            continue
        lm = out.setdefault("language_model", collections.OrderedDict())
        if parts[1] == "embedding":
            lm.setdefault("embedding", collections.OrderedDict()).setdefault(
                parts[2], collections.OrderedDict())[".".join(parts[3:])] = t
        elif parts[1] == "encoder":
            lm.setdefault("encoder", collections.OrderedDict())[".".join(parts[2:])] = t
        else:
            lm.setdefault(parts[1], collections.OrderedDict())[".".join(parts[2:])] = t
    return out

def _rng_state():
    st = {"random_rng_state": random.Random(7).getstate(), "torch_rng_state": torch.get_rng_state(),
          "cuda_rng_state": torch.zeros(16, dtype=torch.uint8), "rng_tracker_states": {}}
    try:
        import numpy as np
        st["np_rng_state"] = np.random.RandomState(7).get_state()
    except ImportError:
        pass
    return [st]


def _args(model: Model, lay: Layout):
    cfg = model.cfg
    return argparse.Namespace(
        tensor_model_parallel_size=lay.tp, pipeline_model_parallel_size=lay.pp, world_size=lay.tp * lay.pp * lay.dp,
        data_parallel_size=lay.dp, num_layers=cfg.layers, hidden_size=cfg.hidden, ffn_hidden_size=cfg.ffn,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, seq_length=cfg.seq,
        max_position_embeddings=cfg.seq, padded_vocab_size=model.padded_vocab, params_dtype=DTYPES[lay.dtype],
        fp16=lay.dtype == "fp16", bf16=lay.dtype == "bf16", swiglu=cfg.swiglu,
        untie_embeddings_and_output_weights=not cfg.tied, num_experts=model.num_experts or None,
        moe_expert_parallel_size=lay.ep, expert_interval=cfg.expert_interval, zero_stage=lay.zero,
        iteration=lay.step, consumed_train_samples=lay.step * 8, deepspeed=True,
        # What Megatron-DeepSpeed's arguments.py records of the model's math (--normalization,
        # --use-rotary-position-embeddings, --disable-bias-linear): RMSNorm + RoPE for llama / mixtral.
        normalization="rmsnorm" if cfg.family in ("llama", "mixtral") else "layernorm",
        use_rotary_position_embeddings=cfg.family in ("llama", "mixtral"),
        add_bias_linear=cfg.family in ("gpt", "dsmoe") and not cfg.swiglu and cfg.bias_linear)


def _ds_config(lay: Layout):
    zero = {"stage": lay.zero}
    if lay.zero == 3:
        zero["sub_group_size"] = lay.sub_group_size
    cfg = {"train_batch_size": 8 * lay.dp, "zero_optimization": zero,
           "bf16": {"enabled": lay.dtype == "bf16"}, "fp16": {"enabled": lay.dtype == "fp16"}}
    if lay.data_before_expert:
        cfg["use_data_before_expert_parallelism"] = True  # deepspeed/runtime/constants.py USE_DATA_BEFORE_EXPERT_PARALLEL
    return cfg


def _loss_scaler(lay: Layout):
    if lay.dtype == "fp16":
        return stubs.DynamicLossScaler(init_scale=2.0 ** 12, dtype=torch.float16)
    return stubs.LossScaler(scale=1)


def _hyper(g, moe, ep):
    d = {"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1 if g % 2 == 0 else 0.0,
         "amsgrad": False, "bias_correction": True, "params": [g]}
    if moe:
        d["moe"] = True
        d["name"] = f"ep_size_{ep}"
    return d


def _ep_coords(lay: Layout, d):
    """(ep_rank, expert-DP rank) of DP rank d (TP = 1)."""
    edp = lay.dp // lay.ep
    if lay.data_before_expert:
        return d // edp, d % edp
    return d % lay.ep, d // lay.ep


def write_checkpoint(model: Model, lay: Layout, out_dir, truth_dir=None, log=print):
    cfg = model.cfg
    if lay.zero not in (1, 2, 3):
        raise ValueError("ZeRO stage must be 1, 2 or 3")
    if lay.bf16_optimizer and (lay.dtype != "bf16" or lay.zero > 1):
        raise ValueError("BF16_Optimizer files need bf16 and ZeRO 0/1")
    if cfg.family == "dsmoe":
        if lay.tp != 1 or lay.pp != 1:
            raise ValueError("native DeepSpeed MoE generation supports TP = PP = 1")
        if any(e % lay.ep for e in (cfg.experts_per_layer or (cfg.experts,))) or lay.dp % lay.ep:
            raise ValueError("EP must divide the expert count and DP")
    truth = Truth(lay.seed)
    truth.vocab_rows = cfg.vocab
    tag = f"global_step{lay.step}"
    ck = os.path.join(out_dir, tag)
    os.makedirs(ck, exist_ok=True)
    with open(os.path.join(out_dir, "latest"), "w") as f:
        f.write(tag)
    lp_dtype = DTYPES[lay.dtype]
    uc_info = json.loads(json.dumps(model.uc_info))
    for sp in uc_info["parameter_with_sub_params"]:
        sp["shape"] = (tuple(sp["shape"][0]), sp["shape"][1])
    step_value = torch.tensor(float(lay.step)) if lay.step_tensor else lay.step
    prefix = "bf16_" if lay.dtype == "bf16" else ""
    args = _args(model, lay)
    dsmoe = cfg.family == "dsmoe"

    if lay.zero == 3:
        from . import zero3

        def common(module, shapes, stage):
            sd = collections.OrderedDict()
            sd["module"] = module
            sd["buffer_names"] = []
            sd["optimizer"] = None
            sd["param_shapes"] = shapes
            sd["frozen_param_shapes"] = None
            sd["shared_params"] = {}
            sd["frozen_param_fragments"] = None
            sd["lr_scheduler"] = {"last_batch_iteration": lay.step, "_last_lr": [1e-4]}
            sd["data_sampler"] = None
            sd["random_ltd"] = None
            sd["sparse_tensor_module_names"] = set()
            sd["skipped_steps"] = 0
            sd["global_steps"] = lay.step
            sd["global_samples"] = lay.step * 8 * lay.dp
            sd["dp_world_size"] = lay.dp
            sd["mp_world_size"] = lay.tp
            sd["ds_config"] = _ds_config(lay)
            sd["ds_version"] = lay.ds_version
            sd["args"] = args
            sd["checkpoint_version"] = 3.0
            sd["iteration"] = lay.step
            sd["tokens"] = lay.step * 8 * lay.dp * cfg.seq
            if lay.uc_info:
                sd["universal_checkpoint_info"] = uc_info
            sd["rng_state"] = _rng_state()
            return sd

        zero3.write(model, lay, truth, ck, common, log)
        if truth_dir:
            write_truth(model, lay, truth, uc_info, truth_dir, step_value)
        return

    for s in range(lay.pp):
        # PipelineModule registers `tied_modules` (deepspeed/runtime/pipe/module.py:196, in __init__)
        # before _build adds the numbered layers (:255, :277), so module.parameters() -- and with it
        # Megatron's param groups and ZeRO's flat buffers -- list the tied modules' parameters first
        # on every stage that builds them (the first, and the last for the tied head).
        stage_params = [p for p in model.params if p.stage == s]
        if model.pipe:
            stage_params = ([p for p in stage_params if p.name.startswith("tied_modules.")] +
                            [p for p in stage_params if not p.name.startswith("tied_modules.")])
        for t in range(lay.tp):
            mp = s * lay.tp + t
            slices = {}  # (id(p), state) computed lazily per group
            # Local GPU of a rank (Megatron's order: tp fastest, then dp, then pp; 8 GPUs per node).
            def device_of(d):
                return f"cuda:{(s * lay.dp * lay.tp + d * lay.tp + t) % 8}" if lay.device_tags else None
            device = device_of(0)

            def sl(p, state):
                return tp_slice(truth, p, state, t, lay.tp)

            dense = [p for p in stage_params if p.expert is None]
            # Optimizer groups: dense weight decay, dense no decay, then (dsmoe) expert groups
            # per EP rank: the files of one DP rank hold only its EP rank's experts.
            def groups_for(ep_rank):
                out = []
                if dsmoe and lay.moe_groups == "tutorial":
                    return dsmoe_files.tutorial_groups(stage_params, model.num_experts, ep_rank, lay.ep, lay.dp)
                for gi in (0, 1):
                    ps = [p for p in dense if p.group == gi]
                    if ps:
                        out.append((ps, [p.name for p in ps], lay.dp, False))
                if dsmoe:
                    for gi in (0, 1):
                        ps = [p for p in stage_params if p.expert is not None and p.group == gi
                              and p.expert // (model.num_experts[p.moe_layer] // lay.ep) == ep_rank]
                        if ps:
                            out.append((ps, [p.expert_local_name for p in ps], lay.dp // lay.ep, True))
                return out

            ep_ranks = range(lay.ep) if dsmoe else [0]
            group_sets = {}
            for r in ep_ranks:
                gs = []
                for ps, names, count, moe in groups_for(r):
                    sizes = [int(torch.Size(tp_shape(p, lay.tp)).numel()) for p in ps]
                    g = build_group(ps, names, sizes, count, moe)
                    flats = {}
                    for state in STATES:
                        buf = torch.zeros(g.padded, dtype=torch.float32)
                        for p, off, n in zip(ps, g.offsets, sizes):
                            buf[off:off + n] = sl(p, state).reshape(-1)
                        flats[state] = buf
                    gs.append((g, sizes, flats))
                group_sets[r] = gs

            # ---- model states (DP rank 0 of this (pp, tp))
            r0 = 0
            module = collections.OrderedDict()
            param_shapes = []
            all_shapes, expert_local_keys = [], []  # dsmoe: every bit16 group, EP rank 0's local expert names
            for g, sizes, flats in group_sets[r0]:
                lp_flat = flats["fp32"].to(lp_dtype)  # ZeRO keeps module params as views of this
                shapes = collections.OrderedDict()
                for p, name, off, n in zip(g.params, g.names, g.offsets, sizes):
                    shapes[name] = torch.Size(tp_shape(p, lay.tp))
                    if not model.pipe and not g.moe:
                        module[p.name] = lp_flat.narrow(0, off, n).view(tp_shape(p, lay.tp))
                if not g.moe:
                    param_shapes.append(shapes)
                else:
                    expert_local_keys += g.names
                all_shapes.append(shapes)
            if not model.pipe:
                order = [p.name for p in model.params if p.stage == s and p.expert is None]
                module = collections.OrderedDict((n, module[n]) for n in order)
                if not dsmoe:
                    module = nest_megatron_module(module)
            if dsmoe:
                base = {"lr_scheduler": {"last_batch_iteration": lay.step, "_last_lr": [1e-4]}, "data_sampler": None,
                        "random_ltd": None, "sparse_tensor_module_names": set(), "skipped_steps": 0,
                        "global_steps": lay.step, "global_samples": lay.step * 8 * lay.dp, "dp_world_size": lay.dp,
                        "mp_world_size": lay.tp, "num_experts": list(model.num_experts)}
                client = collections.OrderedDict([("args", args), ("checkpoint_version", 3.0), ("iteration", lay.step),
                                                  ("tokens", lay.step * 8 * lay.dp * cfg.seq)])
                if lay.moe_groups == "tutorial":  # not Megatron's training script: no Megatron client_state
                    client = collections.OrderedDict()
                if lay.uc_info:
                    client["universal_checkpoint_info"] = uc_info
                client["rng_state"] = _rng_state()
                names = [p.expert_local_name if p.expert is not None else p.name for p in model.params
                         if p.expert is None or p.expert_local_name in expert_local_keys]
                sd = dsmoe_files.model_states(lay.ds_line, module, list(dict.fromkeys(names)),
                                              all_shapes, base, client, _ds_config(lay), lay.zero)
                _save(sd, os.path.join(ck, f"mp_rank_{mp:02d}_model_states.pt"), device, list(_tensors(sd["module"])))
            sd = collections.OrderedDict()
            sd["module"] = None if model.pipe else module
            if not dsmoe:
                sd["buffer_names"] = []
            if not dsmoe:
                sd["optimizer"] = None
                sd["param_shapes"] = param_shapes
                sd["frozen_param_shapes"] = None
                sd["shared_params"] = {}
                sd["frozen_param_fragments"] = None
            sd["lr_scheduler"] = {"last_batch_iteration": lay.step, "_last_lr": [1e-4]}
            sd["data_sampler"] = None
            sd["random_ltd"] = None
            sd["sparse_tensor_module_names"] = set()
            sd["skipped_steps"] = 0
            sd["global_steps"] = lay.step
            sd["global_samples"] = lay.step * 8 * lay.dp
            sd["dp_world_size"] = lay.dp
            # engine.py:1841 mp_world_size = groups._get_model_parallel_world_size() = the mpu's
            # get_model_parallel_world_size(); under PipelineEngine the mpu is PipelineModule's grid,
            # whose model group is every rank with the same data coordinate (pipe/topology.py:304-313):
            # PP x TP.
            sd["mp_world_size"] = lay.tp * lay.pp if model.pipe else lay.tp
            if dsmoe:
                sd["num_experts"] = list(model.num_experts)
            else:
                sd["ds_config"] = _ds_config(lay)
                sd["ds_version"] = lay.ds_version
            sd["args"] = args
            sd["checkpoint_version"] = 3.0
            sd["iteration"] = lay.step
            sd["tokens"] = lay.step * 8 * lay.dp * cfg.seq
            if lay.uc_info:
                sd["universal_checkpoint_info"] = uc_info
            sd["rng_state"] = _rng_state()
            if not dsmoe:
                _save(sd, os.path.join(ck, f"mp_rank_{mp:02d}_model_states.pt"), device,
                      list(_tensors(sd["module"])) if sd["module"] else [])

            # ---- pipeline layer files: compact clones (DeepSpeed clones before saving)
            if model.pipe:
                layers = collections.OrderedDict()
                for p in stage_params:
                    layers.setdefault(p.layer, collections.OrderedDict())[p.local] = \
                        sl(p, "fp32").to(lp_dtype).clone()
                for L, lsd in layers.items():
                    torch.save(lsd, os.path.join(ck, f"layer_{L:02d}-model_{t:02d}-model_states.pt"))

            # ---- native MoE expert files and EP-rank optimizer files
            if dsmoe:
                for p in stage_params:
                    pass
                by_file = collections.OrderedDict()
                for p in stage_params:
                    if p.expert is not None:
                        by_file.setdefault((p.moe_layer, p.expert), collections.OrderedDict())[p.name] = \
                            sl(p, "fp32").to(lp_dtype).clone()
                dsmoe_files.write_expert_files(lay.ds_line, ck, mp, by_file)
                dsmoe_files.write_expp_files(lay.ds_line, ck, mp, lay.ep)

            # ---- optimizer shards, one per DP rank
            for d in range(lay.dp):
                ep_rank, edp_rank = _ep_coords(lay, d) if dsmoe else (0, 0)
                base_state, fp32_parts, maps, pads, counts, hyper = {}, [], [], [], [], []
                for gi, (g, sizes, flats) in enumerate(group_sets[ep_rank]):
                    r = edp_rank if g.moe else d
                    lo, hi = r * g.partition, (r + 1) * g.partition
                    pad = padding_of(g, r)
                    part = {k: v[lo:hi].clone() for k, v in flats.items()}
                    base_state[gi] = {"step": step_value, "exp_avg": part["exp_avg"], "exp_avg_sq": part["exp_avg_sq"]}
                    fp32 = part["fp32"] if lay.bf16_optimizer else part["fp32"][:g.partition - pad].clone()
                    fp32_parts.append(fp32)
                    maps.append(fragment_map(g, sizes, r))
                    pads.append(pad)
                    counts.append(g.count)
                    hyper.append(dsmoe_files.tutorial_hyper(g.moe, lay.ep, gi) if dsmoe and lay.moe_groups == "tutorial"
                                 else _hyper(gi, g.moe, lay.ep))
                osd = collections.OrderedDict()
                if not lay.bf16_optimizer:
                    osd["loss_scaler"] = _loss_scaler(lay)
                    osd["dynamic_loss_scale"] = lay.dtype == "fp16"
                    osd["overflow"] = False
                osd["clip_grad"] = 1.0
                if lay.elastic:  # per group, padding removed, no hyper-parameters
                    osd["base_optimizer_state"] = [
                        {k: (v[:v.numel() - pads[g]].clone() if torch.is_tensor(v) and v.dim() == 1 else v)
                         for k, v in base_state[g].items()} for g in range(len(base_state))]
                else:
                    osd["base_optimizer_state"] = {"state": base_state, "param_groups": hyper}
                osd["single_partition_of_fp32_groups"] = fp32_parts
                if not lay.bf16_optimizer:
                    osd["zero_stage"] = stubs.ZeroStageEnum(lay.zero)
                osd["group_paddings"] = pads
                osd["partition_count"] = counts
                ds_version = dsmoe_files.LINES[lay.ds_line]["version"] if dsmoe else lay.ds_version
                osd["ds_version"] = ds_version
                osd["param_slice_mappings"] = maps
                zsd = {"optimizer_state_dict": osd, "ds_config": _ds_config(lay), "ds_version": ds_version}
                _save(zsd, os.path.join(ck, f"{prefix}zero_pp_rank_{d}_mp_rank_{mp:02d}_optim_states.pt"),
                      device_of(d), list(_tensors(osd["base_optimizer_state"])) + fp32_parts)
        log(f"stage {s} written")

    if truth_dir:
        write_truth(model, lay, truth, uc_info, truth_dir, step_value)


def tp_shape(p: Param, tp):
    shape = list(p.shape)
    if p.kind in ("col", "swiglu", "subparams"):
        shape[0] //= tp
    elif p.kind == "row":
        shape[1] //= tp
    return tuple(shape)


def write_truth(model: Model, lay: Layout, truth: Truth, uc_info, truth_dir, step_value):
    """The universal layout as ds_to_universal computes it, from the unsharded tensors."""
    zero = os.path.join(truth_dir, "universal", "zero")
    seen = set()
    params = []
    for p in model.params:
        if p.name in seen:
            continue
        seen.add(p.name)
        d = os.path.join(zero, p.name)
        os.makedirs(d, exist_ok=True)
        md = universal_metadata(p, uc_info)
        shape = None
        for state in STATES:
            if lay.zero == 3 and lay.tp == 1:  # ds_to_universal's ZeRO-3 (TP = 1) output: the bare 1-D tensor, unpadded
                t = truth.full(p, state, 0)
                shape = list(t.shape)
                torch.save(t.reshape(-1).clone(), os.path.join(d, f"{state}.pt"))
                continue
            t = truth.universal(p, state, lay.tp)
            shape = list(t.shape)
            sd = dict(md)
            sd["param"] = t
            torch.save(sd, os.path.join(d, f"{state}.pt"))
        torch.save(step_value, os.path.join(d, "step.pt"))
        params.append({"name": p.name, "shape": shape, "kind": p.kind, "vocab": p.vocab,
                       "expert": p.expert, "moe_layer": p.moe_layer,
                       "metadata": sorted(md.keys())})
    meta = {"layout": lay.__dict__, "model": model.cfg.__dict__, "padded_vocab": model.padded_vocab,
            "pipe": model.pipe, "uc_info": model.uc_info, "params": params,
            "step": lay.step, "step_tensor": lay.step_tensor}
    with open(os.path.join(truth_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
