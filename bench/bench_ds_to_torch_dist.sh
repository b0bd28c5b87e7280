#!/usr/bin/env bash
# DeepSpeed -> Megatron-Core torch_dist (issue 30, "each one pass with bounded memory"): the one pass
#   0. ucp-load  --input SRC --output OUT1 --format torch_dist               (SRC: the DeepSpeed checkpoint itself)
# against the two runs it replaces (docs/megatron-core-mapping.md), each timed on its own; in the first round
# their output is compared with the one pass's file by file (both written to the same path: .metadata names it):
#   1. ucp-union --input SRC --output MC --to-names megatron-core
#   2. ucp-load  --input MC  --output OUT --format torch_dist
# and the baseline "read the input and write the output once": dd (bs=8M) of every file of SRC into one
# folder, then sync -f (as bench_torch_dist.sh's). Rounds alternate (the machine is shared and noisy); wall,
# CPU user + sys and peak RSS (GNU time); medians; ratios to the baseline of the same run.
# The input (made once, kept): a generated Megatron-DeepSpeed Llama GQA + SwiGLU checkpoint
# (tests/generator/gen_ds_checkpoint.py, bf16 + ZeRO-1, TP $TP, DP 1).
# Usage: bench/bench_ds_to_torch_dist.sh [build_dir] [rounds]
#   env: WORK (default /work/bigbench2/ds2td); HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB, TP (model; the
#        defaults are bench_torch_dist.sh's: 183.5M parameters).
# Disk: SRC + MC + OUT + OUT1, about 4 x SRC; the script stops before a step would leave under 8 GB free.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
WORK=${WORK:-/work/bigbench2/ds2td}
HIDDEN=${HIDDEN:-1024}; HEADS=${HEADS:-16}; KV_HEADS=${KV_HEADS:-8}; FFN=${FFN:-2816}
LAYERS=${LAYERS:-10}; VOCAB=${VOCAB:-32000}; TP=${TP:-2}
bin=$build/bin
work=$WORK; mkdir -p "$work"
src=$work/src
if [ ! -f "$src/latest" ]; then
  rm -rf "$src"
  /usr/bin/python3 "$root/tests/generator/gen_ds_checkpoint.py" --output "$src" --model llama --tp "$TP" --dp 1 \
    --layers "$LAYERS" --hidden "$HIDDEN" --heads "$HEADS" --kv-heads "$KV_HEADS" --ffn "$FFN" --vocab "$VOCAB" --no-truth
fi
in_bytes=$(du -sb "$src" | cut -f1)
echo "input: $src, $in_bytes bytes in $(find "$src" -type f | wc -l) files (Llama hidden $HIDDEN, $LAYERS layers, ffn $FFN, vocab $VOCAB, TP $TP)"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; load $(cut -d' ' -f1-3 /proc/loadavg)"
find "$src" -type f -exec cat {} + >/dev/null; echo "input read once before the rounds (warm as far as the page cache holds it)"

. "$root/bench/bench_lib.sh"  # room, measure, add, med
clean() { rm -rf "$work/mc" "$work/out" "$work/one" "$work/base"; sync; }
for r in $(seq "$rounds"); do
  clean; room "$in_bytes"
  read -r s u k < <(measure "$bin/ucp-load" -q --input "$src" --output "$work/out" --format torch_dist)
  out_bytes=$(du -sb "$work/out" | cut -f1)
  add s0 "$s" "$u" "$k"; echo "round $r one pass ucp-load --input SRC --format torch_dist: $s s wall, $u s cpu, peak RSS $k KiB ($out_bytes bytes)"
  if [ "$r" = 1 ]; then mv "$work/out" "$work/one"; else rm -rf "$work/out"; fi
  room $((2 * in_bytes))
  read -r s u k < <(measure "$bin/ucp-union" -q --input "$src" --output "$work/mc" --to-names megatron-core)
  add s1 "$s" "$u" "$k"; echo "round $r step 1 ucp-union --to-names megatron-core: $s s wall, $u s cpu, peak RSS $k KiB"
  read -r s u k < <(measure "$bin/ucp-load" -q --input "$work/mc" --output "$work/out" --format torch_dist)
  add s2 "$s" "$u" "$k"; echo "round $r step 2 ucp-load --format torch_dist: $s s wall, $u s cpu, peak RSS $k KiB"
  if [ "$r" = 1 ]; then
    if diff -rq "$work/out" "$work/one" >/dev/null; then echo "round 1: the one pass's files equal the two runs' byte for byte"
    else echo "round 1: the one pass's files DIFFER from the two runs':" >&2; diff -rq "$work/out" "$work/one" >&2 || true; exit 1; fi
  fi
  clean; mkdir -p "$work/base"; room "$in_bytes"
  read -r s u k < <(measure sh -c "find '$src' -type f | while read -r f; do dd if=\"\$f\" of='$work/base'/\$(echo \"\$f\" | md5sum | cut -c1-16) bs=8M status=none || exit 1; done && sync -f '$work/base'")
  add base "$s" "$u" "$k"; echo "round $r baseline (dd every SRC file into one folder, sync): $s s wall, $u s cpu ($in_bytes bytes; OUT has $out_bytes)"
done
clean
declare -A T C M
for k in base s0 s1 s2; do T[$k]=$(echo "${t[$k]}" | med); C[$k]=$(echo "${c[$k]}" | med); M[$k]=$(echo "${m[$k]}" | med); done
ratio() { echo "scale=2; $1 / ${T[base]}" | bc; }
tot=$(paste -d' ' <(echo "${t[s1]}" | tr ' ' '\n' | grep .) <(echo "${t[s2]}" | tr ' ' '\n' | grep .) | awk '{print $1 + $2}' | med)
echo "medians over $rounds rounds (wall s, cpu user+sys s, peak RSS MiB, wall / baseline):"
echo "  baseline (read SRC once, write its bytes once, sync): ${T[base]} s, ${C[base]} s cpu, $((M[base] / 1024)) MiB"
echo "  one pass ucp-load --format torch_dist:   ${T[s0]} s, ${C[s0]} s cpu, $((M[s0] / 1024)) MiB, $(ratio "${T[s0]}")x"
echo "  step 1 ucp-union --to-names megatron-core: ${T[s1]} s, ${C[s1]} s cpu, $((M[s1] / 1024)) MiB, $(ratio "${T[s1]}")x"
echo "  step 2 ucp-load --format torch_dist:     ${T[s2]} s, ${C[s2]} s cpu, $((M[s2] / 1024)) MiB, $(ratio "${T[s2]}")x"
echo "  two runs (median of per-round sums):     $tot s, $(ratio "$tot")x"
