"""DeepSpeed AutoEP checkpoints (DeepSpeed >= 0.19.2, ZeRO-1/2, TP = PP = 1) written as DeepSpeed
v0.19.5's save code writes them, and the universal form deepspeed/checkpoint/autoep_universal.py
writes for them, computed independently from the seeded full tensors. docs/formats.md "AutoEP" has the
facts; line numbers below are deepspeedai/DeepSpeed at tag v0.19.5.

Model: a small Hugging Face style MoE decoder (Qwen3-MoE layer order: self_attn, mlp,
input_layernorm, post_attention_layernorm) whose every `mlp` AutoEP replaced with AutoEPMoELayer
(module_inject/auto_ep_layer.py:356): `mlp.router.gate.weight` [E, H] (router registered first,
:412, TokenChoiceTopKRouter.gate = nn.Linear, moe/ep_router.py:65) then `mlp.experts.w1/w2/w3`
(GroupedExperts, moe/ep_experts.py:212-214: w1 [E_local, F, H], w2 [E_local, H, F], w3 [E_local, F, H]).
load_balance_coeff is None (no persistent expert_bias buffer, auto_ep_layer.py:507-514)."""
import collections
import json
import os
import zlib

import torch

from . import stubs
from .writer import build_group, fragment_map, padding_of

STATES = ("fp32", "exp_avg", "exp_avg_sq")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DS_VERSION = "0.19.5"


def _full(seed, name, state, shape):
    g = torch.Generator()
    g.manual_seed((zlib.crc32(f"{name}|{state}".encode()) ^ seed) & 0x7FFFFFFF)
    t = torch.randn(shape, generator=g)
    return t.abs() * 1e-3 if state == "exp_avg_sq" else t


def model_params(layers, experts, hidden, ffn, vocab):
    """(name, full shape, expert) in module.parameters() order; expert params have the full [E, ...] shape."""
    H, F, E = hidden, ffn, experts
    out = [("model.embed_tokens.weight", (vocab, H), False)]
    for i in range(layers):
        L = f"model.layers.{i}."
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append((L + f"self_attn.{p}.weight", (H, H), False))
        out.append((L + "mlp.router.gate.weight", (E, H), False))
        out.append((L + "mlp.experts.w1", (E, F, H), True))
        out.append((L + "mlp.experts.w2", (E, H, F), True))
        out.append((L + "mlp.experts.w3", (E, F, H), True))
        out.append((L + "input_layernorm.weight", (H, ), False))
        out.append((L + "post_attention_layernorm.weight", (H, ), False))
    out.append(("model.norm.weight", (H, ), False))
    out.append(("lm_head.weight", (vocab, H), False))
    return out


def ep_coords(d, dp, ep, data_before_expert):
    """(ep_rank, expert-DP rank) of DP rank d: utils/groups.py:304 _create_expert_and_data_parallel;
    the same rank sets checkpoint/autoep_universal.py:262-269 _autoep_zero12_dp_ranks reads back."""
    edp = dp // ep
    if data_before_expert:
        return d // edp, d % edp
    return d % ep, d // ep


def ds_config(zero, dtype, dp, data_before_expert, ep, sub_group_size=1_000_000_000):
    zopt = {"stage": zero}
    if zero == 3:  # the ZeRO-3 setting the run used (stage3.py:1129-1152 cuts sub-groups by it)
        zopt["sub_group_size"] = sub_group_size
    cfg = {"train_batch_size": 8 * dp, "zero_optimization": zopt,
           "bf16": {"enabled": dtype == "bf16"}, "fp16": {"enabled": dtype == "fp16"},
           "expert_parallel": {"enabled": True, "autoep_size": ep}}
    if data_before_expert:
        # runtime/constants.py:518 USE_DATA_BEFORE_EXPERT_PARALLEL; ds_to_universal.py:877 reads it.
        cfg["use_data_before_expert_parallelism"] = True
    return cfg


