#!/usr/bin/env bash
# A DCP of many tensors resharded (issue 47's benchmark: 100,000 tensors with optimizer state), in one run against:
#   * the I/O floor: every input byte read once and as many bytes as ucp-load's output holds written once, then
#     sync -f (bench_lib.sh floor_data; the output's size from a first ucp-load run, which also warms the caches),
#     written through the page cache (floor) and with O_DIRECT (floor_direct, as ucp-load writes its data files);
#     the ratio is taken to the lower of the two medians;
#   * torch's own converter, torch.distributed.checkpoint.format_utils.dcp_to_torch_save (the pinned
#     framework environment's torch, scripts/frameworks), then sync -f.
# ucpkit's step is `ucp-load --format dcp --world-size 2` (the whole rewrite: every entry, item and the
# .metadata) then the same sync. Time and peak RSS (GNU time) of each, rounds alternating, medians and ratios (and
# the ratio of the fastest rounds). Before each step the last one's output is removed, synced, and the disk given
# SETTLE seconds (this VM's root is mounted with `discard`: a removed file's blocks are discarded after the rm, and a
# step right after torch's 0.5-3 GB file ran up to 1.5x slower, the floor's steps as much as ucp-load).
# The input is written once by torch's dcp.save (bench/bench_dcp_many_make.py) and kept.
# Usage: bench/bench_dcp_many.sh [build_dir] [rounds]   env: PARAMS (25000: 100,000 tensors), ELEMENTS (values per
#        parameter, 4: the per-tensor cost alone; 8192: 2.5 GB, tensor bytes that count), WORK
#        (/tmp/ucpkit-bench-dcp-many), FRAMEWORKS_PY (the pinned python; made by scripts/frameworks/setup.sh),
#        TORCH_ROUNDS (the rounds torch's converter runs in, the first ones; all by default), SETTLE (1)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
rounds=${2:-3}
PARAMS=${PARAMS:-25000}
ELEMENTS=${ELEMENTS:-4}
work=${WORK:-/tmp/ucpkit-bench-dcp-many}
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
src=$work/dcp-p$PARAMS$([ "$ELEMENTS" = 4 ] || echo "-e$ELEMENTS")
mkdir -p "$work"
. "$root/bench/bench_lib.sh"  # room, measure, add, med, floor_data
if [ ! -f "$src/.metadata" ]; then
  room $((PARAMS * (ELEMENTS * 12 + 2000) * 3))  # the input, the output and torch's file
  "$FRAMEWORKS_PY" "$root/bench/bench_dcp_many_make.py" "$src" --params "$PARAMS" --elements "$ELEMENTS"
fi
in_bytes=$(du -sb "$src" | cut -f1)
echo "input: $((PARAMS * 4)) tensors ($ELEMENTS values per parameter), $in_bytes bytes in $(ls -A "$src" | wc -l) files (torch $("$FRAMEWORKS_PY" -c 'import torch; print(torch.__version__)') dcp.save)"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; load $(cut -d' ' -f1-3 /proc/loadavg)"
cat "$src"/* "$src"/.metadata > /dev/null  # warm: each step reads the input from the page cache
rm -rf "$work/out"
"$build/bin/ucp-load" -q --input "$src" --format dcp --world-size 2 --output "$work/out"  # warm; its size is the floor's
out_bytes=$(du -sb "$work/out" | cut -f1)
echo "output: $out_bytes bytes in $(ls -A "$work/out" | wc -l) files"
torch_rounds=${TORCH_ROUNDS:-$rounds}
run() {  # run NAME: one step into $work/out, its figures added
  rm -rf "$work/out"; sync; sleep "${SETTLE:-1}"
  local s u k
  case $1 in
    floor) mkdir -p "$work/out"
           read -r s u k < <(measure bash -c "$(declare -f floor_data); floor_data '$src' $out_bytes '$work/out/floor.bin'") ;;
    floor_direct) mkdir -p "$work/out"
           read -r s u k < <(measure bash -c "$(declare -f floor_data); floor_data '$src' $out_bytes '$work/out/floor.bin' direct") ;;
    ucp)   read -r s u k < <(measure sh -c "'$build/bin/ucp-load' -q --input '$src' --format dcp --world-size 2 --output '$work/out' && sync -f '$work/out'") ;;
    torch) mkdir -p "$work/out"
           read -r s u k < <(measure sh -c "'$FRAMEWORKS_PY' -c 'from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(\"$src\", \"$work/out/model.pt\")' && sync -f '$work/out/model.pt'") ;;
  esac
  add "$1" "$s" "$u" "$k"
  echo "round $r $1: $s s, $u s CPU, peak RSS $((k / 1024)) MiB"
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="floor floor_direct ucp torch"; else order="torch ucp floor_direct floor"; fi
  for s in $order; do
    if [ "$s" != torch ] || [ "$r" -le "$torch_rounds" ]; then run "$s"; fi
  done
done
rm -rf "$work/out"
declare -A T M
declare -A L
for k in floor floor_direct ucp torch; do
  T[$k]=$(echo "${t[$k]}" | med); M[$k]=$(echo "${m[$k]}" | med); L[$k]=$(echo "${t[$k]}" | tr ' ' '\n' | grep . | sort -g | head -1)
done
echo "medians of $rounds: floor (read the input, write the output's bytes, once) ${T[floor]} s through the page cache," \
     "${T[floor_direct]} s with O_DIRECT; ucp-load ${T[ucp]} s, peak RSS $((M[ucp] / 1024)) MiB;" \
     "dcp_to_torch_save ${T[torch]} s, peak RSS $((M[torch] / 1024)) MiB (its median of $((torch_rounds < rounds ? torch_rounds : rounds)))"
awk -v f="${T[floor]}" -v fd="${T[floor_direct]}" -v u="${T[ucp]}" -v p="${T[torch]}" -v mu="${M[ucp]}" -v mp="${M[torch]}" 'BEGIN {
  lo = (fd < f) ? fd : f
  printf "ratios: ucp-load / floor %.2fx (the lower floor; issue 47 target 1.3x; %.2fx the cached floor); ucp-load / dcp_to_torch_save %.2f in time, %.2f in peak RSS\n",
         u / lo, u / f, u / p, mu / mp }'
awk -v f="${L[floor]}" -v fd="${L[floor_direct]}" -v u="${L[ucp]}" 'BEGIN {
  lo = (fd < f) ? fd : f
  printf "fastest rounds: floor %.2f s, ucp-load %.2f s: %.2fx\n", lo, u, u / lo }'
