#!/usr/bin/env bash
# A DCP of 25,000 tensors (6,250 parameters with Adam state), written by torch 2.15's own dcp.save
# (label `frameworks`, docs/frameworks.md; issue 47: a `.metadata` of 20,000 or more tensors was
# refused as "a memory bomb"). ucp-info must check it, ucp-load must rewrite it for 2 ranks, and
# torch's own dcp.load must read every value of our output equal to the original's; the peak RSS of
# both tools is printed. Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
py=$FRAMEWORKS_PY
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# One python: torch's save, the two tools, torch's load of our output into the structure that was saved,
# compared with the values still in memory (torch imported once; the original is not read back).
"$py" - "$build/bin" <<'PY'
import subprocess, sys
import torch, torch.distributed.checkpoint as dcp
bin_dir = sys.argv[1]
n = 6250
model = {f"layers.{i // 8}.block.{i % 8}.weight": torch.arange(4, dtype=torch.float32) + i for i in range(n)}
optim = {"state": {k: {"exp_avg": v * 0.5, "exp_avg_sq": v * 0.25, "step": torch.tensor(3.0)} for k, v in model.items()},
         "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": list(model)}]}
saved = {"model": model, "optim": optim}
dcp.save(saved, checkpoint_id="big")

def tool(label, *args):
    r = subprocess.run(["/usr/bin/time", "-f", label + ": %e s, peak RSS %M KiB", *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{args[0]} exit {r.returncode}: {r.stdout}{r.stderr}")
    print(r.stderr.strip().splitlines()[-1])
    return r.stdout

info = tool("ucp-info", f"{bin_dir}/ucp-info", "big")
assert "metadata: ok" in info, info
tool("ucp-load --world-size 2", f"{bin_dir}/ucp-load", "-q", "--input", "big", "--format", "dcp", "--world-size", "2",
     "--output", "ours")

def blank(v):  # what dcp.load fills: tensors of the saved shape and dtype, every other leaf from the file
    if isinstance(v, torch.Tensor):
        return torch.full_like(v, float("nan")) if v.is_floating_point() else torch.zeros_like(v)
    if isinstance(v, dict):
        return {k: blank(x) for k, x in v.items()}
    if isinstance(v, list) and any(isinstance(x, dict) for x in v):  # saved element by element (param_groups)
        return [blank(x) for x in v]
    return None

loaded = blank(saved)
dcp.load(loaded, checkpoint_id="ours")
count = {"tensors": 0, "items": 0}
def same(a, b, path):
    if isinstance(a, torch.Tensor):
        count["tensors"] += 1
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and any(isinstance(x, dict) for x in a):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}.{i}")
    else:
        count["items"] += 1
        assert a == b, (path, a, b)
same(saved, loaded, "")
print(f"torch dcp.load of our output: {count['tensors']} tensors and {count['items']} items equal to what was saved")
print(f"RESULT framework=torch version={torch.__version__.split('+')[0]} case=dcp_large_metadata "
      f"tensors={count['tensors']} equal=yes")
PY
