#!/usr/bin/env bash
# torch_dist -> Megatron-DeepSpeed (issue 30, Acceptance "Benchmark"): the one pass
#   0. ucp-load  --input TD --template TPL --output OUT1 --format deepspeed --tp TP --pp 1 --dp 1
# and (THREE_STEPS=1, the default) the three tool runs it replaces (docs/megatron-core-mapping.md), each
# timed on its own (in the first round their output is compared with the one pass's, file by file):
#   1. ucp-union --input TD --output MC2                      (torch_dist -> Megatron-Core-named universal)
#   2. ucp-union --input MC2 --output DSU --to-names megatron-deepspeed --template TPL
#   3. ucp-load  --input DSU --output OUT --format deepspeed --tp TP --pp 1 --dp 1
# against, in the same run and on the same input, rounds alternating (the machine is shared and noisy):
#   * the baseline "read the input and write the output once" (as bench_dcp.sh's): dd (bs=8M) of every
#     file of TD into a file of one folder, through one user-space buffer, then sync -f (the flush the
#     tools also do): every input byte read once and TD's byte count written, which is OUT's within
#     0.02% at the default size (both printed per round). (A first version read TD into /dev/null and
#     wrote OUT's count through `head -c .. /dev/zero | dd`: the pipe made that baseline cost 3.8 s CPU,
#     too slow a baseline, so it was replaced.)
#   * torch's own converter, torch.distributed.checkpoint.format_utils.dcp_to_torch_save, on the same
#     TD iteration folder (real torch 2.6 in the trixie chroot), then sync -f of its file.
# Wall time, CPU user + sys and peak RSS (GNU time) of each; medians over the rounds; ratios at the end.
# The input (made once, kept for later runs): a generated Megatron-DeepSpeed Llama GQA + SwiGLU checkpoint
# (tests/generator/gen_ds_checkpoint.py, bf16 + ZeRO-1, TP $TP) -> ucp-union --to-names megatron-core (TPL,
# also the template of step 2: docs/megatron-core-mapping.md allows the --to-names megatron-core output of
# the Megatron-DeepSpeed universal folder as --template) -> ucp-load --format torch_dist (TD); the
# generated checkpoint is then removed.
# Usage: bench/bench_torch_dist.sh [build_dir] [rounds]
#   env: WORK (work folder, default /work/bigbench2/td; bind-mounted at $TRIXIE/lab/$LAB for torch);
#        TRIXIE (/opt/trixie); LAB (default ucp-bench-td); TORCH_ROUNDS (default = rounds; 0 skips torch);
#        SCRATCH_NOSYNC=1 (steps 1 and 2 with --no-sync: MC2 and DSU are scratch folders);
#        THREE_STEPS=0 (time the one pass only: less disk, for inputs larger than half the RAM);
#        DROP_CACHES=1 (drop the page cache before every timed run: each reads its input from disk, the
#          same start for all; without it the state of the cache, 13 GB input and outputs on 23 GiB, decides);
#        OTHER=dir (also time the one pass of another build, dir/bin and dir/lib, in each round: same run);
#        HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB, TP (model; default 183.5M parameters, TD 2.57 GB).
# Disk: TPL + TD + (MC2 + DSU + OUT) at the same time, about 5 x TD; MC2 is removed (untimed) once step 2
# is done; the script stops before a round would leave less than 8 GB free.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
TRIXIE=${TRIXIE:-/opt/trixie}; LAB=${LAB:-ucp-bench-td}; WORK=${WORK:-/work/bigbench2/td}
TORCH_ROUNDS=${TORCH_ROUNDS:-$rounds}
HIDDEN=${HIDDEN:-1024}; HEADS=${HEADS:-16}; KV_HEADS=${KV_HEADS:-8}; FFN=${FFN:-2816}
LAYERS=${LAYERS:-10}; VOCAB=${VOCAB:-32000}; TP=${TP:-2}
scratch=; [ "${SCRATCH_NOSYNC:-0}" = 1 ] && scratch=--no-sync
THREE_STEPS=${THREE_STEPS:-1}
OTHER=${OTHER:-}
cold() { [ "${DROP_CACHES:-0}" != 1 ] || { sync; echo 3 > /proc/sys/vm/drop_caches; }; }
bin=$build/bin
work=$WORK; mkdir -p "$work"
tpl=$work/tpl; td=$work/td
if [ ! -f "$td/latest_checkpointed_iteration.txt" ]; then
  rm -rf "$work/src" "$tpl" "$td"
  /usr/bin/python3 "$root/tests/generator/gen_ds_checkpoint.py" --output "$work/src" --model llama --tp "$TP" --dp 1 \
    --layers "$LAYERS" --hidden "$HIDDEN" --heads "$HEADS" --kv-heads "$KV_HEADS" --ffn "$FFN" --vocab "$VOCAB" --no-truth
  "$bin/ucp-union" -q --input "$work/src" --output "$tpl" --to-names megatron-core
  "$bin/ucp-load" -q --input "$tpl" --output "$td" --format torch_dist --tp "$TP" --pp 1 --dp 1
  rm -rf "$work/src"
