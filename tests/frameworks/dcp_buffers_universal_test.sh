#!/usr/bin/env bash
# Buffers through the universal form, judged by torch's own readers (issue 47; label `frameworks`,
# docs/frameworks.md). torch 2.15 (scripts/frameworks/setup.sh) saves the torchtitan-style loop of
# scripts/frameworks/dcp_train_loop.py on 2 gloo CPU ranks with dcp.save (torchtitan's and
# get_state_dict's key layouts, fp32): parameters with AdamW state beside buffers without any (BatchNorm's
# running_mean/var, int64 num_batches_tracked and position_ids, a bool mask, a float scale) and an int32
# train_state.step tensor. Until issue 47's buffers, ucp-union refused such a save ("7 model tensors have
# no optimizer state"). Here, from another folder with relative paths:
#   * ucp-union writes the universal folder (exit 0; ucp-info lists the 7 buffers with their dtypes);
#   * ucp-load of that folder --format dcp --world-size 3 (the universal route, not the whole rewrite):
#     torch's dcp.load (FileSystemReader, one process) reads every tensor the original holds, parameters,
#     AdamW states, steps and buffers, equal to the original's bit for bit and in its dtype, under the
#     keys it was saved with (torchtitan's or get_state_dict's; issue 47), and no other tensor;
#   * ucp-load --format safetensors of the universal folder and of the DCP itself (direct mode): torch's
#     safetensors load_file reads every model tensor (parameters and buffers) equal bit for bit; direct
#     mode says on stderr, and lists in --json, the non-tensor items it cannot carry;
#   * ucp-load --format torch_dist refuses the buffers by name (exit 1, nothing written);
#   * ucp-diff of the universal folder and the union of our DCP output: equal (buffers compared).
# Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
variants=torchtitan-fp32,get_state_dict-fp32
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$FRAMEWORKS_PY" "$root/scripts/frameworks/dcp_train_loop.py" save --out saved --world 2 --variants "$variants" 2>save.log ||
  { tail -20 save.log; exit 1; }
mkdir elsewhere uni dcp3 st direct back
cd elsewhere
for v in ${variants//,/ }; do
  "$build/bin/ucp-union" -q --input "../saved/$v" --output "../uni/$v" --json >"../$v.union.json" 2>"../$v.union.err"
  "$build/bin/ucp-info" --json "../uni/$v" >"../$v.info.json"
  "$build/bin/ucp-load" -q --input "../uni/$v" --format dcp --world-size 3 --output "../dcp3/$v" --json >"../$v.dcp.json"
  "$build/bin/ucp-load" -q --input "../uni/$v" --format safetensors --output "../st/$v" --json >"../$v.st.json"
  "$build/bin/ucp-load" --input "../saved/$v" --format safetensors --output "../direct/$v" --json \
    >"../$v.direct.json" 2>"../$v.direct.err"
  rc=0
  "$build/bin/ucp-load" -q --input "../uni/$v" --format torch_dist --output "../td_$v" 2>"../$v.td.err" || rc=$?
  [[ $rc == 1 && ! -e ../td_$v ]] || { echo "$v: torch_dist: exit $rc"; cat "../$v.td.err"; exit 1; }
  grep -q "7 buffers ('mask', " "../$v.td.err" || { cat "../$v.td.err"; exit 1; }
  [[ $(wc -l <"../$v.td.err") == 1 ]] || { cat "../$v.td.err"; exit 1; }
  "$build/bin/ucp-union" -q --input "../dcp3/$v" --output "../back/$v"
  "$build/bin/ucp-diff" "../uni/$v" "../back/$v" >"../$v.diff.txt" || { cat "../$v.diff.txt"; exit 1; }
done
cd ..
"$FRAMEWORKS_PY" - ${variants//,/ } <<'PY'
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from safetensors.torch import load_file


def read_all(folder):
    """Every tensor entry of a DCP folder, read whole by torch's dcp.load in this one process."""
    md = FileSystemReader(folder).read_metadata()
    sd = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
          if hasattr(v, "properties")}
    dcp.load(sd, storage_reader=FileSystemReader(folder))
    return sd


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                        b.reshape(-1).view(torch.uint8))


def model_key(key):
    """The model tensor's name of an original key (torchtitan's top level, or under get_state_dict's model)."""
    return key[len("model."):] if key.startswith("model.") else key


BUFFERS = {"mask": torch.bool, "scale": torch.float32, "position_ids": torch.int64, "norm.running_mean": torch.float32,
           "norm.running_var": torch.float32, "norm.num_batches_tracked": torch.int64, "train_state.step": torch.int32}
total = 0
for v in sys.argv[1:]:
    orig = read_all(os.path.join("saved", v))
    union = json.load(open(f"{v}.union.json"))
    assert union["buffers"] == 7 and union["items"] > 0 and not union["not_carried"], union  # issue 47: all carried
    assert "not carried" not in open(f"{v}.union.err").read()
    info = json.load(open(f"{v}.info.json"))
    got = {b["name"]: b["dtype"] for b in info["buffers"]}
    assert got == {k: str(d).replace("torch.", "") for k, d in BUFFERS.items()}, got
    assert all(c["status"] == "ok" for c in info["checks"] if c["status"] != "skipped"), info["checks"]
    j = json.load(open(f"{v}.dcp.json"))
    assert j.get("route") != "whole" and j["buffers"] == 7 and j["target"]["world"] == 3, j
    ours = read_all(os.path.join("dcp3", v))
    ranks = {n.split("_")[2] for n in os.listdir(os.path.join("dcp3", v)) if n.endswith(".distcp")}
    assert ranks == {"0", "1", "2"}, ranks
    want = {k: k for k in orig}  # the keys as saved (issue 47)
    missing = sorted(k for k in want if k not in ours)
    bad = sorted(k for k in want if k in ours and not same(ours[k], orig[want[k]]))
    extra = sorted(set(ours) - set(want))
    assert not missing and not bad and not extra, (v, missing, bad, extra)
    names = {model_key(k): k for k in orig if not k.startswith(("optim.", "optimizer."))}
    for name, dtype in BUFFERS.items():
        assert ours[names[name]].dtype == dtype, (name, ours[names[name]].dtype)
    model = {"model." + n: orig[k] for n, k in names.items()}
    for folder in ("st", "direct"):
        st = {}
        for f in sorted(os.listdir(os.path.join(folder, v))):
            if f.endswith(".safetensors"):
                st.update(load_file(os.path.join(folder, v, f)))
        bad = sorted(k for k in model if k[len("model."):] not in st or not same(st[k[len("model."):]], model[k]))
        extra = sorted(set(st) - {k[len("model."):] for k in model})
        assert not bad and not extra, (v, folder, bad, extra)
    direct = json.load(open(f"{v}.direct.json"))
    err = open(f"{v}.direct.err").read()
    assert direct["buffers"] == 7 and direct["not_carried"], direct
    assert "are not carried" in err and direct["not_carried"][0] in err, err
    diff = open(f"{v}.diff.txt").read()
    assert diff.startswith("equal"), diff
    total += len(want)
    print(f"{v}: {len(want)} tensors ({len(BUFFERS)} buffers) equal through the universal form at world size 3; "
          f"{len(model)} model tensors equal in safetensors (universal and direct); "
          f"{len(direct['not_carried'])} non-tensor items listed as not carried; torch_dist refused by name")
print(f"RESULT framework=torch version={torch.__version__} case=dcp_buffers_universal tensors={total} equal=yes")
PY
