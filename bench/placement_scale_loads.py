#!/usr/bin/env python3
"""The loads of moe-replace's scale cases (issue 31): 64 layers x 256 experts, log-normal (W0), and
the same loads drifted by a log-normal factor per expert (W1, for re-placements). Deterministic.
Used by bench/bench_placement.sh and scripts/placement_same_plans.sh.
Usage: bench/placement_scale_loads.py W0.json W1.json"""
import json
import random
import sys

if len(sys.argv) != 3:
    sys.exit(__doc__)
random.seed(1)
w0 = [[int(random.lognormvariate(8, 1)) for _ in range(256)] for _ in range(64)]
with open(sys.argv[1], "w") as f:
    json.dump(w0, f)
random.seed(2)
with open(sys.argv[2], "w") as f:
    json.dump([[int(v * random.lognormvariate(0, 0.5)) for v in row] for row in w0], f)
