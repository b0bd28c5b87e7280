#!/usr/bin/env bash
# Cost of durable outputs: ucp-union and ucp-load with the default flush to stable storage (syncfs
# before the rename, parent fsync after) against --no-sync, alternating in the same run (this machine
# is shared and noisy), on a generated bf16 ZeRO-1 GPT checkpoint. Prints each run and the medians.
# Usage: bench/bench_sync.sh [build_dir] [work_dir] [rounds]   (env HIDDEN, LAYERS to resize)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
work=${2:-/tmp/ucp-bench-sync}
rounds=${3:-3}
bin=$build/bin
HIDDEN=${HIDDEN:-1536}; LAYERS=${LAYERS:-8}
mkdir -p "$work"
src=$work/src
[ -f "$src/latest" ] || /usr/bin/python3 "$root/tests/generator/gen_ds_checkpoint.py" --output "$src" --model gpt \
  --hidden "$HIDDEN" --ffn $((4 * HIDDEN)) --heads 16 --layers "$LAYERS" --vocab 50257 --seq 2048 \
  --tp 1 --pp 1 --dp 2 --no-truth >/dev/null
echo "source: $(du -sh "$src" | cut -f1)"
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); echo "$e - $s" | bc; }
declare -A times
for r in $(seq "$rounds"); do
  for mode in sync no-sync; do
    flag=""; [ $mode = no-sync ] && flag=--no-sync
    rm -rf "$work/u" "$work/t"; sync
    u=$(t "$bin/ucp-union" -q $flag --input "$src" --output "$work/u")
    l=$(t "$bin/ucp-load" -q $flag --input "$work/u" --output "$work/t" --tp 1 --pp 1 --dp 3 --zero-stage 1)
    echo "round $r $mode: ucp-union ${u} s, ucp-load ${l} s"
    times[$mode-union]+="$u "; times[$mode-load]+="$l "
  done
done
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for tool in union load; do
  s=$(echo "${times[sync-$tool]}" | med); n=$(echo "${times[no-sync-$tool]}" | med)
  echo "median ucp-$tool: sync $s s, --no-sync $n s, ratio $(echo "scale=3; $s / $n" | bc)"
done
rm -rf "$work/u" "$work/t"
