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
# Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
env_dir=$("$root/scripts/frameworks/setup.sh") || { echo "SKIP: no framework environment (scripts/frameworks/setup.sh failed)"; exit 77; }
py=$env_dir/bin/python
loop=$root/scripts/frameworks/dcp_train_loop.py
variants=torchtitan-fp32,get_state_dict-fp32,torchtitan-bf16,get_state_dict-bf16-tp2,torchtitan-fp32-tp2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$py" "$loop" save --out saved --world 4 --variants "$variants" 2>save.log || { tail -20 save.log; exit 1; }
mkdir ours elsewhere
for v in ${variants//,/ }; do
  (cd elsewhere && "$build/bin/ucp-load" --input "../saved/$v" --format dcp --world-size 2 --output "../ours/$v" --json >"../$v.json")
  python3 - "$v.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["route"] == "whole" and j["target"]["world"] == 2 and j["bytes_entries"] > 0 and j["converted"] == [], j
PY
done
"$py" "$loop" resume --ckpt saved --world 2 --variants "$variants" --record orig.json 2>orig.log || { tail -20 orig.log; exit 1; }
"$py" "$loop" resume --ckpt ours --world 2 --variants "$variants" --record ours.json 2>ours.log || { tail -20 ours.log; exit 1; }
python3 - orig.json ours.json <<'PY'
import json, sys
orig, ours = (json.load(open(p)) for p in sys.argv[1:3])
assert orig.keys() == ours.keys(), (orig.keys(), ours.keys())
for v in orig:
    a, b = orig[v], ours[v]
    diff = [k for k in a["loaded"] if a["loaded"][k] != b["loaded"].get(k)] + sorted(set(b["loaded"]) - set(a["loaded"]))
    assert not diff, f"{v}: loaded values differ: {diff[:5]}"
    assert a["steps"] == b["steps"], f"{v}: the resumed steps differ:\n{a['steps']}\n{b['steps']}"
    assert a["losses_before"] == b["losses_before"] and len(b["losses_before"]) == 3, f"{v}: train_state bytes"
    assert [s["position"] for s in b["steps"]] == [4, 5, 6] and [s["step"] for s in b["steps"]] == [4, 5, 6], v
    print(f"{v}: {len(a['loaded'])} values loaded equal; next losses {[s['loss'] for s in b['steps']]} equal")
PY
echo "dcp resume equivalence: ${variants//,/, }: equal"
