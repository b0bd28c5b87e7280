#!/usr/bin/env bash
# PEC benchmark: a generated native DeepSpeed MoE checkpoint shaped like GPT-350M-16E (24 layers,
# 12 MoE layers, 16 experts, EP 4, DP 4, bf16 + ZeRO-1) at reduced width (hidden 256, ffn 1024,
# vocabulary 12288 so that embeddings keep their share of the non-expert part). Measures:
#   * store size of one save with K = 1, 2, 4 versus the full checkpoint, versus the formula
#     C_pec/C_full, and versus the paper's 42.3% for K = 1;
#   * pec-save throughput (RUNS times per K) versus a plain copy (cat + fsync) of exactly the same number of selected
#     bytes ("same"), and versus copying the selected files whole ("files": non-expert files incl.
#     whole optimizer shards + the selected expert files, what a file-level partial save would write);
#   * pec-restore time and peak RSS (RUNS times, default 3, --memory-mb MEMORY_MB, default 256) versus
#     reading + writing the same checkpoint in the same run (cat of every file into a fresh folder, then
#     sync -f), and that the restored files equal the source;
#   * two tiers: fast-tier size after several saves (--k-snapshot 2 into FAST_DIR, --k-persist 1 into
#     the durable store) versus the non-expert state and the full checkpoint.
# Usage: bench/bench_pec.sh [build_dir] [work_dir]
#   env: HIDDEN, FFN, VOCAB (4x larger: HIDDEN=512 FFN=2048 VOCAB=24576), ZSTD_LEVEL, FAST_DIR, RUNS, KS (K values
#        of the size section, default "1 2 4"),
#        MEMORY_MB, SECTIONS (any of "size restore tiers"; default all three)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
work=${2:-/tmp/ucpkit-bench-pec}
bin=$build/bin
py=/usr/bin/python3
hidden=${HIDDEN:-256}
ffn=${FFN:-1024}
vocab=${VOCAB:-12288}
level=${ZSTD_LEVEL:-3}
runs=${RUNS:-3}
memory_mb=${MEMORY_MB:-256}
sections=${SECTIONS:-size restore tiers}
has() { [[ " $sections " == *" $1 "* ]]; }
mkdir -p "$work"
ckpt=$work/ckpt
if [ ! -f "$ckpt/latest" ]; then
  echo "generating checkpoint (hidden $hidden, ffn $ffn, vocab $vocab) ..." >&2
  $py "$root/tests/generator/gen_ds_checkpoint.py" --output "$ckpt" --model dsmoe --layers 24 --experts 16 \
    --hidden "$hidden" --heads 8 --ffn "$ffn" --vocab "$vocab" --seq 512 --dp 4 --ep 4 --zero 1 \
    --dtype bf16 --step 1000 --seed 7 --no-truth >&2
fi
step_dir=$ckpt/$(cat "$ckpt/latest")
full_bytes=$(du -sb "$step_dir" | cut -f1)
now() { date +%s.%N; }
echo "checkpoint: $step_dir, $full_bytes bytes; load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
echo
if has size; then
printf "%-3s %-3s %12s %12s %8s %8s %9s %9s %7s %9s %7s %9s %7s %9s %6s %5s\n" K run logical_B stored_B logical% stored% formula% paper_K1% save_s save_MB/s same_s same_MB/s files_s files_MB/s save/same load
for k in ${KS:-1 2 4}; do
for run in $(seq 1 "$runs"); do
  store=$work/store_k$k
  load=$(cut -d' ' -f1 /proc/loadavg)
  rm -rf "$store" "$work/copy"
  sync
  t0=$(now)
  "$bin/pec-save" --checkpoint "$ckpt" --store "$store" --step 1000 --policy sequential --k "$k" \
    --no-bootstrap --zstd-level "$level" --json -q > "$work/save_k$k.json"
  t1=$(now)
  # Plain copy of the same selection: non-expert files whole (optimizer shards included) plus the
  # selected experts' files, each fsynced, as a checkpoint writer without PEC's cut would do.
  files=$($py - "$work/save_k$k.json" "$step_dir" <<'PY'
import json, os, re, sys
s = json.load(open(sys.argv[1])); d = sys.argv[2]
sel = s["tiers"][0]["selection"]
out = []
for n in sorted(os.listdir(d)):
    m = re.match(r"layer_(\d+)_expert_(\d+)_", n)
    if m and int(m.group(2)) not in sel[int(m.group(1))]:
        continue
    out.append(os.path.join(d, n))
print("\n".join(out))
PY
)
  mkdir -p "$work/copy"
  t2=$(now)
  while read -r f; do cat "$f" > "$work/copy/$(basename "$f")"; done <<< "$files"
  sync -f "$work/copy"
  t3=$(now)
  copy_bytes=$(du -sb "$work/copy" | cut -f1)
  rm -rf "$work/copy"
  # Plain copy of exactly the bytes pec-save selected (bytes_logical), from the same files.
  logical=$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['tiers'][0]['stats']['bytes_logical'])" "$work/save_k$k.json")
  t4=$(now)
  (set +o pipefail; while read -r f; do cat "$f" 2>/dev/null || break; done <<< "$files" | head -c "$logical" > "$work/same.bin")
  sync -f "$work/same.bin"
  t5=$(now)
  rm -f "$work/same.bin"
  $py - "$work/save_k$k.json" "$k" "$t0" "$t1" "$t2" "$t3" "$copy_bytes" "$t4" "$t5" "$run" "$load" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); k = int(sys.argv[2])
