"""ZeRO-3 checkpoints (formats.md section 2, "ZeRO-3 shard" and "ZeRO-3 details"): every (TP rank T,
DP rank D) writes zero_pp_rank_D_mp_rank_TT_model_states.pt (0-element module tensors, param_shapes
per sub-group: the TP-slice shapes of rank T) and [bf16_]zero_pp_rank_D_mp_rank_TT_optim_states.pt
with one flat fp32 group per sub-group holding each TP slice's ceil(numel/dp) DP slice of this rank
(padding included). PP = 1: DeepSpeed's PipelineEngine refuses ZeRO stage 2 and 3."""
import collections
import math
import os

import torch

from . import stubs


def sub_groups(params, dp, sub_group_size, numel):
    """[(optimizer group, [params])]: params appended in group order until the per-rank slice sizes
    (numel(p) = the TP-slice element count) reach sub_group_size; never across optimizer groups."""
    out = []
    for g in (0, 1):
        cur, size = [], 0
        for p in (p for p in params if p.group == g):
            cur.append(p)
            size += math.ceil(numel(p) / dp)
            if size >= sub_group_size:
                out.append((g, cur))
                cur, size = [], 0
        if cur:
            out.append((g, cur))
    return out


def write(model, lay, truth, ck, common, log):
    """common(module, param_shapes, zero_stage) -> the model-states dict of the generator."""
    from .writer import DTYPES, STATES, _ds_config, _hyper, _loss_scaler, tp_shape, tp_slice
    if lay.pp != 1 or model.cfg.family == "dsmoe":
        raise ValueError("ZeRO-3 generation supports PP = 1 dense models")
    lp = DTYPES[lay.dtype]
    step_value = torch.tensor(float(lay.step)) if lay.step_tensor else lay.step
    module = collections.OrderedDict((p.name, torch.empty(0, dtype=lp)) for p in model.params)
    if model.cfg.family != "dsmoe":  # Megatron's nested module (writer.nest_megatron_module)
        from .writer import nest_megatron_module
        module = nest_megatron_module(module)
    prefix = "bf16_" if lay.dtype == "bf16" else ""
    n_groups = 0
    for t in range(lay.tp):
        groups = sub_groups(model.params, lay.dp, lay.sub_group_size, lambda p: math.prod(tp_shape(p, lay.tp)))
        n_groups = len(groups)
        full = {}  # this TP rank's slice of every parameter, flattened
        for _, ps in groups:
            for p in ps:
                full[p.name] = {s: tp_slice(truth, p, s, t, lay.tp).reshape(-1) for s in STATES}
        shapes = [collections.OrderedDict((p.name, torch.Size(tp_shape(p, lay.tp))) for p in ps) for _, ps in groups]
        for d in range(lay.dp):
            sd = common(module, shapes, stubs.ZeroStageEnum.weights)
            torch.save(sd, os.path.join(ck, f"zero_pp_rank_{d}_mp_rank_{t:02d}_model_states.pt"))
            flats, state = [], {}
            for sg, (g, ps) in enumerate(groups):
                parts = {s: [] for s in STATES}
                for p in ps:
                    n = full[p.name]["fp32"].numel()
                    per = math.ceil(n / lay.dp)
                    for s in STATES:
                        piece = torch.zeros(per, dtype=torch.float32)
                        lo, hi = min(d * per, n), min((d + 1) * per, n)
                        piece[:hi - lo] = full[p.name][s][lo:hi]
                        parts[s].append(piece)
                flats.append(torch.cat(parts["fp32"]))
                state[sg] = {"step": step_value, "exp_avg": torch.cat(parts["exp_avg"]),
                             "exp_avg_sq": torch.cat(parts["exp_avg_sq"])}
            hyper = []
            for g in (0, 1):
                h = _hyper(g, False, 1)
                h["params"] = [sg for sg, (gg, _) in enumerate(groups) if gg == g]
                hyper.append(h)
            osd = collections.OrderedDict()
            osd["zero_stage"] = stubs.ZeroStageEnum.weights
            osd["loss_scaler"] = _loss_scaler(lay)
            osd["dynamic_loss_scale"] = lay.dtype == "fp16"
            osd["overflow"] = False
            osd["partition_count"] = lay.dp
            osd["optimizer_state_dict"] = {"state": state, "param_groups": hyper}
            osd["fp32_flat_groups"] = flats
            zsd = {"optimizer_state_dict": osd, "ds_config": _ds_config(lay), "ds_version": lay.ds_version}
            # device_tags: the optimizer state lives on the rank's GPU (Megatron order, tp fastest)
            from .writer import _save, _tensors
            _save(zsd, os.path.join(ck, f"{prefix}zero_pp_rank_{d}_mp_rank_{t:02d}_optim_states.pt"),
                  f"cuda:{(d * lay.tp + t) % 8}" if lay.device_tags else None, list(_tensors(osd["optimizer_state_dict"])) + flats)
    log(f"zero-3: tp {lay.tp}, {n_groups} sub-groups per TP rank")
    return n_groups
