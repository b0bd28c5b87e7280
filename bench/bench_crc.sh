#!/usr/bin/env bash
# Cost of the zip CRC-32 check of the inputs (issue 16 item 12): ucp-union with the default check
# against --no-verify, alternating in the same run (this machine is shared and noisy), both with
# --no-sync so only the read side differs, on a generated bf16 ZeRO-1 GPT checkpoint (page cache warm:
# the source is read once before timing). Prints each run and the medians.
# Usage: bench/bench_crc.sh [build_dir] [work_dir] [rounds]   (env HIDDEN, LAYERS to resize)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
work=${2:-/tmp/ucp-bench-crc}
rounds=${3:-3}
bin=$build/bin
HIDDEN=${HIDDEN:-1536}; LAYERS=${LAYERS:-8}
mkdir -p "$work"
src=$work/src
[ -f "$src/latest" ] || /usr/bin/python3 "$root/tests/generator/gen_ds_checkpoint.py" --output "$src" --model gpt \
  --hidden "$HIDDEN" --ffn $((4 * HIDDEN)) --heads 16 --layers "$LAYERS" --vocab 50257 --seq 2048 \
  --tp 1 --pp 1 --dp 2 --no-truth >/dev/null
echo "source: $(du -sh "$src" | cut -f1)"
cat "$src"/global_step*/* > /dev/null
t() { local s e; s=$(date +%s.%N); "$@"; e=$(date +%s.%N); echo "$e - $s" | bc; }
declare -A times
for r in $(seq "$rounds"); do
  for mode in verify no-verify; do
    flag=""; [ $mode = no-verify ] && flag=--no-verify
    rm -rf "$work/u"
    u=$(t "$bin/ucp-union" -q --no-sync $flag --input "$src" --output "$work/u")
    echo "round $r $mode: ucp-union ${u} s"
    times[$mode]+="$u "
  done
done
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
v=$(echo "${times[verify]}" | med); n=$(echo "${times[no-verify]}" | med)
echo "median ucp-union: CRC checked $v s, --no-verify $n s, ratio $(echo "scale=3; $v / $n" | bc)"
rm -rf "$work/u"
