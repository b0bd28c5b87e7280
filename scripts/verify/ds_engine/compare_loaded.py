#!/usr/bin/python3
"""Compares the weights DeepSpeed's engine held after load_checkpoint (train_moe_tutorial.py --resume:
OUT/loaded/weights_rank<R>.pt, experts under global names) with those the source run held when it saved
(SOURCE/truth/weights_rank<R>.pt): every name of either must be in the other, bit for bit.
Usage: compare_loaded.py OUT SOURCE   (exit 0 = equal)"""
import glob
import sys

import torch


def merged(folder):
    out = {}
    for f in sorted(glob.glob(folder + "/weights_rank*.pt")):
        for k, v in torch.load(f).items():
            if k in out and not torch.equal(out[k], v):
                sys.exit(f"{f}: {k} differs between ranks")
            out[k] = v
    return out


loaded, truth = merged(sys.argv[1] + "/loaded"), merged(sys.argv[2] + "/truth")
bad = sorted(set(loaded) ^ set(truth)) + [k for k in truth if k in loaded and not torch.equal(loaded[k], truth[k])]
print(f"compare_loaded: {len(truth)} weights, {len(bad)} differ{': ' + ', '.join(bad[:8]) if bad else ''}")
sys.exit(1 if bad else 0)
