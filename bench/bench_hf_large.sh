#!/usr/bin/env bash
# Issue 49's benchmark at scale (docs/hf.md "Benchmark"): a Qwen3-MoE-shaped Hugging Face folder larger than half of
# this machine's RAM (bench_hf_make.py qwen3moe: the real hidden size, heads, expert size and vocabulary; LAYERS
# layers of EXPERTS experts, fp32) imported into torch_dist at TP 2 x EP 4 x DP 4 and exported back, each against
# the floor "read the input once, write the output once" (every data byte of the input read, holes skipped; as
# many bytes written as the output holds on disk; sync -f), measured in the same run. Also: the import under
# `mpirun -np 2`, the peer a user would run (transformers' from_pretrained + save_pretrained of the folder;
# Megatron-Bridge does not run here: docs/hf.md), peak RSS of each, and the disk's bandwidth measured with fio
# (when installed) turned into the time of a 671B-parameter model.
# fp32 because of the disk: a bf16 save holds 3x its input (bf16 copy and fp32 master; the Adam moments are holes),
# an fp32 one 2x; the input, the save and the export back of a folder larger than half the RAM only fit in fp32,
# and only once the input is gone: its tensors' SHA-256 are recorded, the folder is deleted before the export
# (KEEP_INPUT=1 keeps it), and the export is compared with the digests. Each side runs ROUNDS (3) rounds, orders
# alternating: each step moves 27-41 GB.
# Usage: bench/bench_hf_large.sh [build_dir]   env: LAYERS (4), EXPERTS (144), ROUNDS (3), KEEP_INPUT, WORK
#        (/tmp/ucpkit-bench-hf-large)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
LAYERS=${LAYERS:-4}; EXPERTS=${EXPERTS:-144}
work=${WORK:-/tmp/ucpkit-bench-hf-large}
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
. "$root/bench/bench_lib.sh"
mkdir -p "$work"
hf=$work/qwen3moe-l$LAYERS-e$EXPERTS-fp32
layout=(--tp 2 --ep 4 --dp 4)
rm -rf "$work/td" "$work/back" "$work/peer_out"
if [ ! -f "$hf/model.safetensors.index.json" ]; then  # made beside, then renamed: a maker killed (memory) leaves no input
  rm -rf "$hf" "$hf.making" "$hf.sha256"
  room $((3 * 4 * (LAYERS * EXPERTS * 3 * 2048 * 768 + 2 * 151936 * 2048)))  # the input, then a save of 2x beside it
  PYTHONWARNINGS=ignore "$FRAMEWORKS_PY" "$root/bench/bench_hf_make.py" "$hf.making" qwen3moe "$LAYERS" "$EXPERTS" fp32 2>/dev/null
  mv "$hf.making" "$hf"
fi
bytes() { du -sb "$1" | cut -f1; }       # length
on_disk() { du -s -B1 "$1" | cut -f1; }  # bytes written (holes left out)
digests() {  # digests DIR: "name sha256" of every tensor's bytes, sorted
  "$FRAMEWORKS_PY" - "$1" <<'PY'
import glob, hashlib, sys, torch
from safetensors import safe_open
out = []
for f in sorted(glob.glob(f"{sys.argv[1]}/*.safetensors")):
    with safe_open(f, "pt") as s:
        for k in s.keys():
            out.append(f"{k} {hashlib.sha256(s.get_tensor(k).contiguous().view(torch.uint8).numpy()).hexdigest()}")
print("\n".join(sorted(out)))
PY
}
in_bytes=$(bytes "$hf")
ram=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
echo "input: $hf, $in_bytes bytes in $(ls "$hf" | wc -l) files; RAM $ram bytes: the input is $(awk -v a="$in_bytes" -v b="$ram" 'BEGIN {printf "%.2f", 2 * a / b}')x half of it"
[ -f "$hf.sha256" ] || digests "$hf" > "$hf.sha256"
if command -v fio > /dev/null; then  # sequential, O_DIRECT, 1 MiB blocks, 16 in flight: the disk, not the page cache
  fio_bw() { fio --name=bw --filename="$work/fio.bin" --rw="$1" --bs=1M --size=4G --direct=1 --ioengine=libaio --iodepth=16 \
               --output-format=terse --terse-version=3 | awk -F';' -v rw="$1" '{print (rw == "read" ? $7 : $48) * 1024}'; }
  disk_w=$(fio_bw write); disk_r=$(fio_bw read); rm -f "$work/fio.bin"
  echo "fio $(fio --version): sequential write $disk_w B/s, read $disk_r B/s"
fi

