"""Independent check of a pec-restore output for the native DeepSpeed MoE layout, with torch.
Every expert's tensors (expert file, and its fp32 / exp_avg / exp_avg_sq fragments in each optimizer
shard) must equal those of the checkpoint of the step the report says it was restored from; all the
rest must equal the target step's checkpoint. Exit 0 when everything matches.
Usage: verify_restore.py RESTORED_STEP_DIR REPORT.json EP DATA_BEFORE_EXPERT(0|1) STEP=DIR..."""
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401  (registers the DeepSpeed stand-in classes for torch.load)


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def same(a, b, where, skip=()):
    """Raises AssertionError at the first difference; paths in `skip` are not compared."""
    if where in skip:
        return
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)):
            raise AssertionError(f"tensor differs at {where}")
    elif isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            raise AssertionError(f"keys differ at {where}")
        for k in a:
            same(a[k], b[k], f"{where}.{k}", skip)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f"length differs at {where}")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]", skip)
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        if type(a) is not type(b):
            raise AssertionError(f"type differs at {where}")
        same(vars(a), vars(b), where, skip)
    else:
        if type(a).__name__ != type(b).__name__ or repr(a) != repr(b):
            raise AssertionError(f"value differs at {where}: {a!r} vs {b!r}")


def main():
    restored, report_path, ep, dbe = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    ckpt = {int(a.split("=")[0]): a.split("=", 1)[1] for a in sys.argv[5:]}
    report = json.load(open(report_path))
    target = report["step"]
    src = {(e["moe_layer"], e["expert"]): e["restored_step"] for e in report["experts"]}
    experts_per_layer = {}
    for (l, e) in src:
        experts_per_layer[l] = max(experts_per_layer.get(l, 0), e + 1)
    tdir = ckpt[target]
    names = sorted(os.listdir(tdir))
    if sorted(os.listdir(restored)) != names:
        raise AssertionError(f"file set differs: {sorted(os.listdir(restored))} vs {names}")
    moe_layers = set()
    optim = [n for n in names if re.match(r"(bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt$", n)]
    for n in optim:
        for g in load(os.path.join(tdir, n))["optimizer_state_dict"]["param_slice_mappings"]:
            for name in g:
                m = re.search(r"layers\.(\d+)\..*deepspeed_experts\.(\d+)\.", name)
                if m:
                    moe_layers.add(int(m.group(1)))
    moe_index = {tl: i for i, tl in enumerate(sorted(moe_layers))}
    dp = len(optim)
    checked = 0
    for n in names:
        r = load(os.path.join(restored, n))
        m = re.match(r"layer_(\d+)_expert_(\d+)_mp_rank_\d+_model_states\.pt$", n)
        if m:
            step = src[(int(m.group(1)), int(m.group(2)))]
            same(r, load(os.path.join(ckpt[step], n)), n)
            checked += 1
            continue
        t = load(os.path.join(tdir, n))
        if n in optim:
            d = int(re.search(r"zero_pp_rank_(\d+)_", n).group(1))
            ep_rank = d // (dp // ep) if dbe else d % ep
            osd = t["optimizer_state_dict"]
            cache = {}
            for g, mapping in enumerate(osd["param_slice_mappings"]):
                views = [osd["single_partition_of_fp32_groups"][g], osd["base_optimizer_state"]["state"][g]["exp_avg"],
                         osd["base_optimizer_state"]["state"][g]["exp_avg_sq"]]
                for name, frag in mapping.items():
                    mm = re.search(r"layers\.(\d+)\..*deepspeed_experts\.(\d+)\.", name)
                    if not mm:
                        continue
                    layer = moe_index[int(mm.group(1))]
                    glob = ep_rank * (experts_per_layer[layer] // ep) + int(mm.group(2))
                    step = src[(layer, glob)]
                    if step not in cache:
                        cache[step] = load(os.path.join(ckpt[step], n))["optimizer_state_dict"]
                    so = cache[step]
                    sviews = [so["single_partition_of_fp32_groups"][g], so["base_optimizer_state"]["state"][g]["exp_avg"],
                              so["base_optimizer_state"]["state"][g]["exp_avg_sq"]]
                    for v, sv in zip(views, sviews):
                        v[frag.start:frag.start + frag.numel] = sv[frag.start:frag.start + frag.numel]
                    checked += 1
        same(r, t, n)
    print(f"verify_restore: {len(names)} files, {checked} expert pieces match")


if __name__ == "__main__":
    main()
