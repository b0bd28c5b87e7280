#!/usr/bin/env bash
# A Megatron-Core core_v0.16.1 torch_dist save converted by ucpkit opens in Megatron-Core 0.16.1
# (label `frameworks`, docs/frameworks.md; issue 47: the writer always emitted the 0.19 common_state
# item, and 0.16.1 failed with FileNotFoundError ... common.pt). The committed core_v0.16.1 fixture
# (tests/formats/megatron_core/data/llama_gqa_tp2_dp2_v016, TP 2 x DP 2) goes through ucp-union and
# ucp-load --format torch_dist --tp 1; Megatron-Core 0.16.1's own dist_checkpointing
# .load_common_state_dict reads the output's common state (args rewritten for TP 1, the iteration and
# optimizer param groups as the source's), and torch 2.15's DCP loader reads every tensor the source
# and the output both hold equal (global tensors: TP 2 and TP 1 hold the same values).
# Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
py=$FRAMEWORKS_PY
src=$root/tests/formats/megatron_core/data/llama_gqa_tp2_dp2_v016/fully_reshardable
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$build/bin/ucp-union" -q --input "$src" --output u
"$build/bin/ucp-load" -q --input u --format torch_dist --tp 1 --output out
iter=$(cat out/latest_checkpointed_iteration.txt)
iter_dir=$(printf 'out/iter_%07d' "$iter")
[[ -f $iter_dir/common.pt ]] || { echo "no common.pt in $iter_dir: $(ls -A "$iter_dir")"; exit 1; }
PYTHONWARNINGS=ignore "$py" - "$src" "$iter_dir" <<'PY' 2>&1 | grep -v "^W1\|warn"
import sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed.checkpoint as dcp
from megatron.core import dist_checkpointing
src, ours = sys.argv[1], sys.argv[2]
a, b = dist_checkpointing.load_common_state_dict(src), dist_checkpointing.load_common_state_dict(ours)
assert b["args"].tensor_model_parallel_size == 1 and a["args"].tensor_model_parallel_size == 2, (a["args"], b["args"])
assert b["iteration"] == a["iteration"] and b["checkpoint_version"] == a["checkpoint_version"], (a["iteration"], b["iteration"])
assert sorted(b) == sorted(a), (sorted(a), sorted(b))
def tensors(path):
    md = dcp.FileSystemReader(path).read_metadata()
    sd = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items() if hasattr(v, "properties")}
    dcp.load(sd, checkpoint_id=path)
    return sd
ta, tb = tensors(src), tensors(ours)
common = sorted(set(ta) & set(tb))
model = [k for k in common if not k.startswith("optimizer.")]
assert model, (sorted(ta)[:5], sorted(tb)[:5])
bad = [k for k in common if not torch.equal(ta[k], tb[k])]
assert not bad, bad[:5]
print(f"Megatron-Core 0.16.1 load_common_state_dict: args TP 2 -> 1, iteration {b['iteration']}; "
      f"{len(common)} tensors ({len(model)} model) equal to the source's")
PY
echo "RESULT framework=megatron-core version=$("$py" -c 'import importlib.metadata as m; print(m.version("megatron-core"))') case=megatron_core_v016 tensors=$("$py" - "$src" "$iter_dir" 2>/dev/null <<'PY'
import sys
from torch.distributed.checkpoint import FileSystemReader as R
a, b = ({k for k, v in R(p).read_metadata().state_dict_metadata.items() if hasattr(v, "properties")} for p in sys.argv[1:3])
print(len(a & b))
PY
) equal=yes"
