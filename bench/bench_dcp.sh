#!/usr/bin/env bash
# DCP -> universal form (ucp-union --input <DCP folder>) against, in the same run and on the same input:
#   * the baseline "read the input and write the output once": dd (bs=8M) every input file into a
#     file of the output folder, through one user-space buffer, then sync -f (the flush ucp-union also
#     does before its rename): every input byte read once and as many bytes written as the input has
#     (ucp-union's output is within 0.01% of that: printed per round);
#   * the older baseline: cp -r the input + sync -f (the kernel copies: no user-space pass at all);
#   * torch's own converter, torch.distributed.checkpoint.format_utils.dcp_to_torch_save (real torch
#     2.6 in the trixie chroot of ../shared/tools/torch2-env.sh), then the same sync -f.
# Time (seconds) and peak RSS (GNU time's maximum resident set) of each, rounds alternating (this
# machine is shared and noisy), medians and ratios at the end. The input is written once with the
# real dcp.save from 2 gloo ranks (bench/bench_dcp_make.py: FSDP2-like Shard(0) DTensors, model +
# Adam state as get_state_dict lays them out) and kept for later runs.
# Usage: bench/bench_dcp.sh [build_dir] [rounds]
#   env: TRIXIE (/opt/trixie); LAB (the work folder under the chroot's /lab, default ucp-bench-dcp:
#        a bind mount of a folder elsewhere works, e.g. LAB=bigbench over /work/bigbench);
#        DIM, HIDDEN, LAYERS, VOCAB (model size; default about 0.93 GB of fp32 model + Adam state);
#        SHARE=1 (bench_dcp_make.py --share: exp_avg / exp_avg_sq over the model's local shards, so a
#        checkpoint larger than half the RAM is saved in a third of it);
#        TORCH_ROUNDS (rounds of dcp_to_torch_save, default = rounds; 0 skips it);
#        WARM=0 (do not cat the input into the page cache first; default 1).
#   A checkpoint larger than half the RAM: SHARE=1 DIM=4096 HIDDEN=11008 LAYERS=5 VOCAB=32000 (13.8 GB).
# Disk: the input and one output at a time (about 2 x the input); the script stops before a round
# would leave less than 8 GB free.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
TRIXIE=${TRIXIE:-/opt/trixie}
LAB=${LAB:-ucp-bench-dcp}
DIM=${DIM:-2048}; HIDDEN=${HIDDEN:-5632}; LAYERS=${LAYERS:-1}; VOCAB=${VOCAB:-8000}
SHARE=${SHARE:-0}; TORCH_ROUNDS=${TORCH_ROUNDS:-$rounds}; WARM=${WARM:-1}
name=dcp_d${DIM}_h${HIDDEN}_l${LAYERS}_v${VOCAB}
share_arg=
if [ "$SHARE" = 1 ]; then name+=_share; share_arg=--share; fi
work=$TRIXIE/lab/$LAB      # inside the chroot: /lab/$LAB
src=$work/$name
in_chroot() { chroot "$TRIXIE" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore USE_LIBUV=0 "$@"; }
mkdir -p "$work"
if [ ! -f "$src/.metadata" ]; then
  cp "$root/bench/bench_dcp_make.py" "$work/"
  in_chroot python3 "/lab/$LAB/bench_dcp_make.py" "/lab/$LAB/$name" --world 2 \
    --dim "$DIM" --hidden "$HIDDEN" --layers "$LAYERS" --vocab "$VOCAB" $share_arg 2>/dev/null
fi
in_bytes=$(du -sb "$src" | cut -f1)
echo "input: $in_bytes bytes in $(ls "$src" | wc -l) files ($name, torch $(in_chroot python3 -c 'import torch; print(torch.__version__)'))"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$WARM" = 1 ]; then cat "$src"/* "$src"/.metadata >/dev/null; echo "input read once before the rounds (warm as far as the page cache holds it)"; fi