# The import side in ROUNDS rounds, orders alternating (this VM's page-cache writes swing 1.5x within minutes); the last
# round's two-process save is kept for the export.
import1() { add import $(measure "$build/bin/ucp-load" -q --input "$hf" --format torch_dist "${layout[@]}" --output "$work/td"); }
import2() {
  add import_np2 $(measure env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --allow-run-as-root \
    --oversubscribe -np 2 "$build/bin/ucp-load" -q --input "$hf" --format torch_dist "${layout[@]}" --output "$work/td")
}
import1
td_len=$(bytes "$work/td"); td_data=$(on_disk "$work/td")
echo "import: the save is $td_len bytes long, $td_data on disk"
rm -rf "$work/td"
# The peer (before the rounds: the last one keeps a save on disk), under GNU time without measure(): killed (out of
# memory) it is reported with the figures it reached.
peer_status=done
room $((2 * in_bytes))
/usr/bin/time -f "%e %U %S %M" -o "$work/time.txt" env PYTHONWARNINGS=ignore "$FRAMEWORKS_PY" -c 'import sys, torch
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).save_pretrained(sys.argv[2], max_shard_size="1GB")' \
    "$hf" "$work/peer_out" > /dev/null 2> "$work/err.txt" || peer_status="failed: $(grep -v '^ *[0-9.]* [0-9.]* [0-9.]* [0-9]*$' "$work/time.txt" | head -1)"
add peer $(awk 'NF == 4 {printf "%s %.2f %s\n", $1, $2 + $3, $4}' "$work/time.txt")
echo "peer (transformers from_pretrained + save_pretrained): $peer_status"
rm -rf "$work/peer_out"
import_floor() { add import_floor $(measure bash -c "$(declare -f floor_data); floor_data '$hf' $td_data '$work/floor.bin'"); }
for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
  if ((r % 2)); then steps="import_floor import2"; else steps="import2 import_floor import1"; fi
  ((r == 1)) || [[ $steps == import2* ]] || steps="import1 $steps"
  for s in $steps; do
    "$s"
    [[ $s == import2 && $r == "${ROUNDS:-3}" ]] || rm -rf "$work/td"
  done
  echo "round $r: import ${t[import]}/ np2 ${t[import_np2]}/ floor ${t[import_floor]}" | tr -s ' '
done
[[ -d $work/td ]] || import2
[ -n "${KEEP_INPUT:-}" ] || rm -rf "$hf"
export1() { add export $(measure "$build/bin/ucp-load" -q --input "$work/td" --format hf --output "$work/back"); }
export1
back_bytes=$(bytes "$work/back")
if cmp -s "$hf.sha256" <(digests "$work/back"); then same="every tensor's bytes equal to the input's (SHA-256)"; else same="DIFFERENT from the input"; fi
echo "round trip: $(wc -l < "$hf.sha256") tensors, $same"
rm -rf "$work/back"
export_floor() { add export_floor $(measure bash -c "$(declare -f floor_data); floor_data '$work/td' $back_bytes '$work/floor.bin'"); }
for ((r = 1; r <= ${ROUNDS:-3}; r++)); do  # the export side in rounds too, orders alternating
  if ((r % 2)); then steps="export_floor"; else steps="export1 export_floor"; fi
  ((r == 1)) || ((r % 2 == 0)) || steps="export_floor export1"
  for s in $steps; do "$s"; rm -rf "$work/back"; done
done
rm -rf "$work/td"

printf "%-13s %9s %9s %11s   %s\n" step wall_s cpu_s peak_rss_MB "(medians; every round's wall_s)"
for k in import import_np2 import_floor export export_floor peer; do
  printf "%-13s %9s %9s %11.0f   %s\n" "$k" "$(med <<< "${t[$k]}")" "$(med <<< "${c[$k]}")" "$(awk -v x="$(med <<< "${m[$k]}")" 'BEGIN{print x/1024}')" "${t[$k]}"
done
awk -v a="$(med <<< "${t[import]}")" -v b="$(med <<< "${t[import_floor]}")" -v n="$(med <<< "${t[import_np2]}")" \
    -v c="$(med <<< "${t[export]}")" -v d="$(med <<< "${t[export_floor]}")" -v p="${t[peer]}" -v ps="$peer_status" 'BEGIN { printf "import / floor %.2f, mpirun -np 2 / one process %.2f, export / floor %.2f, export / transformers round trip %s\n",
                               a / b, n / a, c / d, (ps == "done" ? sprintf("%.2f", c / p) : "(" ps ")") }'
# 671B parameters in bf16: the import reads 1.342 TB and writes 4.026 TB (bf16 copy and fp32 master), the export reads
# the 2.684 TB of fp32 masters and writes 1.342 TB; at the disk's fio rates, and at this run's rates of bytes moved.
awk -v ir="$in_bytes" -v iw="$td_data" -v it="$(med <<< "${t[import]}")" -v er=$((in_bytes)) -v ew="$back_bytes" -v et="$(med <<< "${t[export]}")" \
    -v w="${disk_w:-0}" -v r="${disk_r:-0}" 'BEGIN {
  n = 671e9; printf "671B extrapolated: import %.0f min at this run'"'"'s rate", (2 * n + 6 * n) / ((ir + iw) / it) / 60
  if (w > 0) printf ", %.0f min at fio'"'"'s", (2 * n / r + 6 * n / w) / 60
  printf "; export %.0f min at this run'"'"'s rate", (4 * n + 2 * n) / ((er + ew) / et) / 60
  if (w > 0) printf ", %.0f min at fio'"'"'s", (4 * n / r + 2 * n / w) / 60
  printf "\n" }'
