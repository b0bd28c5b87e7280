"""The Python side of bench/bench_torch_io.sh: torch.load a state dict and read every byte of every
tensor (same checksum as bench_torch_io). Usage: read_torch.py <file.pt> [--import-only]"""
import sys
import time

import torch

if "--import-only" in sys.argv:  # baseline RSS of the interpreter with torch imported
    sys.exit(0)
t0 = time.perf_counter()
sd = torch.load(sys.argv[1])
t1 = time.perf_counter()
total = nbytes = 0
for t in sd.values():
    b = t.reshape(-1).view(torch.uint8)  # the tensor's bytes as 64-bit words (tail zero-padded)
    if b.numel() % 8:
        b = torch.cat([b, torch.zeros(8 - b.numel() % 8, dtype=torch.uint8)])
    total += int(b.view(torch.int64).sum())
    nbytes += t.numel() * t.element_size()
t2 = time.perf_counter()
print(f"tensors {len(sd)}\nbytes {nbytes}\nchecksum {total % 2**64}\nload_s {t1 - t0:.3f}\nread_s {t2 - t1:.3f}\n"
      f"total_s {t2 - t0:.3f}")
