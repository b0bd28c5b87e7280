"""Fixtures of ucp-info / ucp-diff (tests/inspect): small native checkpoints from the generator
(tests/generator/dsgen) with what the generator itself knows about them (expect.json: layout, parameter count,
experts, dtypes, DeepSpeed line), a copy of one with a single optimizer value changed (changed.json
names the parameter and state), and a copy with a damaged shard.
Usage: /usr/bin/python3 tests/inspect/fixtures.py OUT_DIR"""
import json
import math
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "generator"))

SMALL = dict(layers=2, hidden=16, heads=2, kv_heads=2, ffn=32, vocab=50, seq=8)

CASES = {
    # name: (ModelConfig kwargs, Layout kwargs)
    "gpt_tp2_pp2_dp2": (dict(family="gpt", **SMALL), dict(tp=2, pp=2, dp=2, dtype="bf16")),
    "moe_dp4_ep2_fp16": (dict(family="dsmoe", experts=4, **dict(SMALL, layers=4)),
                         dict(dp=4, ep=2, dtype="fp16", ds_line="0.19.3")),
}


def expect(model, lay, out):
    """What the generator knows: the universal parameters (TP replicas once, vocabulary padding cut)."""
    import dsgen
    meta = json.load(open(os.path.join(out, "truth", "meta.json")))
    params = meta["params"]
    per_layer = {}
    for p in params:
        if p["expert"] is not None:
            per_layer.setdefault(p["moe_layer"], set()).add(p["expert"])
    dsmoe = model.cfg.family == "dsmoe"
    return {
        "tag": f"global_step{lay.step}",
        "step": lay.step,
        "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep, "zero_stage": lay.zero,
        "pipeline": lay.pp > 1,
        "tensors": len(params),
        "parameters": sum(math.prod(p["shape"]) for p in params),
        "expert_parameters": sum(math.prod(p["shape"]) for p in params if p["expert"] is not None),
        "experts_per_layer": [len(per_layer[k]) for k in sorted(per_layer)],
        "model_dtype": {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[lay.dtype],
        "ds_line": lay.ds_line if dsmoe else None,
        "ds_version": dsgen.dsmoe.LINES[lay.ds_line]["version"] if dsmoe else lay.ds_version,
    }


def autoep_zero3(out):
    """DeepSpeed AutoEP under ZeRO-3 (partition-native, no expert files: the expert counts come from
    the fused weights) and what its generator knows (truth/meta.json)."""
    from dsgen import autoep
    d = os.path.join(out, "autoep_zero3")
    shutil.rmtree(d, ignore_errors=True)
    autoep.write(d, os.path.join(d, "truth"), dp=2, ep=2, zero=3, layers=2, experts=4, step=7)
    meta = json.load(open(os.path.join(d, "truth", "meta.json")))
    experts = [p for p in meta["params"] if p["expert"]]
    layers = sorted({p["name"].rsplit(".", 1)[0] for p in experts})
    x = {"tag": "global_step7", "step": 7, "tp": 1, "pp": 1, "dp": 2, "ep": 2, "zero_stage": 3, "pipeline": False,
         "tensors": len(meta["params"]),
         "parameters": sum(math.prod(p["shape"]) for p in meta["params"]),
         "expert_parameters": sum(math.prod(p["shape"]) for p in experts),
         "experts_per_layer": [meta["num_experts"]] * len(layers),
         "model_dtype": "bfloat16", "ds_line": None, "ds_version": autoep.DS_VERSION}
    with open(os.path.join(d, "expect.json"), "w") as f:
        json.dump(x, f, indent=1)


def change_one_value(src, dst):
    """dst: a copy of src whose exp_avg of the first parameter of DP rank 0's first group is moved by
    0.25 at that parameter's first element; changed.json names it."""
    import torch
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("truth"))
    step = open(os.path.join(dst, "latest")).read().strip()
    shard = os.path.join(dst, step, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    if not os.path.exists(shard):
        shard = os.path.join(dst, step, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    sd = torch.load(shard, weights_only=False)
    osd = sd["optimizer_state_dict"]
    name, frag = next(iter(osd["param_slice_mappings"][0].items()))
    osd["base_optimizer_state"]["state"][0]["exp_avg"][frag.start] += 0.25
    torch.save(sd, shard)
    with open(os.path.join(dst, "changed.json"), "w") as f:
        json.dump({"param": name, "state": "exp_avg"}, f)


def damage_shard(src, dst):
    """dst: a copy of src with one byte of DP rank 1's optimizer shard flipped in its tensor data
    (the zip record's CRC-32 no longer matches); damaged.json names the file."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("truth"))
    step = open(os.path.join(dst, "latest")).read().strip()
    name = next(n for n in sorted(os.listdir(os.path.join(dst, step))) if n.endswith("zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    path = os.path.join(dst, step, name)
    import struct
    import zipfile
    with zipfile.ZipFile(path) as z:
        rec = max(z.infolist(), key=lambda i: i.file_size)  # the largest tensor record
    data = bytearray(open(path, "rb").read())
    o = rec.header_offset
    name_len, extra_len = struct.unpack("<HH", data[o + 26:o + 30])
    data[o + 30 + name_len + extra_len + rec.file_size // 2] ^= 0x5A  # inside its bytes (stored, not compressed)
    open(path, "wb").write(bytes(data))
    with open(os.path.join(dst, "damaged.json"), "w") as f:
        json.dump({"file": name}, f)


def main():
    import dsgen
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, (mk, lk) in CASES.items():
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        lay = dsgen.Layout(**lk)
        model = dsgen.generate(d, dsgen.ModelConfig(**mk), lay)
        with open(os.path.join(d, "expect.json"), "w") as f:
            json.dump(expect(model, lay, d), f, indent=1)
    autoep_zero3(out)
    for name, fn in (("moe_changed", change_one_value), ("moe_damaged", damage_shard)):
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        fn(os.path.join(out, "moe_dp4_ep2_fp16"), d)
    print(f"fixtures: {len(CASES) + 3} checkpoints in {out}")


if __name__ == "__main__":
    main()
