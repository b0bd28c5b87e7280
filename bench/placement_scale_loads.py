#!/usr/bin/env python3
"""The loads of moe-replace's scale cases: 64 layers x 256 experts, in one of two shapes, and the same
loads drifted by a log-normal factor per expert (W1, for re-placements). Deterministic (fixed seeds).
  lognormal (default): log-normal(8, 1) per expert;
  heavy: Pareto with shape 1.1 (scale 1,000) per expert, a heavy tail: a few dominant experts per
    layer (the largest carries 15% of its layer's load in the median layer, 87% in the most skewed).
Used by bench/bench_placement.sh and scripts/checks/placement_same_plans.sh.
Usage: bench/placement_scale_loads.py [--shape lognormal|heavy] W0.json W1.json"""
import json
import random
import sys

args = sys.argv[1:]
shape = "lognormal"
if len(args) >= 2 and args[0] == "--shape":
    shape, args = args[1], args[2:]
if len(args) != 2 or shape not in ("lognormal", "heavy"):
    sys.exit(__doc__)
if shape == "lognormal":
    random.seed(1)
    w0 = [[int(random.lognormvariate(8, 1)) for _ in range(256)] for _ in range(64)]
    random.seed(2)
else:
    random.seed(3)
    w0 = [[int(1000 * random.paretovariate(1.1)) for _ in range(256)] for _ in range(64)]
    random.seed(4)
w1 = [[int(v * random.lognormvariate(0, 0.5)) for v in row] for row in w0]
with open(args[0], "w") as f:
    json.dump(w0, f)
with open(args[1], "w") as f:
    json.dump(w1, f)
