#!/usr/bin/python3
"""Compares a checkpoint folder written by a tool (ucp-load) with the one the generator writes for the
same layout from the same seed, file by file, through Python's torch.load (independent of ucpkit's
reader): every file of the reference's step folder must exist in ours with the same structure, key
order, and tensors bit for bit (dtype, shape, bytes); scalars equal. Keys named with --skip
(paths FILE/KEY/..., '*' for any one key) are not compared. Exit 0 when equal, 1 listing the differences.
Usage: compare_checkpoints.py OURS_DIR REF_DIR [--skip PATH]..."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsgen  # noqa: E402,F401  (registers the DeepSpeed stand-in classes torch.load needs)
import torch  # noqa: E402

ERRORS = []


def skipped(path, skips):
    parts = path.split("/")
    for s in skips:
        sp = s.split("/")
        if len(sp) <= len(parts) and all(a == "*" or a == b for a, b in zip(sp, parts)):
            return True
    return False


def compare(a, b, path, skips):
    if skipped(path, skips):
        return
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape):
            ERRORS.append(f"{path}: tensor {getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')} vs "
                          f"{getattr(b, 'dtype', type(b))} {getattr(b, 'shape', '')}")
        elif a.numel() and not torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)):
            ERRORS.append(f"{path}: tensor values differ")
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a.keys()) != list(b.keys()):
            ERRORS.append(f"{path}: keys {list(a.keys())} vs {list(b.keys())}")
        for k in a:
            if k in b:
                compare(a[k], b[k], f"{path}/{k}", skips)
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            ERRORS.append(f"{path}: length {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{path}/{i}", skips)
        return
    if hasattr(a, "__dict__") and hasattr(b, "__dict__") and type(a).__name__ == type(b).__name__:
        compare(vars(a), vars(b), path, skips)
        return
    if type(a).__module__ == "numpy" or type(b).__module__ == "numpy":  # RNG states
        import numpy
        if not (type(a) is type(b) and numpy.array_equal(a, b)):
            ERRORS.append(f"{path}: numpy values differ")
        return
    if a != b:
        ERRORS.append(f"{path}: {a!r} vs {b!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("ref")
    ap.add_argument("--skip", action="append", default=[])
    a = ap.parse_args()
    tag = open(os.path.join(a.ref, "latest")).read().strip()
    if open(os.path.join(a.ours, "latest")).read().strip() != tag:
        ERRORS.append("latest differs")
    rd, od = os.path.join(a.ref, tag), os.path.join(a.ours, tag)
    files = sorted(os.listdir(rd))
    if sorted(os.listdir(od)) != files:
        ERRORS.append(f"files: {sorted(os.listdir(od))} vs {files}")
    for fn in files:
        if os.path.exists(os.path.join(od, fn)):
            compare(torch.load(os.path.join(od, fn), map_location="cpu"), torch.load(os.path.join(rd, fn), map_location="cpu"),
                    fn, a.skip)
    for e in ERRORS[:40]:
        print(e)
    print(f"compare_checkpoints: {len(files)} files, {len(ERRORS)} differences")
    sys.exit(1 if ERRORS else 0)


if __name__ == "__main__":
    main()
