#!/usr/bin/env python3
"""moe-replace --algorithm lazarus against node count (issue 16 item 11): wall seconds per run and the
ratio to the run with half the nodes (about 2 when the cost is linear in nodes, 4 when quadratic).
spread, whose cost is linear, is timed beside it for reference.

Usage: scripts/bench_lazarus_scaling.py BUILD_DIR [NODES ...]   (default 1000 2000 4000 8000)
Loads: 1 layer x 64 experts (seeded random, 1..1000 tokens), 8 GPUs x 2 slots per node, f = 1."""
import json
import os
import random
import subprocess
import sys
import tempfile
import time

build = sys.argv[1] if len(sys.argv) > 1 else "build"
nodes = [int(n) for n in sys.argv[2:]] or [1000, 2000, 4000, 8000]
tool = os.path.join(build, "bin", "moe-replace")
rng = random.Random(1)
with tempfile.TemporaryDirectory() as tmp:
    loads = os.path.join(tmp, "loads.json")
    with open(loads, "w") as f:
        json.dump([[rng.randint(1, 1000) for _ in range(64)]], f)
    print("%-8s %8s %10s %8s" % ("algo", "nodes", "seconds", "ratio"))
    for algo in ("lazarus", "spread"):
        prev = None
        for n in nodes:
            cmd = [tool, "-q", "--loads", loads, "--nodes", str(n), "--gpus-per-node", "8", "--slots-per-gpu", "2",
                   "--algorithm", algo, "--output", os.path.join(tmp, "plan.json")]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            dt = time.perf_counter() - t0
            print("%-8s %8d %10.3f %8s" % (algo, n, dt, "%.2f" % (dt / prev) if prev else "-"), flush=True)
            prev = dt
