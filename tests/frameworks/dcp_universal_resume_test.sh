#!/usr/bin/env bash
# Every item of a training loop's DCP through the universal form, judged by torch's own code (issue 47;
# label `frameworks`, docs/frameworks.md). torch 2.15 (scripts/frameworks/setup.sh) trains the
# torchtitan-style loop of scripts/frameworks/dcp_train_loop.py on 2 gloo CPU ranks and saves it with
# dcp.save in two variants: torchtitan's keys in fp32 (model keys at the top level, the optimizer
# flattened under `optimizer`, flattened param_groups, `lr_scheduler`) and get_state_dict's keys with the
# whole model in bf16 (`model.*`, `optim.*` nested, `sched`); each with buffers of int64, bool and float, a dataloader
# position, a train_state step tensor and bytes. From another folder with relative paths: ucp-union,
# then ucp-load of the universal folder --format dcp --world-size 3 (the universal route, not the whole
# rewrite). Then:
#   * our output holds exactly the original's keys (no other), each tensor in the original's dtype
#     (bf16 kept, no --dtype) and equal bit for bit as torch's dcp.load reads it, each bytes item's
#     value equal as dcp.load's torch.load gives it;
#   * the loop resumed at 3 ranks from our output (torch's dcp.load of the request that saved the
#     checkpoint: strict, every key found) loads the same values (gathered whole, as digests) and runs
#     the next 3 steps with the same losses, learning rates, data positions and step counters, bit for
#     bit, as the loop resumed from the original by torch's own reshard-on-load.
# Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
py=$FRAMEWORKS_PY
loop=$root/scripts/frameworks/dcp_train_loop.py
variants=torchtitan-fp32,get_state_dict-bf16
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$py" "$loop" save --out saved --world 2 --variants "$variants" 2>save.log || { tail -20 save.log; exit 1; }
mkdir elsewhere uni ours
cd elsewhere
for v in ${variants//,/ }; do
  "$build/bin/ucp-union" --input "../saved/$v" --output "../uni/$v" --json >"../$v.union.json" 2>"../$v.union.err" ||
    { cat "../$v.union.err"; exit 1; }
  "$build/bin/ucp-load" -q --input "../uni/$v" --format dcp --world-size 3 --output "../ours/$v" --json >"../$v.load.json"
done
cd ..
"$py" - ${variants//,/ } <<'PY'
import io, json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader


def read_all(folder):
    """Every entry of a DCP folder as torch's dcp.load gives it in this one process: tensors read into
    empty ones of the stored dtype, bytes items torch.load'ed (default_planner.py load_bytes)."""
    md = FileSystemReader(folder).read_metadata()
    sd = {k: torch.empty(v.size, dtype=v.properties.dtype) if hasattr(v, "properties") else 0
          for k, v in md.state_dict_metadata.items()}
    dcp.load(sd, storage_reader=FileSystemReader(folder))
    return md, sd


def norm(v):
    if isinstance(v, io.BytesIO):
        return ("BytesIO", v.getvalue())
    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), list(v.shape), v.contiguous().reshape(-1).view(torch.uint8).tolist())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [norm(x) for x in v])
    if isinstance(v, dict):
        return ("dict", sorted((str(k), norm(x)) for k, x in v.items()))
    if isinstance(v, float):
        return ("float", v.hex())
    return (type(v).__name__, v)


total_tensors = total_bytes = 0
for v in sys.argv[1:]:
    union, load = json.load(open(f"{v}.union.json")), json.load(open(f"{v}.load.json"))
    assert union["not_carried"] == [] and union["items"] > 0, union
    assert "not carried" not in open(f"{v}.union.err").read()
    assert load.get("route") != "whole" and load["target"]["world"] == 3 and load["items"] == union["items"], load
    assert load["not_carried"] == [], load
    ranks = {n.split("_")[2] for n in os.listdir(os.path.join("ours", v)) if n.endswith(".distcp")}
    assert ranks == {"0", "1", "2"}, ranks
    md_a, a = read_all(os.path.join("saved", v))
    md_b, b = read_all(os.path.join("ours", v))
    assert a.keys() == b.keys(), (v, sorted(set(a) ^ set(b))[:10])
    tensors = [k for k, x in md_a.state_dict_metadata.items() if hasattr(x, "properties")]
    for k in tensors:
        da, db = md_a.state_dict_metadata[k].properties.dtype, md_b.state_dict_metadata[k].properties.dtype
        assert da == db, (v, k, da, db)
    bad = [k for k in a if norm(a[k]) != norm(b[k])]
    assert not bad, (v, bad[:10])
    bf16 = sum(1 for k in tensors if md_a.state_dict_metadata[k].properties.dtype == torch.bfloat16)
    assert ("bf16" in v) == (bf16 > 0), (v, bf16)
    total_tensors += len(tensors)
    total_bytes += len(a) - len(tensors)
    print(f"{v}: {len(a)} keys as saved, {len(tensors)} tensors ({bf16} bf16) bit-equal in their dtypes, "
          f"{len(a) - len(tensors)} bytes items equal ({union['items']} carried verbatim)")
print(f"entries: {total_tensors} tensors, {total_bytes} bytes items equal")
PY
# Both resumes in one run of 3 ranks (one process group, torch imported once per rank).
"$py" "$loop" resume --ckpt saved,ours --world 3 --variants "$variants" --record orig.json,ours.json 2>resume.log ||
  { tail -20 resume.log; exit 1; }
python3 "$root/scripts/frameworks/dcp_resume_compare.py" orig.json ours.json
echo "RESULT framework=torch version=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))') case=dcp_universal_resume tensors=$(python3 -c 'import json; print(sum(len(v["loaded"]) for v in json.load(open("orig.json")).values()))') equal=yes"
