#!/usr/bin/env bash
# Resume equivalence of ucp-load's DCP output, judged by torch's own code (issue 47; label
# `frameworks`, docs/frameworks.md). torch 2.15 (scripts/frameworks/setup.sh) trains a torchtitan-style
# loop on 4 gloo CPU ranks and saves it with dcp.save in five variants (scripts/frameworks/
# dcp_train_loop.py: torchtitan's and get_state_dict's key layouts, fp32 and bf16, FSDP2 and FSDP2 x TP;
# buffers of int64, bool and float, LR scheduler, dataloader position, train state). ucp-load rewrites
# each for 2 ranks (from another folder, relative paths). The loop is then resumed at 2 ranks twice,
# from the original (torch's reshard-on-load) and from our output: every value it loads (gathered
# whole, as digests) and the next 3 steps' losses, learning rates, data positions and step counters
# must be equal bit for bit, and the non-tensor items must have been loaded (positions continue).
# ucp-diff (issue 47) calls each original and our output equal, entry by entry, and the loop saved one
# step later different in its step counters, learning rate, buffers and data position (exit 3).
# Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
py=$FRAMEWORKS_PY
loop=$root/scripts/frameworks/dcp_train_loop.py
variants=torchtitan-fp32,get_state_dict-fp32,torchtitan-bf16,get_state_dict-bf16-tp2,torchtitan-fp32-tp2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# The loop one step later (for ucp-diff, below) is saved by the same run (one set of ranks fewer to start).
"$py" "$loop" save --out saved --later later --world 4 --variants "$variants" 2>save.log || { tail -20 save.log; exit 1; }
mkdir ours elsewhere
for v in ${variants//,/ }; do
  (cd elsewhere && "$build/bin/ucp-load" --input "../saved/$v" --format dcp --world-size 2 --output "../ours/$v" --json >"../$v.json")
  "$build/bin/ucp-diff" "saved/$v" "ours/$v" >diff.txt || { cat diff.txt; exit 1; }
  grep -q "^equal: all .* entries" diff.txt || { cat diff.txt; exit 1; }
  python3 - "$v.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["route"] == "whole" and j["target"]["world"] == 2 and j["bytes_entries"] > 0 and j["converted"] == [], j
PY
done
# Both resumes in one run of 2 ranks (one process group, torch imported once per rank).
"$py" "$loop" resume --ckpt saved,ours --world 2 --variants "$variants" --record orig.json,ours.json 2>resume.log ||
  { tail -20 resume.log; exit 1; }
python3 "$root/scripts/frameworks/dcp_resume_compare.py" orig.json ours.json
# One step later: ucp-diff must find what changed besides the weights.
rc=0
"$build/bin/ucp-diff" --json --max-listed 1000 saved/torchtitan-fp32 later/torchtitan-fp32 >later.json || rc=$?
[[ $rc == 3 ]] || { echo "ucp-diff of two steps: exit $rc, expected 3"; cat later.json; exit 1; }
python3 - later.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert not j["equal"] and j["non_tensor_items"] > 0 and j["skipped"] == [], j
listed = {d["param"] for d in j["listed"]}
want = {"train_state.step", "norm.num_batches_tracked", "lr_scheduler.last_epoch", "lr_scheduler._last_lr",
        "dataloader.position", "optimizer.state.emb.weight.step", "norm.running_mean"}
assert want <= listed, sorted(want - listed)
print("ucp-diff of the loop one step later: " + ", ".join(sorted(want)) + " reported")
PY
echo "dcp resume equivalence: ${variants//,/, }: equal"
echo "RESULT framework=torch version=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))') case=dcp_resume tensors=$(python3 -c 'import json; print(sum(len(v["loaded"]) for v in json.load(open("orig.json")).values()))') equal=yes"