def autoep_layer_info(layers, experts, ep, dp, zero3=False, ep_rank=0, edp_rank=0):
    """engine.py:4986-5017: the entry every rank builds per AutoEPMoELayer; rank 0 (EP rank 0,
    expert-DP rank 0) writes the mp_rank file, so its own ranks are recorded. Under ZeRO-3 every rank
    writes its own model file (engine.py:5090) with its own ep_rank / expert-DP rank."""
    per = experts // ep
    out = []
    for i in range(layers):
        out.append({
            "moe_layer_id": i,
            "module_path": f"model.layers.{i}.mlp",
            "num_experts": experts,
            "num_local_experts": per,
            "ep_size": ep,
            "expert_key_prefix": f"model.layers.{i}.mlp.experts",
            "checkpoint_format": "zero3_partitioned" if zero3 else "per_expert_files",
            "checkpoint_format_version": 1 if zero3 else None,
            "ep_group_name": f"ep_size_{ep}",
            "ep_rank": ep_rank,
            "expert_data_parallel_rank": edp_rank,
            "expert_data_parallel_world_size": dp // ep,
            "global_expert_start": ep_rank * per,
            "global_expert_end": ep_rank * per + per,
        })
    return out


def model_states(module, param_shapes, frozen, cfg, info, *, dp, step, layers, experts, global_samples=None):
    """The model-states dict of _save_moe_checkpoint (engine.py:5090-5152)."""
    sd = {}  # _common_checkpoint_state (:4840-4862)
    sd["module"] = module
    sd["buffer_names"] = []
    sd["optimizer"] = None
    sd["param_shapes"] = param_shapes
    sd["frozen_param_shapes"] = frozen
    sd["shared_params"] = {}
    sd["frozen_param_fragments"] = frozen
    sd["lr_scheduler"] = None
    sd["data_sampler"] = None
    sd["random_ltd"] = None
    sd["sparse_tensor_module_names"] = set()
    sd["skipped_steps"] = 0
    sd["global_steps"] = step
    # samples consumed so far: step * train_batch_size unless the run changed its DP size on the way
    sd["global_samples"] = step * 8 * dp if global_samples is None else global_samples
    sd["dp_world_size"] = dp
    sd["mp_world_size"] = 1
    sd["checkpoint_parallel_dimensions"] = {"pp_degree": 1, "tp_degree": 1}  # :238-246, constants.py:46-48
    sd["ds_config"] = cfg
    sd["ds_version"] = DS_VERSION
    sd["num_experts"] = [experts] * layers  # engine.py:1734-1740: one entry per MoE / AutoEP layer
    sd["ds_autoep_layers"] = info  # :5126
    # :5112-5122 and :5127-5128: universal_checkpoint_info = {} gains the version, the expert pattern
    # and the layer list (constants.py:59-61, :119).
    sd["universal_checkpoint_info"] = {"universal_checkpoint_version": 0.3,
                                       "expert_parameter_patterns": [r".*\.experts\.w[123]$"],
                                       "ds_autoep_layers": info}
    return sd


def _hyper(group, name, moe):
    d = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
         "bias_correction": True, "params": group if isinstance(group, list) else [group], "name": name}
    if moe:
        d["moe"] = True
    return d