room() {  # stops unless writing $1 more bytes leaves 8 GB free
  local avail; avail=$(df -B1 --output=avail "$work" | tail -1)
  if [ $((avail - $1)) -lt 8000000000 ]; then echo "stop: $avail bytes free, $1 to write would leave under 8 GB" >&2; exit 1; fi
}
# Runs "$@" under GNU time; prints "<seconds> <peak RSS KiB>".
measure() { /usr/bin/time -f "%e %M" -o "$work/time.txt" "$@" >/dev/null 2>"$work/err.txt" || { cat "$work/err.txt" >&2; exit 1; }; cat "$work/time.txt"; }
declare -A t m
out_bytes=$in_bytes  # until ucp-union's first output is measured
for r in $(seq "$rounds"); do
  rm -rf "$work/out"; sync; room "$out_bytes"
  read -r s k < <(measure "$build/bin/ucp-union" -q --input "$src" --output "$work/out")
  out_bytes=$(du -sb "$work/out" | cut -f1)
  t[ucp]+="$s "; m[ucp]+="$k "; echo "round $r ucp-union: $s s, peak RSS $k KiB ($out_bytes bytes written)"
  rm -rf "$work/out"; sync; mkdir -p "$work/out"; room "$out_bytes"
  read -r s k < <(measure sh -c "for f in '$src'/* '$src'/.metadata; do dd if=\"\$f\" of='$work/out'/\$(basename \"\$f\") bs=8M status=none || exit 1; done && sync -f '$work/out'")
  t[base]+="$s "; m[base]+="$k "; echo "round $r baseline (dd each input file, sync): $s s"
  rm -rf "$work/out"; sync; room "$in_bytes"
  read -r s k < <(measure sh -c "cp -r '$src' '$work/out' && sync -f '$work/out'")
  t[cp]+="$s "; m[cp]+="$k "; echo "round $r cp -r + sync: $s s"
  if [ "$r" -le "$TORCH_ROUNDS" ]; then
    rm -rf "$work/out"; sync; mkdir -p "$work/out"; room "$in_bytes"
    /usr/bin/time -f "%e %M" -o "$work/time.txt" sh -c "chroot '$TRIXIE' /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root PYTHONWARNINGS=ignore \
      python3 -c 'from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(\"/lab/$LAB/$name\", \"/lab/$LAB/out/model.pt\")' \
      && sync -f '$work/out/model.pt'" >/dev/null 2>"$work/err.txt" && rc=0 || rc=$?
    read -r s k < <(tail -1 "$work/time.txt")
    if [ $rc != 0 ]; then
      echo "round $r dcp_to_torch_save: FAILED (exit $rc) after $s s, peak RSS $k KiB: $(grep -v '^$' "$work/err.txt" | tail -2 | tr '\n' ' ')"
    else
      t[torch]+="$s "; m[torch]+="$k "; echo "round $r dcp_to_torch_save: $s s, peak RSS $k KiB"
    fi
  fi
done
rm -rf "$work/out"
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A T M
for k in base cp ucp torch; do
  [ -n "${t[$k]:-}" ] || continue
  T[$k]=$(echo "${t[$k]}" | med); M[$k]=$(echo "${m[$k]}" | med)
done
echo "median baseline (dd + sync):       ${T[base]} s"
echo "median cp -r + sync:               ${T[cp]} s"
echo "median ucp-union:                  ${T[ucp]} s, peak RSS $((M[ucp] / 1024)) MiB"
echo "ratios: ucp-union / baseline $(echo "scale=2; ${T[ucp]} / ${T[base]}" | bc)x, ucp-union / cp $(echo "scale=2; ${T[ucp]} / ${T[cp]}" | bc)x"
if [ -n "${T[torch]:-}" ]; then
  echo "median dcp_to_torch_save:          ${T[torch]} s, peak RSS $((M[torch] / 1024)) MiB"
  echo "dcp_to_torch_save / ucp-union $(echo "scale=2; ${T[torch]} / ${T[ucp]}" | bc)x time, $(echo "scale=1; ${M[torch]} / ${M[ucp]}" | bc)x peak RSS"
fi
