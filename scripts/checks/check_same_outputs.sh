#!/usr/bin/env bash
# Before/after check for refactors that must not change behaviour (issue 21): runs the same
# conversions with the tools of two builds and requires byte-identical outputs.
#   * every case of the load matrix (tests/reshard/fixtures.py --full): ucp-union of the source, ucp-load
#     of that universal checkpoint to the case's target layout;
#   * ucp-extract under `mpirun -np 2` + ucp-union on two of them (when mpirun is on PATH);
#   * the demo's GPT checkpoint (scripts/demo.sh's layout) through ucp-union and ucp-load;
#   * pec-save (sequential, k = 1) and pec-restore of a native-MoE checkpoint: store and restored folder;
#   * moe-replace on ../shared/data loads (when present), every algorithm, and a re-placement.
# Usage: scripts/checks/check_same_outputs.sh OLD_BUILD NEW_BUILD [WORK]   (exit 0: identical; 1: a difference)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 OLD_BUILD NEW_BUILD [WORK]" >&2; exit 2; }
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
work=${3:-$(mktemp -d /tmp/ucpkit-same.XXXXXX)}
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work"
$py "$root/tests/reshard/fixtures.py" "$work/fx" --full > /dev/null || exit 1
rm -rf "$work/gen"; mkdir -p "$work/gen"
$py "$root/tests/generator/gen_ds_checkpoint.py" --output "$work/gen/demo" --model gpt --tp 2 --pp 2 --dp 2 --zero 1 \
  --dtype bf16 --layers 4 --hidden 64 --heads 4 --ffn 256 --vocab 250 --seq 32 --seed 1 > /dev/null 2>&1 || exit 1
$py "$root/tests/generator/gen_ds_checkpoint.py" --output "$work/gen/moe" --model dsmoe --dp 4 --ep 2 > /dev/null 2>&1 || exit 1
loads=$root/../shared/data/smartmoe_expert_loads.json
errors=0

# run TAG BIN: every conversion into $work/out/TAG (logs beside, not compared).
run() {
  local tag=$1 bin=$2/bin o=$work/out/$1 name args n=0
  # The binaries' RUNPATH names the build they were linked in; a copied build must use its own library.
  local -x LD_LIBRARY_PATH=$2/lib
  rm -rf "$o" "$work/log/$tag"; mkdir -p "$o" "$work/log/$tag"
  local log=$work/log/$tag/log
  while IFS=$'\t' read -r name args; do
    "$bin/ucp-union" -q --input "$work/fx/$name/src" --output "$o/$name.u" >>"$log" 2>&1 || echo "$tag: ucp-union $name failed" >>"$log"
    "$bin/ucp-load" -q --input "$o/$name.u" --output "$o/$name.t" $args >>"$log" 2>&1 || echo "$tag: ucp-load $name failed" >>"$log"
    n=$((n + 1))
    if [ $n -le 2 ] && command -v mpirun > /dev/null; then
      mpirun --allow-run-as-root --oversubscribe -np 2 "$bin/ucp-extract" -q --input "$work/fx/$name/src" \
        --output "$work/log/$tag/$name.work" < /dev/null >>"$log" 2>&1 &&
        "$bin/ucp-union" -q --input "$work/log/$tag/$name.work" --output "$o/$name.two" >>"$log" 2>&1 ||
        echo "$tag: two-step $name failed" >>"$log"
    fi
  done < <($py -c "
import json
for c in json.load(open('$work/fx/cases.json')): print(c['name'] + '\t' + ' '.join(c['target_args']))")
  "$bin/ucp-union" -q --input "$work/gen/demo" --output "$o/demo.u" >>"$log" 2>&1
  "$bin/ucp-load" -q --input "$o/demo.u" --output "$o/demo.t" --tp 1 --pp 1 --dp 4 --zero-stage 1 >>"$log" 2>&1
  "$bin/pec-save" -q --checkpoint "$work/gen/moe" --store "$o/pec.store" --step 100 --policy sequential --k 1 >>"$log" 2>&1
  "$bin/pec-restore" -q --store "$o/pec.store" --output "$o/pec.restored" >>"$log" 2>&1
  if [ -f "$loads" ]; then
    local a
    for a in balanced-ft lazarus spread hecate eplb eplb-global; do
      "$bin/moe-replace" --loads "$loads" --nodes 4 --gpus-per-node 8 --slots-per-gpu 2 --fault-tolerance 2 \
        --algorithm "$a" --output "$o/place.$a.json" >>"$log" 2>&1
    done
    # From inside $o: the plan records the previous plan's path as given (the same for both builds).
    (cd "$o" && "$bin/moe-replace" --loads "$loads" --nodes 4 --gpus-per-node 8 --slots-per-gpu 2 --fault-tolerance 2 \
      --previous place.eplb.json --output place.replaced.json) >>"$log" 2>&1
  fi
}

run old "$old"
run new "$new"
if ! diff -q "$work/log/old/log" "$work/log/new/log" > /dev/null; then
  echo "note: the runs' messages differ (not an output difference): diff $work/log/old/log $work/log/new/log"
fi
count=$(find "$work/out/old" -type f | wc -l)
if diff -r "$work/out/old" "$work/out/new" > "$work/diff.txt" 2>&1; then
  echo "check_same_outputs: identical ($count files) in $work/out/{old,new}"
else
  echo "check_same_outputs: DIFFERENT outputs ($(wc -l < "$work/diff.txt") diff lines, $work/diff.txt):"
  head -20 "$work/diff.txt"
  errors=1
fi
exit $errors
