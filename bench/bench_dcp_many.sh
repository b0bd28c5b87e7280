#!/usr/bin/env bash
# A DCP of many small tensors resharded (issue 47's benchmark: 100,000 tensors with optimizer state), in one
# run against:
#   * the I/O floor: every input file read once and written once (dd bs=8M into the output folder, sync -f);
#   * torch's own converter, torch.distributed.checkpoint.format_utils.dcp_to_torch_save (the pinned
#     framework environment's torch, scripts/frameworks), then sync -f.
# ucpkit's step is `ucp-load --format dcp --world-size 2` (the whole rewrite: every entry, item and the
# .metadata) then the same sync. Time and peak RSS (GNU time) of each, rounds alternating, medians and ratios.
# The input is written once by torch's dcp.save (bench/bench_dcp_many_make.py) and kept.
# Usage: bench/bench_dcp_many.sh [build_dir] [rounds]   env: PARAMS (25000: 100,000 tensors), WORK
#        (/tmp/ucpkit-bench-dcp-many), FRAMEWORKS_PY (the pinned python; made by scripts/frameworks/setup.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
rounds=${2:-3}
PARAMS=${PARAMS:-25000}
work=${WORK:-/tmp/ucpkit-bench-dcp-many}
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
src=$work/dcp-p$PARAMS
mkdir -p "$work"
[ -f "$src/.metadata" ] || "$FRAMEWORKS_PY" "$root/bench/bench_dcp_many_make.py" "$src" --params "$PARAMS"
in_bytes=$(du -sb "$src" | cut -f1)
echo "input: $((PARAMS * 4)) tensors, $in_bytes bytes in $(ls -A "$src" | wc -l) files (torch $("$FRAMEWORKS_PY" -c 'import torch; print(torch.__version__)') dcp.save)"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; load $(cut -d' ' -f1-3 /proc/loadavg)"
cat "$src"/* "$src"/.metadata > /dev/null  # warm: each step reads the input from the page cache
. "$root/bench/bench_lib.sh"  # measure, add, med
run() {  # run NAME: one step into $work/out, its figures added
  rm -rf "$work/out"; sync
  local s u k
  case $1 in
    floor) mkdir -p "$work/out"
           read -r s u k < <(measure sh -c "for f in '$src'/* '$src'/.metadata; do dd if=\"\$f\" of='$work/out'/\$(basename \"\$f\") bs=8M status=none || exit 1; done && sync -f '$work/out'") ;;
    ucp)   read -r s u k < <(measure sh -c "'$build/bin/ucp-load' -q --input '$src' --format dcp --world-size 2 --output '$work/out' && sync -f '$work/out'") ;;
    torch) mkdir -p "$work/out"
           read -r s u k < <(measure sh -c "'$FRAMEWORKS_PY' -c 'from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(\"$src\", \"$work/out/model.pt\")' && sync -f '$work/out/model.pt'") ;;
  esac
  add "$1" "$s" "$u" "$k"
  echo "round $r $1: $s s, $u s CPU, peak RSS $((k / 1024)) MiB"
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="floor ucp torch"; else order="torch ucp floor"; fi
  for s in $order; do run "$s"; done
done
rm -rf "$work/out"
declare -A T M
for k in floor ucp torch; do T[$k]=$(echo "${t[$k]}" | med); M[$k]=$(echo "${m[$k]}" | med); done
echo "medians of $rounds: floor (read and write once) ${T[floor]} s; ucp-load ${T[ucp]} s, peak RSS $((M[ucp] / 1024)) MiB;" \
     "dcp_to_torch_save ${T[torch]} s, peak RSS $((M[torch] / 1024)) MiB"
awk -v f="${T[floor]}" -v u="${T[ucp]}" -v p="${T[torch]}" -v mu="${M[ucp]}" -v mp="${M[torch]}" 'BEGIN {
  printf "ratios: ucp-load / floor %.1fx (issue 47 target 1.3x); ucp-load / dcp_to_torch_save %.2f in time, %.2f in peak RSS\n",
         u / f, u / p, mu / mp }'
