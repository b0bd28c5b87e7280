#!/usr/bin/python3
"""Round trip check: two universal checkpoints (ucp-union output) hold the same atomic files, byte for
byte: every file of every parameter folder zero/<name>/ (fp32, exp_avg, exp_avg_sq, step.pt) by
SHA-256, the same file list. zero/optimizer_state.pt is not atomic: for a ZeRO-3 source it is DP rank
0's optimizer_state_dict of that source layout (its partition sizes, EP group name, as
ds_to_universal.py:761-767 saves it), so only its presence is checked.
Usage: same_atomic.py <universal_a> <universal_b>"""
import hashlib
import os
import sys


def files(root):
    out = {}
    base = os.path.join(root, "zero")
    if not os.path.isfile(os.path.join(base, "optimizer_state.pt")):
        out["MISSING optimizer_state.pt"] = ""
    for d, _, names in os.walk(base):
        if d == base:
            continue
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, base)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def main():
    a, b = files(sys.argv[1]), files(sys.argv[2])
    errors = []
    if set(a) != set(b):
        errors.append(f"file lists differ: only first {sorted(set(a) - set(b))[:5]}, only second {sorted(set(b) - set(a))[:5]}")
    for f in sorted(set(a) & set(b)):
        if a[f] != b[f]:
            errors.append(f"zero/{f} differs")
    experts = sum(1 for f in a if "experts.w" in f)
    if not a or experts == 0:
        errors.append("nothing compared (no zero/ files or no expert weights)")
    for e in errors[:20]:
        print("MISMATCH", e)
    if errors:
        sys.exit(1)
    print(f"ok: {len(a)} files identical ({experts} of expert weights)")


if __name__ == "__main__":
    main()