fi
iter=iter_$(printf %07d "$(cat "$td/latest_checkpointed_iteration.txt")")
in_bytes=$(du -sb "$td" | cut -f1)
echo "input: $td/$iter, $in_bytes bytes in $(find "$td" -type f | wc -l) files (Llama hidden $HIDDEN, $LAYERS layers, ffn $FFN, vocab $VOCAB, TP $TP)"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; load $(cut -d' ' -f1-3 /proc/loadavg); torch in chroot: $(chroot "$TRIXIE" python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
cat "$td"/*.txt "$td/$iter"/* >/dev/null; echo "input read once before the rounds (warm as far as the page cache holds it)"

# torch sees TD through a bind mount under the chroot's /lab
mnt=$TRIXIE/lab/$LAB
mkdir -p "$mnt"; mountpoint -q "$mnt" || mount --bind "$work" "$mnt"
trap 'umount "$mnt" 2>/dev/null; rmdir "$mnt" 2>/dev/null; true' EXIT

. "$root/bench/bench_lib.sh"  # room, measure, add, med
clean() { rm -rf "$work/mc2" "$work/dsu" "$work/out" "$work/out1" "$work/out1.other" "$work/base" "$work/latest_universal"; sync; }
out_bytes=$in_bytes  # until the first OUT is measured
# The timed runs of a round: the one pass, the one pass of build $OTHER, the baseline; their order
# rotates from round to round (a run right after another's 13 GB of writes finds the disk busier).
mine() {
  room "$in_bytes"; cold
  read -r s u k < <(measure "$bin/ucp-load" -q --input "$td" --template "$tpl" --output "$work/out1" --format deepspeed --tp "$TP" --pp 1 --dp 1)
  out_bytes=$(du -sb "$work/out1" | cut -f1)
  add s0 "$s" "$u" "$k"; echo "round $r one pass ucp-load --input TD --template TPL: $s s wall, $u s cpu, peak RSS $k KiB ($out_bytes bytes in $(find "$work/out1" -type f | wc -l) files)"
  # kept for the comparisons of round 1 (with build $OTHER's, run next, and with the three runs')
  [ "$r" = 1 ] && { [ -n "$OTHER" ] || [ "$THREE_STEPS" = 1 ]; } || { rm -rf "$work/out1"; sync; }
}
other() {  # the same one pass with another build (its bin/ and lib/)
  room "$in_bytes"; cold
  read -r s u k < <(measure env LD_LIBRARY_PATH="$OTHER/lib" "$OTHER/bin/ucp-load" -q --input "$td" --template "$tpl" --output "$work/out1.other" --format deepspeed --tp "$TP" --pp 1 --dp 1)
  add s0o "$s" "$u" "$k"; echo "round $r one pass, build $OTHER: $s s wall, $u s cpu, peak RSS $k KiB"
  if [ "$r" = 1 ]; then  # round 1 runs mine first
    diff -rq "$work/out1" "$work/out1.other" >/dev/null || { echo "round 1: the two builds' files DIFFER" >&2; diff -rq "$work/out1" "$work/out1.other" >&2 || true; exit 1; }
    echo "round 1: the two builds' files are equal byte for byte"
  fi
  rm -rf "$work/out1.other"; [ "$THREE_STEPS" = 1 ] && [ "$r" = 1 ] || rm -rf "$work/out1"; sync
}
baseline() {
  rm -rf "$work/base"; mkdir -p "$work/base"; sync; room "$out_bytes"; cold
  read -r s u k < <(measure sh -c "for f in '$td'/*.txt '$td/$iter'/*; do dd if=\"\$f\" of='$work/base'/\$(basename \"\$f\") bs=8M status=none || exit 1; done && sync -f '$work/base'")
  add base "$s" "$u" "$k"; echo "round $r baseline (dd every TD file into one folder, sync): $s s wall, $u s cpu ($in_bytes bytes written, OUT has $out_bytes)"
  rm -rf "$work/base"; sync
}
runs=(mine baseline); [ -z "$OTHER" ] || runs=(mine other baseline)
for r in $(seq "$rounds"); do
  clean
  for i in $(seq 0 $((${#runs[@]} - 1))); do "${runs[$(( (i + r - 1) % ${#runs[@]} ))]}"; done
  if [ "$THREE_STEPS" = 1 ]; then
  room $((3 * in_bytes))
  read -r s u k < <(measure "$bin/ucp-union" -q $scratch --input "$td" --output "$work/mc2")
  add s1 "$s" "$u" "$k"; echo "round $r step 1 ucp-union TD -> MC2: $s s wall, $u s cpu, peak RSS $k KiB ($(du -sb "$work/mc2" | cut -f1) bytes)"
  read -r s u k < <(measure "$bin/ucp-union" -q $scratch --input "$work/mc2" --output "$work/dsu" --to-names megatron-deepspeed --template "$tpl")
  add s2 "$s" "$u" "$k"; echo "round $r step 2 ucp-union --to-names megatron-deepspeed: $s s wall, $u s cpu, peak RSS $k KiB ($(du -sb "$work/dsu" | cut -f1) bytes)"
  rm -rf "$work/mc2"; sync
  read -r s u k < <(measure "$bin/ucp-load" -q --input "$work/dsu" --output "$work/out" --format deepspeed --tp "$TP" --pp 1 --dp 1)
  out_bytes=$(du -sb "$work/out" | cut -f1)
  add s3 "$s" "$u" "$k"; echo "round $r step 3 ucp-load --format deepspeed: $s s wall, $u s cpu, peak RSS $k KiB ($out_bytes bytes in $(find "$work/out" -type f | wc -l) files)"
  if [ "$r" = 1 ]; then
    if diff -rq "$work/out" "$work/out1" >/dev/null; then echo "round 1: the one pass's files equal the three runs' byte for byte"
    else echo "round 1: the one pass's files DIFFER from the three runs':" >&2; diff -rq "$work/out" "$work/out1" >&2 || true; exit 1; fi
  fi
  fi

  if [ "$r" -le "$TORCH_ROUNDS" ]; then
    clean; mkdir -p "$work/base"; room "$in_bytes"; cold
    /usr/bin/time -f "%e %U %S %M" -o "$work/time.txt" sh -c "chroot '$TRIXIE' /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root PYTHONWARNINGS=ignore \
      python3 -c 'from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(\"/lab/$LAB/td/$iter\", \"/lab/$LAB/base/model.pt\")' \
      && sync -f '$work/base/model.pt'" >/dev/null 2>"$work/err.txt" && rc=0 || rc=$?
    read -r s u k < <(awk '{printf "%s %.2f %s\n", $1, $2 + $3, $4}' "$work/time.txt" | tail -1)
    if [ $rc != 0 ]; then
      echo "round $r dcp_to_torch_save: FAILED (exit $rc) after $s s, peak RSS $k KiB: $(grep -v '^$' "$work/err.txt" | tail -2 | tr '\n' ' ')"
    else
      add torch "$s" "$u" "$k"; echo "round $r dcp_to_torch_save: $s s wall, $u s cpu, peak RSS $k KiB ($(stat -c %s "$work/base/model.pt") bytes)"
    fi
  fi
done
clean
declare -A T C M
for k in base s0 s0o s1 s2 s3 torch; do
  [ -n "${t[$k]:-}" ] || continue
  T[$k]=$(echo "${t[$k]}" | med); C[$k]=$(echo "${c[$k]}" | med); M[$k]=$(echo "${m[$k]}" | med)
done
ratio() { echo "scale=2; $1 / ${T[base]}" | bc; }
echo "medians over $rounds rounds (wall s, cpu user+sys s, peak RSS MiB, wall / baseline):"
echo "  baseline (read TD once, write OUT's bytes once, sync): ${T[base]} s, ${C[base]} s cpu, $((M[base] / 1024)) MiB"
echo "  one pass ucp-load --input TD --template TPL:   ${T[s0]} s, ${C[s0]} s cpu, $((M[s0] / 1024)) MiB (max $(( $(printf '%s\n' ${m[s0]} | sort -g | tail -1) / 1024 )) MiB), $(ratio "${T[s0]}")x (target 1.2x)"
[ -z "${T[s0o]:-}" ] || echo "  one pass, build $OTHER: ${T[s0o]} s, ${C[s0o]} s cpu, $((M[s0o] / 1024)) MiB, $(ratio "${T[s0o]}")x"
if [ -n "${T[torch]:-}" ]; then
  echo "  dcp_to_torch_save (torch 2.6, + sync):        ${T[torch]} s, ${C[torch]} s cpu, $((M[torch] / 1024)) MiB, $(ratio "${T[torch]}")x"
  echo "  dcp_to_torch_save / one pass: $(echo "scale=2; ${T[torch]} / ${T[s0]}" | bc)x time, $(echo "scale=1; ${M[torch]} / ${M[s0]}" | bc)x peak RSS"
fi
[ "$THREE_STEPS" = 1 ] || exit 0
# total per round (sum of the three steps), then its median; peak RSS of the pipeline = max of the steps
tot=$(paste -d' ' <(echo "${t[s1]}" | tr ' ' '\n' | grep .) <(echo "${t[s2]}" | tr ' ' '\n' | grep .) <(echo "${t[s3]}" | tr ' ' '\n' | grep .) | awk '{print $1 + $2 + $3}' | med)
ctot=$(paste -d' ' <(echo "${c[s1]}" | tr ' ' '\n' | grep .) <(echo "${c[s2]}" | tr ' ' '\n' | grep .) <(echo "${c[s3]}" | tr ' ' '\n' | grep .) | awk '{print $1 + $2 + $3}' | med)
mtot=$(printf '%s\n' ${m[s1]} ${m[s2]} ${m[s3]} | sort -g | tail -1)
echo "  step 1 ucp-union TD -> MC2:                   ${T[s1]} s, ${C[s1]} s cpu, $((M[s1] / 1024)) MiB, $(ratio "${T[s1]}")x"
echo "  step 2 ucp-union --to-names megatron-deepspeed: ${T[s2]} s, ${C[s2]} s cpu, $((M[s2] / 1024)) MiB, $(ratio "${T[s2]}")x"
echo "  step 3 ucp-load --format deepspeed:           ${T[s3]} s, ${C[s3]} s cpu, $((M[s3] / 1024)) MiB, $(ratio "${T[s3]}")x"
echo "  total (median of per-round sums):             $tot s, $ctot s cpu, max peak RSS $((mtot / 1024)) MiB, $(ratio "$tot")x (target 1.2x)"
if [ -n "${T[torch]:-}" ]; then
  echo "  dcp_to_torch_save (torch 2.6, + sync):        ${T[torch]} s, ${C[torch]} s cpu, $((M[torch] / 1024)) MiB, $(ratio "${T[torch]}")x"
  echo "  dcp_to_torch_save / our pipeline: $(echo "scale=2; ${T[torch]} / $tot" | bc)x time, $(echo "scale=1; ${M[torch]} / $mtot" | bc)x peak RSS"
fi
