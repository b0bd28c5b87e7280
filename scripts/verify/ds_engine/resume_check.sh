#!/bin/bash
# DeepSpeed's real engine resumes from ucp-load's outputs of the real-engine fixture (outside CI).
# For each target layout: ucp-load the fixture's universal folder, load_checkpoint it in the engine
# (train_moe_tutorial.py --resume, world = target DP), then
#   * compare_loaded.py: the weights every rank holds equal the source run's (truth/), bit for bit;
#   * the engine's own save of what it loaded, through ucp-union, equals the source's universal folder
#     byte for byte (tests/reshard/same_universal.py, both ways): fp32, exp_avg, exp_avg_sq and step.
# Then the same for a pec-restore output (the end of this file).
# Usage: DS_SRC=<DeepSpeed v0.14.5 source tree, with version.txt> scripts/verify/ds_engine/resume_check.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bin=$(cd "$1" && pwd)/bin
work=$2
fixture=$repo/tests/generator/engine/moe_tutorial_v0.14.5
py=/usr/bin/python3
mkdir -p "$work"
cd "$work"
rm -rf u1
"$bin/ucp-union" -q --input "$fixture" --output u1 2>/dev/null
port=29600
for cfg in "4 4 1" "4 2 1" "4 4 2" "2 2 2"; do
  set -- $cfg
  n=dp$1_ep$2_zero$3
  port=$((port + 1))
  rm -rf "$n" "r_$n" "r_${n}_u"
  "$bin/ucp-load" -q --input u1 --output "$n" --tp 1 --pp 1 --dp "$1" --ep "$2" --zero-stage "$3" --dtype fp32
  $py "$here/train_moe_tutorial.py" "r_$n" --world "$1" --ep "$2" --zero "$3" --steps 1 --port "$port" --resume "$n" \
    2>&1 | grep '^train_moe_tutorial'
  $py "$here/compare_loaded.py" "r_$n" "$fixture"
  "$bin/ucp-union" -q --input "r_$n/resaved" --output "r_${n}_u" 2>/dev/null
  $py "$repo/tests/reshard/same_universal.py" u1 "r_${n}_u"
  $py "$repo/tests/reshard/same_universal.py" "r_${n}_u" u1
  echo "resume_check: $n ok"
done
# PEC: the run's chain (steps 1, 2 and the fixture's 3) stored with K = 1, step 3 restored (experts
# from several steps), loaded by the engine; its re-save through ucp-union equals the restored folder's.
rm -rf pec_store pec_out pec_out.json r_pec pec_u r_pec_u
for s in 1 2 3; do
  ck=$fixture; [ "$s" -lt 3 ] && ck=$fixture/chain/step$s
  "$bin/pec-save" -q --checkpoint "$ck" --store pec_store --step "$s" --policy sequential --k 1
done
"$bin/pec-restore" -q --store pec_store --output pec_out --report pec_out.json 2>/dev/null
$py -c "import json, sys; print('pec-restore: experts from steps', sorted({e['restored_step'] for e in json.load(open(sys.argv[1]))['experts']}))" pec_out.json
$py "$here/train_moe_tutorial.py" r_pec --steps 1 --port $((port + 1)) --resume pec_out 2>&1 | grep '^train_moe_tutorial'
"$bin/ucp-union" -q --input pec_out --output pec_u 2>/dev/null
"$bin/ucp-union" -q --input r_pec/resaved --output r_pec_u 2>/dev/null
$py "$repo/tests/reshard/same_universal.py" pec_u r_pec_u
$py "$repo/tests/reshard/same_universal.py" r_pec_u pec_u
echo "resume_check: pec-restore ok"
