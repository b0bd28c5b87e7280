#!/usr/bin/python3
"""Checks the universal checkpoint ucp-union wrote for an AutoEP checkpoint against the generator's
ground truth (tests/generator/dsgen/autoep.py write_truth), with Python torch.load only: every
zero/<param>/<state>.pt bit for bit with the same keys in the same order (expert weights
{param: [E, ...], cat_dim: 0, is_expert_param: True, ep_num_experts: E}, as
deepspeed/checkpoint/autoep_universal.py:333-338 writes them), step.pt, no extra parameter folders,
and the model-states files (mp_rank_00, or every zero_pp_rank_<d> under ZeRO-3) copied byte for byte;
for a ZeRO-3 source the dense parameters are ds_to_universal's bare 1-D tensors (ds_to_universal.py:375-382). Then it slices every expert weight the way DeepSpeed's
universal loader does (checkpoint/universal_checkpoint.py:125-137) for each EP size given with --ep
and compares with the truth. Usage: check_universal.py <universal_dir> <generated_dir> [--ep N ...]
[--input <checkpoint ucp-union read, when not the generated one>]"""
import filecmp
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401
import torch  # noqa: E402

STATES = ("fp32", "exp_avg", "exp_avg_sq")


def same(a, b):
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))
    return type(a) is type(b) and a == b


def main():
    out, gen = sys.argv[1], sys.argv[2]
    eps = [int(x) for i, x in enumerate(sys.argv) if i > 0 and sys.argv[i - 1] == "--ep"]
    # --input DIR: the checkpoint ucp-union read (default: the generated one), whose mp_rank file is copied
    inputs = [x for i, x in enumerate(sys.argv) if i > 0 and sys.argv[i - 1] == "--input"]
    src_dir = inputs[0] if inputs else gen
    meta = json.load(open(os.path.join(gen, "truth", "meta.json")))
    errors = []
    names = {p["name"] for p in meta["params"]}
    have = {d for d in os.listdir(os.path.join(out, "zero")) if os.path.isdir(os.path.join(out, "zero", d))}
    if have != names:
        errors.append(f"parameter folders differ: extra {sorted(have - names)}, missing {sorted(names - have)}")
    for p in meta["params"]:
        for state in STATES:
            rel = os.path.join("zero", p["name"], f"{state}.pt")
            a = torch.load(os.path.join(out, rel), weights_only=False)
            b = torch.load(os.path.join(gen, "truth", "universal", rel), weights_only=False)
            if torch.is_tensor(b):  # ZeRO-3 source: ds_to_universal's bare 1-D tensor (dense parameters)
                if not same(a, b):
                    errors.append(f"{rel}: differs from the flat truth")
                continue
            if list(a.keys()) != list(b.keys()):
                errors.append(f"{rel}: keys {list(a.keys())}, expected {list(b.keys())}")
                continue
            for k in b:
                if not same(a[k], b[k]):
                    errors.append(f"{rel}: {k} differs")
            if p["expert"]:
                E = a.get("ep_num_experts")
                for ep in eps:  # universal_checkpoint.py:125-137
                    per = E // ep
                    for r in range(ep):
                        if not same(a["param"][r * per:(r + 1) * per], b["param"][r * per:(r + 1) * per]):
                            errors.append(f"{rel}: EP {ep} rank {r} slice differs")
        s = torch.load(os.path.join(out, "zero", p["name"], "step.pt"), weights_only=False)
        if s != meta["step"] or type(s) is not int:
            errors.append(f"{p['name']}/step.pt: {s!r}, expected {meta['step']}")
    tag_dir = os.path.join(src_dir, open(os.path.join(src_dir, "latest")).read().strip())
    model_files = [f for f in sorted(os.listdir(tag_dir)) if f.endswith("_model_states.pt") and not f.startswith("layer_")]
    for f in model_files:  # mp_rank_00 (ZeRO-1/2) or every zero_pp_rank_<d>_mp_rank_00 (ZeRO-3)
        if not filecmp.cmp(os.path.join(tag_dir, f), os.path.join(out, f), shallow=False):
            errors.append(f"{f} is not a byte copy of the source")
    if not model_files:
        errors.append("no model-states file in the source")
    for e in errors[:20]:
        print("MISMATCH", e)
    if errors:
        sys.exit(1)
    print(f"ok: {len(meta['params'])} parameters")


if __name__ == "__main__":
    main()
