"""Checks that two universal checkpoints hold the same atomic tensors: every zero/<param>/<state>.pt
of the first must be byte-identical in the second, except where either is DeepSpeed's ZeRO-3 TP = 1
form (a bare flat fp32 tensor, vocabulary padding kept): then the universal tensor (for a vocabulary
parameter the first original_vocab_size rows, from the manifest's patterns) must be equal bit for
bit. Padding rows of the second (made by ucp-load) must be zero; those of the first (the source's
own padding rows, which a universal checkpoint drops) may hold anything.

Usage: /usr/bin/python3 same_universal.py <u1> <u2>   (exit 0 = same)"""
import filecmp
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401  (registers the DeepSpeed stand-in classes)
import torch  # noqa: E402


def logical_numels(universal):
    """{parameter name: elements of its universal tensor without vocabulary padding}, from the manifest."""
    with open(os.path.join(universal, "manifest.json")) as f:
        m = json.load(f)
    pats = m["patterns"]["set"]
    vocab = pats.get("original_vocab_size")
    out = {}
    for entry in m["params"]:
        name, shape = entry["name"], list(entry["shape"])
        if vocab and any(re.fullmatch(p, name) for p in pats.get("vocabulary_parameter_patterns", [])):
            shape[0] = min(shape[0], vocab)
        out[name] = math.prod(shape)
    return out


def flat_values(x):
    return (x["param"] if isinstance(x, dict) else x).reshape(-1)


def main():
    a, b = sys.argv[1], sys.argv[2]
    errors, same_bytes, same_values = [], 0, 0
    numels = logical_numels(a)
    for root, _, files in os.walk(os.path.join(a, "zero")):
        for f in sorted(files):
            if f == "optimizer_state.pt":
                continue
            rel = os.path.relpath(os.path.join(root, f), a)
            pb = os.path.join(b, rel)
            if not os.path.exists(pb):
                errors.append(f"{rel}: missing in {b}")
                continue
            if filecmp.cmp(os.path.join(a, rel), pb, shallow=False):
                same_bytes += 1
                continue
            x, y = torch.load(os.path.join(a, rel), weights_only=False), torch.load(pb, weights_only=False)
            if f == "step.pt" or (isinstance(x, dict) and isinstance(y, dict)):
                errors.append(f"{rel}: differs")
                continue
            n = numels[os.path.basename(os.path.dirname(rel))]
            p, q = flat_values(x), flat_values(y)
            if p.numel() < n or q.numel() < n or not torch.equal(p[:n].view(torch.int32), q[:n].view(torch.int32)):
                errors.append(f"{rel}: flat tensor differs from the atomic tensor")
                continue
            if torch.count_nonzero(q[n:]):
                errors.append(f"{rel}: padding rows written by ucp-load are not zero")
                continue
            same_values += 1
    if errors or same_bytes + same_values == 0:
        print("\n".join(errors[:50]) or "no atomic files")
        sys.exit(1)
    print(f"same_universal: {same_bytes} files byte-identical, {same_values} equal as ZeRO-3 flat tensors")


if __name__ == "__main__":
    main()
