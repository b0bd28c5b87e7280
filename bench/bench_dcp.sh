#!/usr/bin/env bash
# DCP -> universal form (ucp-union --input <DCP folder>) against, in the same run and on the same input:
#   * the baseline: reading the input and writing as many bytes once (cp -r, then sync -f: the flush
#     ucp-union also does before its rename);
#   * torch's own converter, torch.distributed.checkpoint.format_utils.dcp_to_torch_save (real torch
#     2.6 in the trixie chroot of ../shared/tools/torch2-env.sh), then the same sync -f.
# Time (seconds) and peak RSS (GNU time's maximum resident set) of each, rounds alternating (this
# machine is shared and noisy), medians and ratios at the end. The input is written once with the
# real dcp.save from 2 gloo ranks (bench/bench_dcp_make.py: FSDP2-like Shard(0) DTensors, model +
# Adam state as get_state_dict lays them out) and kept for later runs.
# Usage: bench/bench_dcp.sh [build_dir] [rounds]   env: TRIXIE (/opt/trixie), DIM, HIDDEN, LAYERS,
#        VOCAB (model size; default about 0.93 GB of fp32 model + Adam state).
# Disk: the input and one output at a time (about 2 x the input); check df first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
TRIXIE=${TRIXIE:-/opt/trixie}
DIM=${DIM:-2048}; HIDDEN=${HIDDEN:-5632}; LAYERS=${LAYERS:-1}; VOCAB=${VOCAB:-8000}
name=dcp_d${DIM}_h${HIDDEN}_l${LAYERS}_v${VOCAB}
work=$TRIXIE/lab/ucp-bench-dcp      # inside the chroot: /lab/ucp-bench-dcp
src=$work/$name
in_chroot() { chroot "$TRIXIE" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore "$@"; }
mkdir -p "$work"
if [ ! -f "$src/.metadata" ]; then
  cp "$root/bench/bench_dcp_make.py" "$work/"
  in_chroot python3 /lab/ucp-bench-dcp/bench_dcp_make.py "/lab/ucp-bench-dcp/$name" --world 2 \
    --dim "$DIM" --hidden "$HIDDEN" --layers "$LAYERS" --vocab "$VOCAB" 2>/dev/null
fi
echo "input: $(du -sb "$src" | cut -f1) bytes in $(ls "$src" | wc -l) files ($name, torch $(in_chroot python3 -c 'import torch; print(torch.__version__)'))"
cat "$src"/* "$src"/.metadata >/dev/null  # every run starts from a warm page cache

# Runs "$@" under GNU time; prints "<seconds> <peak RSS KiB>".
measure() { /usr/bin/time -f "%e %M" -o "$work/time.txt" "$@" >/dev/null 2>"$work/err.txt" || { cat "$work/err.txt" >&2; exit 1; }; cat "$work/time.txt"; }
declare -A t m
for r in $(seq "$rounds"); do
  rm -rf "$work/out"; sync
  read -r s k < <(measure sh -c "cp -r '$src' '$work/out' && sync -f '$work/out'")
  t[base]+="$s "; m[base]+="$k "; echo "round $r baseline (cp + sync): $s s, peak RSS $k KiB"
  rm -rf "$work/out"; sync
  read -r s k < <(measure "$build/bin/ucp-union" -q --input "$src" --output "$work/out")
  t[ucp]+="$s "; m[ucp]+="$k "; echo "round $r ucp-union: $s s, peak RSS $k KiB"
  rm -rf "$work/out"; sync
  mkdir -p "$work/out"
  read -r s k < <(measure sh -c "chroot '$TRIXIE' /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root PYTHONWARNINGS=ignore \
    python3 -c 'from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(\"/lab/ucp-bench-dcp/$name\", \"/lab/ucp-bench-dcp/out/model.pt\")' \
    && sync -f '$work/out/model.pt'")
  t[torch]+="$s "; m[torch]+="$k "; echo "round $r dcp_to_torch_save: $s s, peak RSS $k KiB"
done
rm -rf "$work/out"
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A T M
for k in base ucp torch; do T[$k]=$(echo "${t[$k]}" | med); M[$k]=$(echo "${m[$k]}" | med); done
echo "median baseline (cp + sync):  ${T[base]} s, peak RSS $((M[base] / 1024)) MiB"
echo "median ucp-union:             ${T[ucp]} s, peak RSS $((M[ucp] / 1024)) MiB"
echo "median dcp_to_torch_save:     ${T[torch]} s, peak RSS $((M[torch] / 1024)) MiB"
echo "ratios: ucp-union / baseline $(echo "scale=2; ${T[ucp]} / ${T[base]}" | bc)x time;" \
     "dcp_to_torch_save / ucp-union $(echo "scale=2; ${T[torch]} / ${T[ucp]}" | bc)x time," \
     "$(echo "scale=1; ${M[torch]} / ${M[ucp]}" | bc)x peak RSS"