t0, t1, t2, t3 = map(float, sys.argv[3:7]); copy_bytes = int(sys.argv[7]); t4, t5 = map(float, sys.argv[8:10])
st = s["tiers"][0]["stats"]
save_s = t1 - t0; copy_s = t3 - t2; same_s = t5 - t4; lb = st['bytes_logical']
print(f"{k:<3d} {sys.argv[10]:<3s} {lb:12d} {st['bytes_stored']:12d} {100*st['ratio_logical_vs_full']:8.2f} "
      f"{100*st['ratio_stored_vs_full']:8.2f} {100*st['ratio_formula']:9.2f} {42.3 if k == 1 else float('nan'):9.1f} "
      f"{save_s:7.2f} {lb/save_s/1e6:9.1f} {same_s:7.2f} {lb/same_s/1e6:9.1f} {copy_s:7.2f} {copy_bytes/copy_s/1e6:9.1f} "
      f"{save_s/same_s:6.2f} {sys.argv[11]:>5s}")
PY
done
done
rm -rf "$work/copy"
echo
fi

# Restore: a chain of two saves (full first save, then K=1) rebuilt into a normal checkpoint, RUNS
# times; each run also copies the same checkpoint (cat of every file into a fresh folder + sync -f).
if has restore; then
store=$work/store_chain
rm -rf "$store" "$work/restored" "$work/plain"
"$bin/pec-save" --checkpoint "$ckpt" --store "$store" --step 1000 --policy sequential --k 1 --zstd-level "$level" -q
"$bin/pec-save" --checkpoint "$ckpt" --store "$store" --step 1001 --policy sequential --k 1 --zstd-level "$level" -q
echo "store: $(du -sb "$store" | cut -f1) bytes; restore --memory-mb $memory_mb"
printf "%-4s %10s %9s %12s %11s %9s %8s %s\n" run restore_s MB/s peak_RSS_MiB cat+fsync_s MB/s ratio load
for run in $(seq 1 "$runs"); do
  rm -rf "$work/restored" "$work/plain"
  sync
  load=$(cut -d' ' -f1 /proc/loadavg)
  t0=$(now)
  /usr/bin/time -f "%M" -o "$work/restore.rss" "$bin/pec-restore" --store "$store" --output "$work/restored" \
    --memory-mb "$memory_mb" --json -q > "$work/restore.json" 2>"$work/restore.err"
  t1=$(now)
  mkdir -p "$work/plain"
  t2=$(now)
  for f in "$step_dir"/*; do cat "$f" > "$work/plain/$(basename "$f")"; done
  sync -f "$work/plain"
  t3=$(now)
  rb=$(du -sb "$work/restored/global_step1001" | cut -f1)
  $py - "$run" "$t0" "$t1" "$t2" "$t3" "$rb" "$(tail -1 "$work/restore.rss")" "$load" <<'PY'
import sys
run = sys.argv[1]; t0, t1, t2, t3 = map(float, sys.argv[2:6]); rb = int(sys.argv[6]); rss = int(sys.argv[7])
r, c = t1 - t0, t3 - t2
print(f"{run:<4s} {r:10.2f} {rb/r/1e6:9.0f} {rss/1024:12.0f} {c:11.2f} {rb/c/1e6:9.0f} {r/c:8.2f} {sys.argv[8]}")
PY
  if [ "$run" = 1 ]; then
    same=yes
    for f in "$step_dir"/*; do cmp -s "$f" "$work/restored/global_step1001/$(basename "$f")" || same=no; done
    echo "     restored files identical to the source checkpoint: $same ($rb bytes)"
  fi
done
rm -rf "$work/restored" "$work/plain" "$store"
echo
fi
if has tiers; then
# Two tiers: four saves of the checkpoint (as steps 2000..2003), K_persist 1, K_snapshot 2.
fast=${FAST_DIR:-/dev/shm/ucpkit-bench-pec-fast}
store=$work/store_tiers
rm -rf "$store" "$fast"
for s in 2000 2001 2002 2003; do
  "$bin/pec-save" --checkpoint "$ckpt" --store "$store" --fast-store "$fast" --step $s --policy sequential \
    --k-persist 1 --k-snapshot 2 --zstd-level "$level" --json -q > "$work/tiers_$s.json"
  echo "after step $s: fast tier $(du -sb "$fast" | cut -f1) bytes, durable $(du -sb "$store" | cut -f1) bytes"
done
$py - "$work/tiers_2003.json" "$full_bytes" "$(du -sb "$fast" | cut -f1)" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); full = int(sys.argv[2]); fast = int(sys.argv[3])
ne = s["non_expert_bytes"]; fstats = [t for t in s["tiers"] if t["tier"] == "fast"][0]["stats"]
print(f"fast tier: {fast} bytes = {100*fast/full:.1f}% of the full checkpoint; non-expert state {ne} bytes "
      f"(its last save stored {fstats['bytes_stored']} bytes incl. {fstats['experts_saved']} experts)")
PY
rm -rf "$fast"
fi
