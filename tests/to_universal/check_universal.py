#!/usr/bin/python3
"""Checks a universal checkpoint written by ucp-union against the generator's ground truth, with
Python torch.load only (independent of ucpkit's reader): every zero/<param>/<state>.pt bit for bit
with its metadata, step.pt, zero/optimizer_state.pt, the copied model files, latest_universal and
manifest.json. Usage: check_universal.py <universal_dir> <generated_dir> [<universal_dir> <generated_dir> ...]
(exit 0 = every pair identical; several pairs share one Python start)"""
import filecmp
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401  (registers the DeepSpeed stand-in classes torch.load needs)
import torch  # noqa: E402

errors = []


def err(msg):
    errors.append(msg)


def same_value(a, b):
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a, b.view(-1).view(torch.uint8) if b.numel() else b)
    if type(a).__name__ == "SubparamShape":
        return type(b).__name__ == "SubparamShape" and type(a).__module__ == type(b).__module__ and \
            list(a.patterns) == list(b.patterns) and tuple(a.shape) == tuple(b.shape) and \
            a.partition_dim == b.partition_dim
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a.keys()) == list(b.keys()) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) == type(b) and a == b


def main(out, gen):
    del errors[:]
    truth = os.path.join(gen, "truth")
    meta = json.load(open(os.path.join(truth, "meta.json")))
    names = [p["name"] for p in meta["params"]]
    zero = os.path.join(out, "zero")
    have = sorted(d for d in os.listdir(zero) if os.path.isdir(os.path.join(zero, d)))
    if sorted(names) != have:
        err(f"parameter folders differ: missing {sorted(set(names) - set(have))}, extra {sorted(set(have) - set(names))}")
    for name in names:
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            ours_path = os.path.join(zero, name, f"{state}.pt")
            if not os.path.exists(ours_path):
                err(f"{name}/{state}.pt missing")
                continue
            ours = torch.load(ours_path, weights_only=False)
            ref = torch.load(os.path.join(truth, "universal", "zero", name, f"{state}.pt"), weights_only=False)
            if torch.is_tensor(ref):  # ZeRO-3: bare flat tensors
                if not same_value(ref, ours):
                    err(f"{name}/{state}.pt differs from the flat reference")
                continue
            if not isinstance(ours, dict):
                err(f"{name}/{state}.pt is {type(ours).__name__}, not a dict")
                continue
            if list(ours.keys()) != list(ref.keys()):
                err(f"{name}/{state}.pt keys {list(ours.keys())} != {list(ref.keys())}")
            for k in ref:
                if k in ours and not same_value(ref[k], ours[k]):
                    detail = ""
                    if k == "param" and torch.is_tensor(ours[k]):
                        detail = f" (shape {tuple(ours[k].shape)} vs {tuple(ref[k].shape)}, dtype {ours[k].dtype})"
                        if ours[k].shape == ref[k].shape:
                            detail += f", max diff {(ours[k].double() - ref[k].double()).abs().max().item():.3g}"
                    err(f"{name}/{state}.pt[{k!r}] differs{detail}")
        step_ref = torch.load(os.path.join(truth, "universal", "zero", name, "step.pt"), weights_only=False)
        sp = os.path.join(zero, name, "step.pt")
        if not os.path.exists(sp):
            err(f"{name}/step.pt missing")
        elif not same_value(step_ref, torch.load(sp, weights_only=False)):
            err(f"{name}/step.pt differs: {torch.load(sp, weights_only=False)!r} vs {step_ref!r}")

    ck = os.path.join(gen, open(os.path.join(gen, "latest")).read().strip())
    src = sorted(glob.glob(os.path.join(ck, "*zero_pp_rank_0_mp_rank_00_optim_states.pt")))[0]
    osd = torch.load(src, weights_only=False)["optimizer_state_dict"]
    expect = {k: v for k, v in osd.items()
              if k not in ("base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups")}
    base = osd.get("base_optimizer_state", osd.get("optimizer_state_dict"))
    expect["param_groups"] = base["param_groups"] if isinstance(base, dict) else []
    got = torch.load(os.path.join(zero, "optimizer_state.pt"), weights_only=False)
    if list(got.keys()) != list(expect.keys()):
        err(f"optimizer_state.pt keys {list(got.keys())} != {list(expect.keys())}")
    else:
        for k in expect:
            a, b = expect[k], got[k]
            if hasattr(a, "__dict__") and not isinstance(a, (int, float)):
                ok = type(a).__module__ == type(b).__module__ and type(a).__name__ == type(b).__name__ and \
                    a.__dict__ == b.__dict__
            else:
                ok = same_value(a, b) or (type(a).__name__ == "ZeroStageEnum" and int(a) == int(b) and
                                          type(b).__name__ == "ZeroStageEnum")
            if not ok:
                err(f"optimizer_state.pt[{k!r}] differs: {b!r} vs {a!r}")
    model_files = glob.glob(os.path.join(ck, "mp_rank_*_model_states.pt")) or \
        glob.glob(os.path.join(ck, "zero_pp_rank_*_mp_rank_*_model_states.pt"))
    for f in sorted(model_files):
        o = os.path.join(out, os.path.basename(f))
        if not os.path.exists(o) or not filecmp.cmp(f, o, shallow=False):
            err(f"{os.path.basename(f)} not copied byte for byte")
    man = json.load(open(os.path.join(out, "manifest.json")))
    lu = os.path.join(os.path.dirname(os.path.abspath(out)), "latest_universal")
    tagged = os.path.exists(lu) and open(lu).read().strip() == os.path.basename(os.path.abspath(out))
    if any(p.get("expert") for p in man["params"]):
        # Native MoE: no tag unless asked (DeepSpeed's load_universal loads the wrong experts, issue 33).
        if tagged:
            err("latest_universal names a native-MoE universal folder")
    elif not tagged:
        err("latest_universal missing or wrong")
    if sorted(p["name"] for p in man["params"]) != sorted(names):
        err("manifest.json params differ from the truth")
    if errors:
        for e in errors[:30]:
            print("check_universal:", e)
        print(f"check_universal: {len(errors)} difference(s)")
        return 1
    print(f"check_universal: OK {len(names)} parameters identical")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit("usage: check_universal.py <universal_dir> <generated_dir> [...]")
    rc = 0
    for i in range(0, len(args), 2):
        if len(args) > 2:
            print(f"check_universal: {args[i]}")
        rc |= main(args[i], args[i + 1])
    sys.exit(rc)
