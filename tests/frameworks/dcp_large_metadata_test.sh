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
"$py" - <<'PY'
import torch, torch.distributed.checkpoint as dcp
n = 6250
model = {f"layers.{i // 8}.block.{i % 8}.weight": torch.arange(4, dtype=torch.float32) + i for i in range(n)}
optim = {"state": {k: {"exp_avg": v * 0.5, "exp_avg_sq": v * 0.25, "step": torch.tensor(3.0)} for k, v in model.items()},
         "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": list(model)}]}
dcp.save({"model": model, "optim": optim}, checkpoint_id="big")
PY
/usr/bin/time -f "ucp-info: %e s, peak RSS %M KiB" "$build/bin/ucp-info" big >info.txt 2>time.txt || { cat info.txt time.txt; exit 1; }
grep -q "metadata: ok" info.txt || { cat info.txt; exit 1; }
cat time.txt
/usr/bin/time -f "ucp-load --world-size 2: %e s, peak RSS %M KiB" "$build/bin/ucp-load" -q --input big --format dcp --world-size 2 --output ours
"$py" - <<'PY'
import torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
def everything(path):
    md = FileSystemReader(path).read_metadata()
    sd = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
          if hasattr(v, "properties")}
    sd.update({k: None for k, v in md.state_dict_metadata.items() if not hasattr(v, "properties")})
    dcp.load(sd, checkpoint_id=path)
    return sd
a, b = everything("big"), everything("ours")
assert a.keys() == b.keys(), (len(a), len(b))
bad = [k for k in a if (not torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] != b[k])]
assert not bad, bad[:5]
print(f"torch dcp.load of our output: {len(a)} entries equal to the original's")
PY
echo "RESULT framework=torch version=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))') case=dcp_large_metadata tensors=$("$py" -c 'from torch.distributed.checkpoint import FileSystemReader as R; print(sum(hasattr(v, "properties") for v in R("ours").read_metadata().state_dict_metadata.values()))') equal=yes"
