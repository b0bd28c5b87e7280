#!/usr/bin/env bash
# UCP benchmark: a generated ~500M-parameter bf16 ZeRO-1 GPT checkpoint (TP=2, PP=2, DP=2) converted
# by ucp-union (one process, both cores), against the I/O floor measured in the same run: a plain
# read of every input byte ucp-union reads plus a plain copy of every output byte it writes. Then
# `mpirun -np 2` on the same input must give the same output bit for bit. Finally a memory check:
# a checkpoint 4x larger with the same largest parameter must not need more than ~1.2x the memory.
# Usage: bench/bench_ucp.sh [build_dir] [work_dir]   (env: HIDDEN, LAYERS, VOCAB to resize;
# MEMCHECK=0 skips the memory check, MEMCHECK=only runs nothing else)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
work=${2:-/tmp/ucp-bench}
bin=$build/bin
py=/usr/bin/python3
HIDDEN=${HIDDEN:-2048}; LAYERS=${LAYERS:-8}; VOCAB=${VOCAB:-50257}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work"
# Memory bound: the same largest parameter (the embedding, hidden 512 x vocabulary 8192) with 3 and
# with 18 layers (18 layers: 4.0x the checkpoint bytes); the byte ratio is measured with du.
memcheck() {
  for l in 3 18; do
    m=$work/mem-l$l
    [ -f "$m/latest" ] || $py "$root/tests/generator/gen_ds_checkpoint.py" --output "$m" --model gpt --hidden 512 \
      --ffn 2048 --heads 16 --layers $l --vocab 8192 --seq 2048 --tp 2 --pp 1 --dp 2 --no-truth 2>/dev/null
    rm -rf "$m.out"
    "$bin/ucp-union" -q --json --input "$m" --output "$m.out" > "$m.json"
    rm -rf "$m.out" "$work/latest_universal"
  done
  $py - "$work/mem-l3" "$work/mem-l18" <<'PY'
import json, sys, os
def du(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
(a, b), (sa, sb) = ((json.load(open(d + ".json")) for d in sys.argv[1:3]), (du(d) for d in sys.argv[1:3]))
print(f"  memory bound: checkpoint {sa>>20} MiB (3 layers) vs {sb>>20} MiB (18 layers) = {sb/sa:.2f}x the bytes;"
      f" peak RSS {a['peak_rss_bytes']>>20} MiB vs {b['peak_rss_bytes']>>20} MiB,"
      f" ratio {b['peak_rss_bytes']/a['peak_rss_bytes']:.2f}x (target <= 1.2x)")
PY
}
if [ "${MEMCHECK:-1}" = only ]; then memcheck; exit 0; fi

ck=$work/ckpt-h$HIDDEN-l$LAYERS
if [ ! -f "$ck/latest" ]; then
  echo "bench_ucp: generating checkpoint in $ck" >&2
  $py "$root/tests/generator/gen_ds_checkpoint.py" --output "$ck" --model gpt --hidden "$HIDDEN" --ffn $((4*HIDDEN)) \
    --heads 16 --layers "$LAYERS" --vocab "$VOCAB" --seq 2048 --tp 2 --pp 2 --dp 2 --dtype bf16 --no-truth
fi
step=$ck/$(cat "$ck/latest")
inputs=("$step"/*optim_states.pt "$step"/mp_rank_*_model_states.pt)
in_bytes=$(cat "${inputs[@]}" | wc -c)
now() { date +%s.%N; }
rm -rf "$work/out" "$work/out.copy" "$work/out-mpi" "$work/latest_universal"
cat "${inputs[@]}" > /dev/null   # same page-cache state for every measurement

# Each timed step starts after `sync` (no dirty pages of an earlier step being flushed under it);
# floor and ucp-union alternate, twice each, and the faster of each pair counts.
floor_run() {  # prints "<seconds> <cpu seconds>"
  local t0 t1 t2 t3
  sync
  t0=$(now); /usr/bin/time -f "%U %S" -o "$work/read.cpu" cat "${inputs[@]}" > /dev/null; t1=$(now)
  rm -rf "$work/out.copy"; sync
  t2=$(now); /usr/bin/time -f "%U %S" -o "$work/copy.cpu" cp -r "$work/out" "$work/out.copy"; t3=$(now)
  rm -rf "$work/out.copy"
  echo "$(echo "$t1 - $t0 + $t3 - $t2" | bc) $(cat "$work/read.cpu" "$work/copy.cpu" | awk '{s += $1 + $2} END {print s}')"
}
pfloor_run() {  # the same bytes with two processes at once (both cores): prints "<seconds>"
  local t0 t1 t2 t3
  sync
  t0=$(now); printf '%s\0' "${inputs[@]}" | xargs -0 -P2 -n4 cat > /dev/null; t1=$(now)
  rm -rf "$work/out.copy"; (cd "$work/out" && find . -type d -exec mkdir -p "$work/out.copy/{}" \;); sync
  t2=$(now)
  (cd "$work/out" && find . -type f -print0 | xargs -0 -P2 -n16 sh -c 'for f; do cp "$f" "$0/$f"; done' "$work/out.copy")
  t3=$(now)
  rm -rf "$work/out.copy"
  echo "$t1 - $t0 + $t3 - $t2" | bc
}
union_run() {  # prints "<seconds> <cpu seconds>"
  rm -rf "$work/out"; sync
  /usr/bin/time -f "%U %S" -o "$work/union.cpu" "$bin/ucp-union" -q --json --input "$ck" --output "$work/out" > "$work/union.json"
  echo "$($py -c "import json;print(json.load(open('$work/union.json'))['seconds'])") $(awk '{print $1 + $2}' "$work/union.cpu")"
}
read -r u1 ucpu1 < <(union_run)
read -r f1 fcpu1 < <(floor_run)
read -r u2 ucpu2 < <(union_run)
read -r f2 fcpu2 < <(floor_run)
p1=$(pfloor_run); p2=$(pfloor_run)
union_s=$(echo "if ($u1 < $u2) $u1 else $u2" | bc)
floor=$(echo "if ($f1 < $f2) $f1 else $f2" | bc)
union_cpu="$ucpu1/$ucpu2"; floor_cpu="$fcpu1/$fcpu2"
rss=$($py -c "import json;print(json.load(open('$work/union.json'))['peak_rss_bytes'])")
params=$($py -c "import json;print(json.load(open('$work/union.json'))['params'])")
out_bytes=$(du -sb "$work/out" | cut -f1)
ratio=$(echo "scale=2; $union_s / $floor" | bc)
pfloor=$(echo "if ($p1 < $p2) $p1 else $p2" | bc)
pratio=$(echo "scale=2; $union_s / $pfloor" | bc)

t0=$(now)
mpirun -np 2 --oversubscribe "$bin/ucp-union" -q --json --input "$ck" --output "$work/out-mpi" > "$work/union-mpi.json"
t1=$(now)
mpi_s=$(echo "$t1 - $t0" | bc)
if diff -r -q "$work/out" "$work/out-mpi" > /dev/null; then mpi_same=yes; else mpi_same=NO; fi
rm -rf "$work/out-mpi"

elements=$($py -c "
import json; m=json.load(open('$work/out/manifest.json'))
import math; print(sum(math.prod(p['shape']) for p in m['params']))")
cat <<REPORT
bench_ucp: GPT hidden=$HIDDEN layers=$LAYERS vocab=$VOCAB, bf16 ZeRO-1, TP=2 PP=2 DP=2
  parameters (tensors / elements):  $params / $elements
  input read / output written:      $((in_bytes/1048576)) MiB / $((out_bytes/1048576)) MiB
  ucp-union (1 process, 2 threads): ${union_s}s, peak RSS $((rss/1048576)) MiB
  I/O floor (cat inputs + cp -r output): ${floor}s (runs $f1 s, $f2 s; ucp-union runs $u1 s, $u2 s)
  ratio to floor:                   ${ratio}x  (target <= 1.5x)
  floor with 2 processes (xargs -P2): ${pfloor}s (runs $p1 s, $p2 s); ratio ${pratio}x
  CPU seconds (user+sys) per run:   ucp-union ${union_cpu}s, floor ${floor_cpu}s; load average $(cut -d' ' -f1 /proc/loadavg)
  mpirun -np 2 (wall incl. start):  ${mpi_s}s, output identical to 1 process: $mpi_same
REPORT

if [ "${MEMCHECK:-1}" = 1 ]; then memcheck; fi
