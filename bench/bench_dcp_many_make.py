"""Writes the many-tensor DCP of bench/bench_dcp_many.sh with torch's own dcp.save: N parameters of K fp32
values each (--elements; 4 by default, the per-tensor cost alone; more, tensors whose bytes count too), with
AdamW-shaped state (exp_avg, exp_avg_sq, a scalar step per parameter) and param groups:
4 N tensors, the per-tensor cost of a large MoE state dict without its bytes (issue 47's 100,000 tensors).
torch.distributed.checkpoint.save with no process group writes one rank's files (torch 2.15.0
torch/distributed/checkpoint/state_dict_saver.py:184-185: no_dist when the default group is not initialised), as a
single-process job's checkpoint is written.
Usage: bench_dcp_many_make.py OUTPUT [--params N] [--elements K]"""
import argparse

import torch
import torch.distributed.checkpoint as dcp

ap = argparse.ArgumentParser()
ap.add_argument("output")
ap.add_argument("--params", type=int, default=25000)
ap.add_argument("--elements", type=int, default=4)
a = ap.parse_args()
model = {f"layers.{i // 8}.block.{i % 8}.weight": torch.arange(a.elements, dtype=torch.float32) + i for i in range(a.params)}
optim = {"state": {k: {"exp_avg": v * 0.5, "exp_avg_sq": v * 0.25, "step": torch.tensor(3.0)} for k, v in model.items()},
         "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": list(model)}]}
dcp.save({"model": model, "optim": optim}, checkpoint_id=a.output)
