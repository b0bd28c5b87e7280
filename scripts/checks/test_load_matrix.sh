#!/bin/bash
# Full ucp-load round-trip matrix (tests/reshard/cases.py FULL): for every case, dsgen source ->
# ucp-union -> ucp-load -> ucp-union; the two universal checkpoints must agree bit for bit and the
# target must equal dsgen's checkpoint for that layout (tests/reshard/compare_target.py) and load as
# DeepSpeed / Megatron-DeepSpeed read it (tests/reshard/ds_consumer.py). Every pipeline case has tied
# word + position embeddings (tests/reshard/cases.py). With mpirun
# on PATH (MATRIX_MPI=0 to skip), the MPI exchange (3 ranks, batches smaller than a layer) must write
# the same bytes as the single-process run.
# Usage: scripts/checks/test_load_matrix.sh [build_dir] [work_dir]
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-load}
WORK=${2:-$BUILD/load-matrix}
PY=/usr/bin/python3
BIN=$BUILD/bin
mkdir -p "$WORK"
$PY "$ROOT/tests/reshard/fixtures.py" "$WORK/fx" --full || exit 1
pass=0; fail=0
while IFS=$'\t' read -r name args; do
  d=$WORK/run/$name
  rm -rf "$d"; mkdir -p "$d"
  ok=1
  "$BIN/ucp-union" -q --input "$WORK/fx/$name/src" --output "$d/u1" >"$d/log" 2>&1 || ok=0
  [ $ok = 1 ] && { "$BIN/ucp-load" -q --input "$d/u1" --output "$d/target" $args >>"$d/log" 2>&1 || ok=0; }
  [ $ok = 1 ] && { "$BIN/ucp-union" -q --input "$d/target" --output "$d/u2" >>"$d/log" 2>&1 || ok=0; }
  if [ $ok = 1 ]; then
    # Atomic files bit for bit (optimizer_state.pt and the copied model files describe the layout;
    # a ZeRO-3 TP = 1 target gives ds_to_universal's flat form, compared element by element).
    $PY "$ROOT/tests/reshard/same_universal.py" "$d/u1" "$d/u2" >>"$d/log" 2>&1 || ok=0
  fi
  [ $ok = 1 ] && { $PY "$ROOT/tests/reshard/compare_target.py" "$d/target" "$WORK/fx/$name/ref" "$WORK/fx/$name/src/truth" >>"$d/log" 2>&1 || ok=0; }
  # Read as DeepSpeed / Megatron-DeepSpeed do (mp_world_size, layer files, nested module, positional
  # ZeRO partitions, storage tags).
  [ $ok = 1 ] && { $PY "$ROOT/tests/reshard/ds_consumer.py" "$d/target" "$d/u1" "$WORK/fx/$name/ref" "$WORK/fx/$name/src/truth" >>"$d/log" 2>&1 || ok=0; }
  if [ $ok = 1 ] && [ "${MATRIX_MPI:-1}" = 1 ] && command -v mpirun > /dev/null; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun --allow-run-as-root --oversubscribe \
      -np 3 "$BIN/ucp-load" -q --exchange on --batch-mb 0.05 --input "$d/u1" --output "$d/exchange" $args \
      < /dev/null >>"$d/log" 2>&1 || ok=0
    [ $ok = 1 ] && { diff -r "$d/target" "$d/exchange" >>"$d/log" 2>&1 || ok=0; }
  fi
  if [ $ok = 1 ]; then echo "PASS $name"; pass=$((pass+1)); else echo "FAIL $name (see $d/log)"; tail -5 "$d/log"; fail=$((fail+1)); fi
done < <($PY -c "
import json,sys
for c in json.load(open('$WORK/fx/cases.json')): print(c['name'] + '\t' + ' '.join(c['target_args']))")
echo "test_load_matrix: $pass passed, $fail failed"
[ $fail = 0 ]
