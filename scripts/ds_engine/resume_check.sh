#!/bin/bash
# DeepSpeed's real engine resumes from ucp-load's outputs of the real-engine fixture (outside CI).
# For each target layout: ucp-load the fixture's universal folder, load_checkpoint it in the engine
# (train_moe_tutorial.py --resume, world = target DP), then
#   * compare_loaded.py: the weights every rank holds equal the source run's (truth/), bit for bit;
#   * the engine's own save of what it loaded, through ucp-union, equals the source's universal folder
#     byte for byte (tests/load/same_universal.py, both ways): fp32, exp_avg, exp_avg_sq and step.
# Usage: DS_SRC=<DeepSpeed v0.14.5 source tree> scripts/ds_engine/resume_check.sh BUILD_DIR WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
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
  $py "$repo/tests/load/same_universal.py" u1 "r_${n}_u"
  $py "$repo/tests/load/same_universal.py" "r_${n}_u" u1
  echo "resume_check: $n ok"
done