def write(out_dir, truth_dir, *, dp=4, ep=2, zero=1, dtype="bf16", layers=2, experts=4, hidden=8, ffn=12,
          vocab=16, step=7, seed=4321, data_before_expert=False, sub_group_size=1_000_000_000,
          global_samples=None):
    if dp % ep or experts % ep:
        raise ValueError("EP must divide DP and the expert count")
    if zero not in (1, 2, 3):
        raise ValueError("AutoEP fixtures: ZeRO stage 1, 2 or 3")
    per = experts // ep
    tag = f"global_step{step}"
    ck = os.path.join(out_dir, tag)
    os.makedirs(ck, exist_ok=True)
    with open(os.path.join(out_dir, "latest"), "w") as f:
        f.write(tag)
    lp = DTYPES[dtype]
    params = model_params(layers, experts, hidden, ffn, vocab)
    full = {(n, s): _full(seed, n, s, shape) for n, shape, _ in params for s in STATES}

    def local(name, state, ep_rank):  # an EP rank's [E_local, ...] slice of an expert parameter
        return full[(name, state)][ep_rank * per:(ep_rank + 1) * per]

    if zero == 3:
        _write_zero3(ck, params, full, local, dp=dp, ep=ep, dtype=dtype, layers=layers, experts=experts, step=step,
                     data_before_expert=data_before_expert, sub_group_size=sub_group_size,
                     global_samples=global_samples)
        if truth_dir:
            write_truth(truth_dir, params, full, experts, step, zero3=True)
        return autoep_layer_info(layers, experts, ep, dp, zero3=True)

    # Param groups: configure_moe_param_groups (moe/utils.py:155-175) wraps model.parameters() into
    # {'params': ..., 'name': 'dense-params'} and split_params_into_different_moe_groups_for_optimizer
    # (:72-148) moves the expert params (allreduce False, group_name 'ep_size_<EP>', auto_ep_layer.py:480-484)
    # into {'name': 'ep_size_<EP>', 'moe': True} appended after the dense group. Expert groups are
    # partitioned over the expert-DP group (DP / EP ranks), dense groups over all DP ranks.
    dense = [(n, s) for n, s, e in params if not e]
    expert = [(n, s) for n, s, e in params if e]
    groups_by_ep = {}
    for r in range(ep):
        gs = []
        for names_shapes, count, moe in ((dense, dp, False), (expert, dp // ep, True)):
            names = [n for n, _ in names_shapes]
            shapes = [((per, ) + tuple(s[1:])) if moe else tuple(s) for _, s in names_shapes]
            sizes = [int(torch.Size(s).numel()) for s in shapes]
            g = build_group(names, names, sizes, count, moe)
            flats = {}
            for state in STATES:
                buf = torch.zeros(g.padded, dtype=torch.float32)
                for n, off, size in zip(names, g.offsets, sizes):
                    src = local(n, state, r) if moe else full[(n, state)]
                    buf[off:off + size] = src.reshape(-1)
                flats[state] = buf
            gs.append((g, sizes, shapes, flats))
        groups_by_ep[r] = gs

    info = autoep_layer_info(layers, experts, ep, dp)
    cfg = ds_config(zero, dtype, dp, data_before_expert, ep)

    # ---- mp_rank_00_model_states.pt (engine.py:5090-5152, written by DP rank 0)
    # module: _get_non_moe_state_dict (:4807-4838) drops experts.w1/w2/w3, keeps the router;
    # clone_tensors_for_torch_save (checkpoint/utils.py:41) makes compact CPU copies (no _metadata).
    module = collections.OrderedDict((n, full[(n, "fp32")].to(lp).clone()) for n, _ in dense)
    # param_shapes: _get_zero_param_shapes (:5244-5284), one OrderedDict per bit16 group, EP rank 0's
    # local shapes for the expert group.
    param_shapes = [collections.OrderedDict((n, torch.Size(s)) for n, s in zip(g.names, shapes))
                    for g, _, shapes, _ in groups_by_ep[0]]
    frozen = collections.OrderedDict() if zero == 2 else None  # save_frozen_param (:5099)
    sd = model_states(module, param_shapes, frozen, cfg, info, dp=dp, step=step, layers=layers, experts=experts,
                      global_samples=global_samples)
    torch.save(sd, os.path.join(ck, "mp_rank_00_model_states.pt"))

    # ---- per-expert files (:5027-5056): written by expert-DP rank 0 of each EP rank, one per
    # (layer, global expert), keys f"{prefix}.{w}.{global_id}" with param[local_id].clone().detach(),
    # file name _get_expert_ckpt_name (:4190-4200).
    for i in range(layers):
        prefix = f"model.layers.{i}.mlp.experts"
        for e in range(experts):
            esd = {f"{prefix}.{w}.{e}": full[(f"{prefix}.{w}", "fp32")][e].to(lp).clone() for w in ("w1", "w2", "w3")}
            torch.save(esd, os.path.join(ck, f"layer_{i}_expert_{e}_mp_rank_00_model_states.pt"))
    # No expp_rank_* file under ZeRO (:5067-5088).

    # ---- ZeRO-1/2 optimizer shards, one per DP rank (stage_1_and_2.py state_dict; file name
    # engine.py:4138-4154: "bf16_" prefix when bf16 is enabled).
    prefix = "bf16_" if dtype == "bf16" else ""
    for d in range(dp):
        ep_rank, edp_rank = ep_coords(d, dp, ep, data_before_expert)
        base_state, fp32_parts, maps, pads, counts, hyper = {}, [], [], [], [], []
        for gi, (g, sizes, _, flats) in enumerate(groups_by_ep[ep_rank]):
            r = edp_rank if g.moe else d
            lo, hi = r * g.partition, (r + 1) * g.partition
            pad = padding_of(g, r)
            part = {k: v[lo:hi].clone() for k, v in flats.items()}
            base_state[gi] = {"step": step, "exp_avg": part["exp_avg"], "exp_avg_sq": part["exp_avg_sq"]}
            fp32_parts.append(part["fp32"][:g.partition - pad].clone())
            maps.append(fragment_map(g, sizes, r))
            pads.append(pad)
            counts.append(g.count)
            hyper.append(_hyper(gi, f"ep_size_{ep}" if g.moe else "dense-params", g.moe))
        osd = collections.OrderedDict()
        osd["loss_scaler"] = (stubs.DynamicLossScaler(init_scale=2.0 ** 12, dtype=torch.float16)
                              if dtype == "fp16" else stubs.LossScaler(scale=1))
        osd["dynamic_loss_scale"] = dtype == "fp16"
        osd["overflow"] = False
        osd["clip_grad"] = 1.0
        osd["base_optimizer_state"] = {"state": base_state, "param_groups": hyper}
        osd["single_partition_of_fp32_groups"] = fp32_parts
        osd["zero_stage"] = stubs.ZeroStageEnum(zero)
        osd["group_paddings"] = pads
        osd["partition_count"] = counts
        osd["ds_version"] = DS_VERSION
        osd["param_slice_mappings"] = maps
        zsd = {"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": DS_VERSION}
        torch.save(zsd, os.path.join(ck, f"{prefix}zero_pp_rank_{d}_mp_rank_00_optim_states.pt"))

    if truth_dir:
        write_truth(truth_dir, params, full, experts, step)
    return info


def write_truth(truth_dir, params, full, experts, step, zero3=False):
    """The universal form from the full tensors: ds_to_universal.py:345-366 merge_tp_slices for dense
    parameters at TP = 1 ({cat_dim: 0, param}), autoep_universal.py:333-338 for expert parameters
    ({param: [E, ...], cat_dim: 0, is_expert_param: True, ep_num_experts: E}); step.pt the raw step
    (:349, ds_to_universal.py:307-309). zero3: ds_to_universal's stage-3 form, dense parameters the
    bare 1-D tensor (merge_zero3_slices, ds_to_universal.py:375-382, _merge_zero_shards :231-266 with
    no slice shapes), expert parameters as above (_save_zero3_autoep_universal_tensor, :597-608)."""
    zero = os.path.join(truth_dir, "universal", "zero")
    listing = []
    for name, shape, is_expert in params:
        d = os.path.join(zero, name)
        os.makedirs(d, exist_ok=True)
        for state in STATES:
            t = full[(name, state)]
            if is_expert:
                sd = {"param": t, "cat_dim": 0, "is_expert_param": True, "ep_num_experts": experts}
            elif zero3:
                sd = t.reshape(-1).clone()
            else:
                sd = {"cat_dim": 0, "param": t}
            torch.save(sd, os.path.join(d, f"{state}.pt"))
        torch.save(step, os.path.join(d, "step.pt"))
        listing.append({"name": name, "shape": list(shape), "expert": is_expert, "flat": zero3 and not is_expert})
    with open(os.path.join(truth_dir, "meta.json"), "w") as f:
        json.dump({"params": listing, "num_experts": experts, "step": step}, f, indent=1)


def _sub_groups(names_shapes, count, sub_group_size):
    """stage3.py:1129-1152 _create_fp16_sub_groups: one parameter group cut into sub-groups, params
    appended in order until their partition_numel() (ceil(numel / partition count),
    partition_parameters.py _partition_param) sum reaches sub_group_size; one sub-group when the
    whole group's sum does not exceed it."""
    pn = [-(-int(torch.Size(s).numel()) // count) for _, s in names_shapes]
    if sub_group_size >= sum(pn):
        return [list(names_shapes)]
    out, cur, size = [], [], 0
    for (n, s), k in zip(names_shapes, pn):
        cur.append((n, s))
        size += k
        if size >= sub_group_size or n == names_shapes[-1][0]:
            out.append(cur)
            cur, size = [], 0
    return out


def _write_zero3(ck, params, full, local, *, dp, ep, dtype, layers, experts, step, data_before_expert,
                 sub_group_size=1_000_000_000, global_samples=None):
    """AutoEP under ZeRO-3, the partition-native format (checkpoint_format 'zero3_partitioned',
    version 1): no per-expert files (engine.py:5025-5027 skips them under partition weights), every
    DP rank d writes zero_pp_rank_<d>_mp_rank_00_model_states.pt (engine.py:5090, name :4156-4175) and
    [bf16_]zero_pp_rank_<d>_mp_rank_00_optim_states.pt (_save_zero_checkpoint :5345-5362, name
    :4150-4154). The optimizer param groups are the dense group then ep_size_<EP> (moe/utils.py:72-175);
    stage3.py:646-675 _get_trainable_parameter_groups keeps them, :833-880 cuts each into sub-groups
    (_sub_groups, :1129-1152), partitioned over the parameter's process group: all DP ranks for the
    dense group, the expert-DP group (DP/EP ranks, ds_zero_partition_group_name 'ep_size_<EP>',
    engine.py:1883-1918) for the expert group. Each parameter is split on its own into
    ceil(numel/count) slices, padding at the end (partition_numel); a rank's flat sub-group is the
    concatenation of its slices (ds_to_universal.py:611-716 reads it back the same way)."""
    per = experts // ep
    edp = dp // ep
    lp = DTYPES[dtype]
    dense = [(n, s) for n, s, e in params if not e]
    expert = [(n, (per, ) + tuple(s[1:])) for n, s, e in params if e]
    cfg = ds_config(3, dtype, dp, data_before_expert, ep, sub_group_size)
    # Sub-groups (stage3.py:833-880): the dense parameter group's, then the expert group's, each cut
    # by _create_fp16_sub_groups over its own partition count (DP, or DP/EP for the experts).
    subs = ([(g, dp, False) for g in _sub_groups(dense, dp, sub_group_size)] +
            [(g, edp, True) for g in _sub_groups(expert, edp, sub_group_size)])
    # module_state_dict under ZeRO-3: partitioned parameters are 0-element placeholders;
    # _get_non_moe_state_dict (:4807-4838) drops experts.w1/w2/w3.
    module = collections.OrderedDict((n, torch.empty(0, dtype=lp)) for n, _ in dense)
    # _get_zero_param_shapes (:5244-5284): ds_shape of every parameter per sub-group; the expert
    # parameters' ds_shape is this EP rank's [E_local, ...] (the same on every rank).
    param_shapes = [collections.OrderedDict((n, torch.Size(s)) for n, s in g) for g, _, _ in subs]
    # _validate_zero3_moe_compatibility (:1828-1873) and _save_moe_checkpoint (:4970-4977) refuse frozen
    # experts; save_frozen_param = partition_gradients (:5097): {} for a model with none frozen.
    frozen = collections.OrderedDict()
    ranks_of = {}  # EP rank -> DP ranks of its expert-DP group, in expert-DP rank order
    for d in range(dp):
        r, e = ep_coords(d, dp, ep, data_before_expert)
        ranks_of.setdefault(r, [None] * edp)[e] = d
    prefix = "bf16_" if dtype == "bf16" else ""
    for d in range(dp):
        r, e = ep_coords(d, dp, ep, data_before_expert)
        info = autoep_layer_info(layers, experts, ep, dp, zero3=True, ep_rank=r, edp_rank=e)
        sd = model_states(module, param_shapes, frozen, cfg, info, dp=dp, step=step, layers=layers, experts=experts,
                          global_samples=global_samples)
        torch.save(sd, os.path.join(ck, f"zero_pp_rank_{d}_mp_rank_00_model_states.pt"))

        flats, state, meta = [], {}, []
        for sg, (names_shapes, count, moe) in enumerate(subs):
            rank = e if moe else d
            parts = {s: [] for s in STATES}
            for n, shape in names_shapes:
                for s in STATES:
                    src = (local(n, s, r) if moe else full[(n, s)]).reshape(-1)
                    size = src.numel()
                    pn = -(-size // count)
                    piece = torch.zeros(pn, dtype=torch.float32)
                    lo, hi = min(rank * pn, size), min((rank + 1) * pn, size)
                    piece[:hi - lo] = src[lo:hi]
                    parts[s].append(piece)
            flats.append(torch.cat(parts["fp32"]))
            state[sg] = {"step": step, "exp_avg": torch.cat(parts["exp_avg"]),
                         "exp_avg_sq": torch.cat(parts["exp_avg_sq"])}
            # stage3.py:3117-3133 _zero3_partition_group_metadata (written when a sub-group holds
            # AutoEP experts): partition_ranks are global ranks of the sub-group's process group.
            meta.append({"sub_group": sg, "partition_count": count, "partition_rank": rank,
                         "partition_ranks": ranks_of[r] if moe else list(range(dp)),
                         "families": ["autoep_expert"] if moe else ["replicated"],
                         "group_names": [f"ep_size_{ep}"] if moe else ["replicated"]})
        osd = collections.OrderedDict()  # stage3.py:3135-3151 _rigid_state_dict
        osd["zero_stage"] = stubs.ZeroStageEnum.weights
        osd["loss_scaler"] = (stubs.DynamicLossScaler(init_scale=2.0 ** 12, dtype=torch.float16)
                              if dtype == "fp16" else stubs.LossScaler(scale=1))
        osd["dynamic_loss_scale"] = dtype == "fp16"
        osd["overflow"] = False
        osd["partition_count"] = dp  # self.partition_count: the DP world size
        osd["ds_zero_partition_groups"] = meta
        # torch's Optimizer.state_dict numbers the fp32 sub-group tensors _set_fp32_optimizer_param_groups
        # (stage3.py:3107-3111) appended to their source param group, in group order.
        ids = [[sg for sg, (_, _, moe) in enumerate(subs) if moe == m] for m in (False, True)]
        osd["optimizer_state_dict"] = {"state": state, "param_groups": [
            _hyper(ids[0], "dense-params", False), _hyper(ids[1], f"ep_size_{ep}", True)]}
        osd["fp32_flat_groups"] = flats
        zsd = {"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": DS_VERSION}  # engine.py:5347
        torch.save(zsd, os.path.join(ck, f"{prefix}zero_pp_rank_{d}_mp_rank_00_optim_states.pt"))
