#!/usr/bin/python3
"""Checks against the state DeepSpeed's real engine held, as scripts/ds_engine/train_engine.py records it
(<dir>/state_rank<R>.pt: {"step", "global_steps", "params": {name: {"weight", "fp32", "exp_avg", "exp_avg_sq"}}},
read through DeepSpeed's safe_get_full_fp32_param / safe_get_full_optimizer_state).

  engine_state.py union UNIVERSAL STATE_DIR   a universal folder (zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt)
                                              holds exactly the engine's params, each state bit for bit
  engine_state.py same STATE_DIR_A STATE_DIR_B two engine records hold the same names, states and step
                                              (e.g. resumed from ucp-load's output vs DeepSpeed's universal load)
Prints one line; exit 0 = equal."""
import glob
import json
import os
import sys

import torch

KEYS = ("fp32", "exp_avg", "exp_avg_sq")


def merged(folder):
    params, steps, gsteps = {}, set(), set()
    files = sorted(glob.glob(os.path.join(folder, "state_rank*.pt")))
    if not files:
        sys.exit(f"{folder}: no state_rank*.pt")
    for f in files:
        s = torch.load(f)
        steps.update(s["step"])
        gsteps.add(s["global_steps"])
        for n, st in s["params"].items():
            for k, v in st.items():
                if v is None:
                    sys.exit(f"{f}: {n} has no {k}")
            if n in params and any(not torch.equal(params[n][k], st[k]) for k in st):
                sys.exit(f"{f}: {n} differs between ranks")
            params[n] = st
    return params, sorted(steps), sorted(gsteps)


def union(universal, state_dir):
    params, steps, _ = merged(state_dir)
    names = [p["name"] for p in json.load(open(os.path.join(universal, "manifest.json")))["params"]]
    if sorted(names) != sorted(params):
        sys.exit(f"{universal}: names differ from the engine's: {sorted(set(names) ^ set(params))[:6]}")
    bad = []
    for n in names:
        for k in KEYS:
            u = torch.load(os.path.join(universal, "zero", n, k + ".pt"))["param"]
            t = params[n][k]
            if u.dtype != t.dtype or u.shape != t.shape or not torch.equal(u, t):
                bad.append(f"{n}/{k}")
        if not torch.equal(params[n]["weight"], params[n]["fp32"]):
            bad.append(f"{n}/weight")
        st = torch.load(os.path.join(universal, "zero", n, "step.pt"))
        if [float(st)] != steps:
            bad.append(f"{n}/step {float(st)} vs {steps}")
    print(f"{len(names)} params x {len(KEYS)} states equal, step {steps}" if not bad else f"differ: {bad[:8]}")
    return not bad


def same(a, b):
    pa, sa, ga = merged(a)
    pb, sb, gb = merged(b)
    bad = sorted(set(pa) ^ set(pb))
    bad += [f"{n}/{k}" for n in sorted(set(pa) & set(pb)) for k in pa[n] if not torch.equal(pa[n][k], pb[n][k])]
    if sa != sb or ga != gb:
        bad.append(f"step {sa}/{ga} vs {sb}/{gb}")
    total = len(pa) * 4
    print(f"{len(pa)} params x 4 (weight, fp32, exp_avg, exp_avg_sq), step {sa}: {len(bad)} differ" +
          (": " + ", ".join(bad[:8]) if bad else ""))
    return not bad and total > 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("union", "same"):
        sys.exit(__doc__)
    ok = union(sys.argv[2], sys.argv[3]) if sys.argv[1] == "union" else same(sys.argv[2], sys.argv[3])
    sys.exit(0 if ok else 1)
