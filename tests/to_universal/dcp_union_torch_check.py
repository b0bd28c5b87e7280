#!/usr/bin/env python3
"""Outside CI: checks ucp-union's universal folders made from DCP fixtures with the real torch.load.

    python3 dcp_union_torch_check.py <universal folder> <fixture>.truth [<universal folder> <truth> ...]

Run where torch >= 2.x and safetensors are installed (the trixie chroot of ../shared/tools/torch2-env.sh).
For every parameter of manifest.json: torch.load(zero/<p>/fp32.pt)["param"] equals the truth tensor
`model.<p>` (or `<p>`) bit for bit (dtype, shape, bytes); each other state `<s>` equals
`optim.state.<p>.<s>`, step.pt equals `optim.state.<p>.step`; every truth tensor is used; the
param_groups of zero/optimizer_state.pt equal nontensor.json. Prints one line per folder; exit 1 on any
difference.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file


def same(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and torch.equal(a.view(torch.uint8) if a.dim() else a.reshape(1).view(torch.uint8), b.view(torch.uint8) if b.dim() else b.reshape(1).view(torch.uint8))


def check(folder, truth_dir):
    truth = load_file(os.path.join(truth_dir, "tensors.safetensors"))
    used = set()
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    bad = []
    for p in manifest["params"]:
        name = p["name"]
        for state, entry in p["states"].items():
            obj = torch.load(os.path.join(folder, entry["file"]), weights_only=True)
            t = obj["param"]
            key = ("model." + name if "model." + name in truth else name) if state == "fp32" else f"optim.state.{name}.{state}"
            used.add(key)
            if key not in truth or not same(t, truth[key]):
                bad.append(f"{name}/{state}")
        if p.get("step"):
            s = torch.load(os.path.join(folder, "zero", name.replace("/", "_"), "step.pt"), weights_only=True)
            key = f"optim.state.{name}.step"
            used.add(key)
            if key not in truth or not same(s, truth[key]):
                bad.append(f"{name}/step")
    missing = sorted(set(truth) - used)
    nontensor = os.path.join(truth_dir, "nontensor.json")
    groups_ok = True
    if os.path.exists(nontensor):
        want = json.load(open(nontensor))
        opt = torch.load(os.path.join(folder, "zero", "optimizer_state.pt"), weights_only=True)
        got = {}
        for i, g in enumerate(opt["param_groups"]):
            for k, v in g.items():
                got[f"optim.param_groups.{i}.{k}"] = v if isinstance(v, (bool, int, float, type(None))) else str(v)
        groups_ok = got == want
    ok = not bad and not missing and groups_ok
    print(f"{folder}: {'ok' if ok else 'DIFFERS'}: {len(used)} tensors bit-exact of {len(truth)}"
          + (f"; differ {bad[:5]}" if bad else "") + (f"; unused truth {missing[:5]}" if missing else "")
          + ("" if groups_ok else "; param_groups differ"))
    return ok


if __name__ == "__main__":
    args = sys.argv[1:]
    results = [check(args[i], args[i + 1]) for i in range(0, len(args), 2)]
    sys.exit(0 if all(results) else 1)
