#!/usr/bin/python3
"""Compares a checkpoint folder written by ucp-load with one tests/generator/dsgen/autoep.py wrote for the same
target layout (it follows DeepSpeed v0.19.5's save code): the same files, and in each the same
structure loaded with Python torch: dict key order, types, values, tensors bit for bit (dtype, shape).
Usage: same_layout.py <written_step_dir> <generated_step_dir>"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401
import torch  # noqa: E402


def diff(a, b, path, out):
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and
                torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))):
            out.append(f"{path}: tensors differ ({getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')} vs "
                       f"{getattr(b, 'dtype', type(b))} {getattr(b, 'shape', '')})")
        return
    if type(a) is not type(b):
        out.append(f"{path}: {type(a).__name__} vs {type(b).__name__}")
        return
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            out.append(f"{path}: keys {list(a.keys())} vs {list(b.keys())}")
            return
        for k in a:
            diff(a[k], b[k], f"{path}[{k!r}]", out)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} vs {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out)
    elif hasattr(a, "__dict__") and not isinstance(a, (int, float, str)):
        diff(vars(a), vars(b), path + ".__dict__", out)
    elif a != b:
        out.append(f"{path}: {a!r} vs {b!r}")


def main():
    a_dir, b_dir = sys.argv[1], sys.argv[2]
    fa, fb = sorted(os.listdir(a_dir)), sorted(os.listdir(b_dir))
    out = []
    if fa != fb:
        out.append(f"files differ: only written {sorted(set(fa) - set(fb))}, only generated {sorted(set(fb) - set(fa))}")
    for f in sorted(set(fa) & set(fb)):
        diff(torch.load(os.path.join(a_dir, f), weights_only=False),
             torch.load(os.path.join(b_dir, f), weights_only=False), f, out)
    for line in out[:30]:
        print("DIFF", line)
    if out:
        sys.exit(1)
    print(f"ok: {len(fa)} files")


if __name__ == "__main__":
    main()
