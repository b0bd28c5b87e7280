"""The Python side of scripts/bench_torch_io.sh: torch.load a state dict and read every byte of every
tensor (same checksum as bench_torch_io). Usage: read_torch.py <file.pt> [--import-only]"""
import sys
import time

import torch

if "--import-only" in sys.argv:  # baseline RSS of the interpreter with torch imported
    sys.exit(0)
views = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
t0 = time.perf_counter()
sd = torch.load(sys.argv[1])
t1 = time.perf_counter()
total = nbytes = 0
for t in sd.values():
    total += int(t.view(views[t.element_size()]).sum(dtype=torch.int64))
    nbytes += t.numel() * t.element_size()
t2 = time.perf_counter()
print(f"tensors {len(sd)}\nbytes {nbytes}\nchecksum {total % 2**64}\nload_s {t1 - t0:.3f}\nread_s {t2 - t1:.3f}\n"
      f"total_s {t2 - t0:.3f}")
