#!/usr/bin/env python3
"""moe-replace --algorithm lazarus against node count (issue 16 item 11): wall and user CPU seconds per
run and the ratio (of CPU seconds) to the run with half the nodes (about 2 when the cost is linear in
nodes, 4 when quadratic). spread, whose cost is linear, is timed beside it for reference. User CPU is
printed because the development machine is shared: wall seconds there follow the load of others.

Usage: bench/bench_lazarus_scaling.py BUILD_DIR [NODES ...]   (default 1000 2000 4000 8000)
       bench/bench_lazarus_scaling.py --old OLD_TOOL BUILD_DIR [NODES ...]
         also times OLD_TOOL (a moe-replace binary or wrapper script of an older build) on the same
         loads, in the same run, and checks that both write byte-identical plans
       bench/bench_lazarus_scaling.py --compare OLD_TOOL BUILD_DIR
         plans of OLD_TOOL and BUILD_DIR's moe-replace byte-compared on a range of inputs: lazarus and
         balanced-ft (both use the MRO placement, lib/placement/mro.cpp), 2-2,000 nodes, f = 1..3,
         1-4 layers, uniform / skewed / equal / near-tied loads; exit 1 on any difference
Loads (timing): 1 layer x 64 experts (seeded random, 1..1000 tokens), 8 GPUs x 2 slots per node, f = 1."""
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

args = sys.argv[1:]
old_tool = compare = None
if args[:1] == ["--old"]:
    old_tool, args = args[1], args[2:]
elif args[:1] == ["--compare"]:
    old_tool, compare, args = args[1], True, args[2:]
build = args[0] if args else "build"
nodes = [int(n) for n in args[1:]] or [1000, 2000, 4000, 8000]
tool = os.path.join(build, "bin", "moe-replace")


def run(exe, cmd):
    """Runs exe with cmd; wall and user CPU seconds of the child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    t0 = time.perf_counter()
    subprocess.run([exe] + cmd, check=True)
    wall = time.perf_counter() - t0
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before


def same_file(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def compare_plans(tmp):
    """Byte-compares OLD_TOOL's and tool's plans on a range of configurations."""
    rng = random.Random(2027)
    cases = []
    for n in (2, 3, 4, 5, 6, 7, 8, 10, 12, 13, 16, 17, 24, 31, 50, 64, 100, 257, 1000, 2000):
        for gpn, spg in ((1, 2), (2, 2), (4, 2), (8, 2), (2, 3), (1, 5)):
            for f in (1, 2, 3):
                if f > n:
                    continue
                slots = n * gpn * spg
                experts = rng.choice([e for e in (4, 6, 8, 16, 32, 64) if e * f <= slots] or [0])
                if not experts:
                    continue
                kind = rng.choice(("uniform", "skewed", "equal", "thirds"))
                layers = rng.choice((1, 1, 2, 4)) if n <= 257 else 1
                cases.append((n, gpn, spg, f, experts, kind, layers))
    def loads_for(kind, experts, layers):
        out = []
        for _ in range(layers):
            if kind == "uniform":
                out.append([rng.randint(1, 1000) for _ in range(experts)])
            elif kind == "skewed":  # Zipf-like: a few hot experts
                out.append([max(1, int(5000 / (1 + rng.randrange(experts)) ** 1.2)) for _ in range(experts)])
            elif kind == "equal":  # every node load ties exactly
                out.append([600] * experts)
            else:  # replica loads like 1000/3, 1000/7: node sums that differ only by rounding
                out.append([rng.choice((1000, 2000, 700, 300, 1100)) for _ in range(experts)])
        return out
    bad = 0
    for i, (n, gpn, spg, f, experts, kind, layers) in enumerate(cases):
        loads = os.path.join(tmp, "loads.json")
        with open(loads, "w") as fh:
            json.dump(loads_for(kind, experts, layers), fh)
        for algo in ("lazarus", "balanced-ft"):
            cmd = ["-q", "--loads", loads, "--nodes", str(n), "--gpus-per-node", str(gpn), "--slots-per-gpu", str(spg),
                   "--fault-tolerance", str(f), "--algorithm", algo, "--mc-samples", "2000"]
            a, b = os.path.join(tmp, "old.json"), os.path.join(tmp, "new.json")
            subprocess.run([old_tool] + cmd + ["--output", a], check=True)
            subprocess.run([tool] + cmd + ["--output", b], check=True)
            if not same_file(a, b):
                bad += 1
                print("DIFFERENT:", algo, "nodes", n, "gpus", gpn, "slots", spg, "f", f, "experts", experts, kind,
                      "layers", layers, flush=True)
    print("%d configurations x 2 algorithms: %d different" % (len(cases), bad))
    return bad == 0


with tempfile.TemporaryDirectory() as tmp:
    if compare:
        sys.exit(0 if compare_plans(tmp) else 1)
    rng = random.Random(1)
    loads = os.path.join(tmp, "loads.json")
    with open(loads, "w") as f:
        json.dump([[rng.randint(1, 1000) for _ in range(64)]], f)
    print("%-14s %8s %8s %8s %8s" % ("algo", "nodes", "wall", "cpu", "ratio"))
    runs = [("lazarus", tool, "lazarus")]
    if old_tool:
        runs.insert(0, ("lazarus", old_tool, "lazarus (old)"))
    runs.append(("spread", tool, "spread"))
    for algo, exe, label in runs:
        prev = None
        for n in nodes:
            out = os.path.join(tmp, "plan-%s-%d.json" % ("old" if exe == old_tool else "new", n))
            cmd = ["-q", "--loads", loads, "--nodes", str(n), "--gpus-per-node", "8", "--slots-per-gpu", "2",
                   "--algorithm", algo, "--output", out if algo == "lazarus" else os.path.join(tmp, "spread.json")]
            wall, cpu = run(exe, cmd)
            same = ""
            if old_tool and exe == tool and algo == "lazarus":
                old_out = os.path.join(tmp, "plan-old-%d.json" % n)
                if os.path.exists(old_out):
                    same = "  plan identical to old" if same_file(old_out, out) else "  PLAN DIFFERS FROM OLD"
            print("%-14s %8d %8.3f %8.3f %8s%s" % (label, n, wall, cpu, "%.2f" % (cpu / prev) if prev else "-", same),
                  flush=True)
            prev = cpu
