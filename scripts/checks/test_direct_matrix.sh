#!/bin/bash
# ucp-load's direct mode (issue 18) over the full round-trip matrix (tests/reshard/cases.py FULL, the
# cases of scripts/checks/test_load_matrix.sh): for every case the target written straight from the native
# source (`ucp-load --input <source>`) must equal, byte for byte, the two-step target (ucp-union, then
# ucp-load from the universal checkpoint), in one process and under mpirun -np 2 and -np 3 (the
# exchange; -np 3 with batches smaller than a layer). The -np 2 run also computes the universal
# checksums on the way and compares them with the two-step universal manifest (--verify-against).
# `--plan` is checked by tests/reshard/check_direct_plan.py against the universal tensors and the
# one-process target's bytes.
# Usage: scripts/checks/test_direct_matrix.sh [build_dir] [work_dir]   (MATRIX_MPI=0: one process only;
# CASES='name ...': only these cases)
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
WORK=${2:-$BUILD/direct-matrix}
PY=/usr/bin/python3
BIN=$BUILD/bin
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$WORK"
[ -f "$WORK/fx/cases.json" ] || $PY "$ROOT/tests/reshard/fixtures.py" "$WORK/fx" --full || exit 1
MPI=${MATRIX_MPI:-1}
command -v mpirun > /dev/null || MPI=0
pass=0; fail=0
while IFS=$'\t' read -r name args; do
  if [ -n "${CASES:-}" ] && ! [[ " $CASES " == *" $name "* ]]; then continue; fi
  d=$WORK/run/$name
  rm -rf "$d"; mkdir -p "$d"
  ok=1
  src=$WORK/fx/$name/src
  "$BIN/ucp-union" -q --input "$src" --output "$d/u1" >"$d/log" 2>&1 || ok=0
  [ $ok = 1 ] && { "$BIN/ucp-load" -q --input "$d/u1" --output "$d/two" $args >>"$d/log" 2>&1 || ok=0; }
  [ $ok = 1 ] && { "$BIN/ucp-load" -q --input "$src" --output "$d/direct1" $args >>"$d/log" 2>&1 || ok=0; }
  [ $ok = 1 ] && { diff -r "$d/two" "$d/direct1" >>"$d/log" 2>&1 || { echo "direct1 differs" >>"$d/log"; ok=0; }; }
  # --plan: source runs against the universal tensors, source -> target copies against direct1's bytes.
  [ $ok = 1 ] && { "$BIN/ucp-load" -q --plan --input "$src" $args >"$d/plan.json" 2>>"$d/log" &&
    $PY "$ROOT/tests/reshard/check_direct_plan.py" "$d/plan.json" "$d/u1" "$d/direct1" >>"$d/log" 2>&1 ||
    { echo "--plan check failed" >>"$d/log"; ok=0; }; }
  if [ $ok = 1 ] && [ "$MPI" = 1 ]; then
    timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$BIN/ucp-load" -q --input "$src" \
      --output "$d/direct2" --verify-against "$d/u1" $args < /dev/null >>"$d/log" 2>&1 || ok=0
    [ $ok = 1 ] && { diff -r "$d/two" "$d/direct2" >>"$d/log" 2>&1 || { echo "direct2 differs" >>"$d/log"; ok=0; }; }
    [ $ok = 1 ] && { timeout 300 mpirun --allow-run-as-root --oversubscribe -np 3 "$BIN/ucp-load" -q --batch-mb 0.05 \
      --input "$src" --output "$d/direct3" $args < /dev/null >>"$d/log" 2>&1 || ok=0; }
    [ $ok = 1 ] && { diff -r "$d/two" "$d/direct3" >>"$d/log" 2>&1 || { echo "direct3 differs" >>"$d/log"; ok=0; }; }
  fi
  if [ $ok = 1 ]; then echo "PASS $name"; pass=$((pass+1)); else echo "FAIL $name (see $d/log)"; tail -5 "$d/log"; fail=$((fail+1)); fi
done < <($PY -c "
import json,sys
for c in json.load(open('$WORK/fx/cases.json')): print(c['name'] + '\t' + ' '.join(c['target_args']))")
echo "test_direct_matrix: $pass passed, $fail failed"
[ $fail = 0 ] && [ $pass -gt 0 ]
