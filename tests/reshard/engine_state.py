#!/usr/bin/python3
"""Checks against the state DeepSpeed's real engine held, as scripts/verify/ds_engine/train_engine.py records it
(<dir>/state_rank<R>.pt: {"step", "global_steps", "params": {name: {"weight", "fp32", "exp_avg", "exp_avg_sq"}}},
read through DeepSpeed's safe_get_full_fp32_param / safe_get_full_optimizer_state).

  engine_state.py union UNIVERSAL STATE_DIR   a universal folder (zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt)
                                              holds exactly the engine's params, each state bit for bit
  engine_state.py same STATE_DIR_A STATE_DIR_B two engine records hold the same names, states and step
                                              (e.g. resumed from ucp-load's output vs DeepSpeed's universal load)
  engine_state.py parts PARTITIONS_JSON PREFIX  for entry i of PARTITIONS_JSON (DeepSpeed's own PipelineModule
                                              partitions, {"method", "pp", "parts"}), the DeepSpeed checkpoint
                                              PREFIX<i>/ (latest names its step) puts on stage s exactly the
                                              layers parts[s] .. parts[s+1]-1 (mp_rank_<s>_model_states.pt's
                                              param_shapes, names <layer>.<param>)
  engine_state.py roundtrip U V [V ...]        tests/reshard/same_universal.py U V and V U for every V, in one
                                              process (its main, unchanged)
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


def parts(partitions_json, prefix):
    cases = json.load(open(partitions_json))
    bad = []
    for i, c in enumerate(cases):
        d = f"{prefix}{i}"
        step = os.path.join(d, open(os.path.join(d, "latest")).read().strip())
        got = []
        for s in range(c["pp"]):
            shapes = torch.load(os.path.join(step, f"mp_rank_{s:02d}_model_states.pt"))["param_shapes"]
            got.append(sorted({int(n.split(".")[0]) for g in shapes for n in g}))
        want = [list(range(c["parts"][s], c["parts"][s + 1])) for s in range(c["pp"])]
        if got != want:
            bad.append(f"{c['method']} pp {c['pp']}: {got} vs DeepSpeed's {want}")
    print(f"{len(cases)} partitions equal DeepSpeed's" if not bad else f"differ: {bad}")
    return not bad


def roundtrip(u, others):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import same_universal
    bad = []
    for v in others:
        for a, b in ((u, v), (v, u)):
            sys.argv = ["same_universal.py", a, b]
            try:
                same_universal.main()
            except SystemExit as e:
                if e.code:
                    bad.append(f"{a} vs {b}")
    print(f"{len(others)} round trips the same" if not bad else f"differ: {bad}")
    return not bad


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "roundtrip":
        sys.exit(0 if roundtrip(sys.argv[2], sys.argv[3:]) else 1)
    if len(sys.argv) != 4 or sys.argv[1] not in ("union", "same", "parts"):
        sys.exit(__doc__)
    ok = {"union": union, "same": same, "parts": parts}[sys.argv[1]](sys.argv[2], sys.argv[3])
    sys.exit(0 if ok else 1)
