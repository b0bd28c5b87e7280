#!/usr/bin/env bash
# Two builds side by side in one run (a refactor's "unchanged or better", issue 29): the same inputs
# through ucp-union, ucp-load (files mode, and direct mode from the native checkpoint), pec-save and
# pec-restore with the tools of OLD and NEW, alternated round by round (this machine is shared and
# noisy: only ratios measured in the same run mean something). Prints per step the median wall time,
# user+system CPU and peak RSS of each build and the NEW/OLD ratios; outputs are also compared byte
# for byte (SHA-256 of every file of the last round: a refactor must not change them).
# Usage: bench/bench_builds.sh OLD_BUILD NEW_BUILD [WORK]   (env: HIDDEN, LAYERS, ROUNDS; MOE_HIDDEN, MOE_LAYERS:
#        the native MoE input of the PEC steps (256, 4: steps of 0.1 s on a fast machine, below /usr/bin/time's
#        10 ms resolution for a 5% bound; 768, 4 gives about 1 s); STEPS: a subset of the steps; FLAGS: extra options
#        of the ucp-union, ucp-load and direct steps, e.g. FLAGS=--no-verify to leave out checks one build
#        does and the other does not, such as round 4's master-image check against a build before it;
#        PY: the Python with torch that writes the inputs; DROP_CACHES=1 (root): the page cache dropped before each
#        timed step, so that no step pays for reclaiming the memory an earlier step filled (with WORK on a tmpfs such as
#        /dev/shm the inputs and outputs stay in memory and the steps are timed without the disk); WARM_MEMORY=MB: that
#        much memory written to a tmpfs file and freed just before each timed step (on this VM memory freed a while ago
#        is returned to the host, and the step that takes it back first pays 3-4x in system time: the first build of
#        each pair, whichever it is, docs/notes/formats-refactor.md); INSTRUCTIONS=1: each step of the first round also runs under valgrind's callgrind, and a second
#        table gives the instructions each build executed: repeatable on a shared, noisy machine, where
#        wall and CPU medians cannot resolve a few percent)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
work=${3:-/tmp/ucpkit-bench-builds}
HIDDEN=${HIDDEN:-1024}; LAYERS=${LAYERS:-8}; ROUNDS=${ROUNDS:-3}; FLAGS=${FLAGS:-}; INSTRUCTIONS=${INSTRUCTIONS:-0}
DROP_CACHES=${DROP_CACHES:-0} WARM_MEMORY=${WARM_MEMORY:-0}
MOE_HIDDEN=${MOE_HIDDEN:-256}; MOE_LAYERS=${MOE_LAYERS:-4}; STEPS=${STEPS:-union load direct pecsave pecrestore}
py=${PY:-/usr/bin/python3}
mkdir -p "$work"
gpt=$work/gpt-h$HIDDEN-l$LAYERS moe=$work/moe-h$MOE_HIDDEN-l$MOE_LAYERS
case " $STEPS " in *" union "*|*" load "*|*" direct "*) [ -f "$gpt/latest" ] || $py "$root/tests/generator/gen_ds_checkpoint.py" --output "$gpt" --model gpt --tp 2 --pp 2 \
  --dp 2 --zero 1 --dtype bf16 --layers "$LAYERS" --hidden "$HIDDEN" --heads 16 --ffn $((4 * HIDDEN)) --vocab 50257 \
  --seq 64 --no-truth > /dev/null ;; esac
[ -f "$moe/latest" ] || $py "$root/tests/generator/gen_ds_checkpoint.py" --output "$moe" --model dsmoe --dp 4 --ep 2 \
  --layers "$MOE_LAYERS" --hidden "$MOE_HIDDEN" --ffn $((4 * MOE_HIDDEN)) --experts 8 --no-truth > /dev/null
echo "inputs: $(du -sh "$gpt" 2>/dev/null | cut -f1) GPT (TP 2 PP 2 DP 2, hidden $HIDDEN, $LAYERS layers), $(du -sh "$moe" | cut -f1) native MoE"

# step NAME BUILD TAG: runs one step with BUILD's tools into $work/out/TAG/NAME; appends
# "NAME TAG wall cpu rss_kib" to $work/times.
step() {
  local name=$1 b=$2 tag=$3 o=$work/out/$3 t
  local -x LD_LIBRARY_PATH=$b/lib
  mkdir -p "$o"; rm -rf "$o/$name"
  case $name in
    union) set -- "$b/bin/ucp-union" -q $FLAGS --input "$gpt" --output "$o/union" ;;
    load) set -- "$b/bin/ucp-load" -q $FLAGS --input "$o/union" --output "$o/load" --tp 1 --pp 1 --dp 4 --zero-stage 2 ;;
    direct) set -- "$b/bin/ucp-load" -q $FLAGS --input "$gpt" --output "$o/direct" --tp 1 --pp 2 --dp 2 --zero-stage 1 --vocab-multiple 16 ;;
    pecsave) rm -rf "$o/pecstore"; set -- "$b/bin/pec-save" -q --checkpoint "$moe" --store "$o/pecstore" --step 100 \
               --policy sequential --k 2 ;;
    pecrestore) set -- "$b/bin/pec-restore" -q --store "$o/pecstore" --output "$o/pecrestore" ;;
  esac
  [ "$name" = pecrestore ] && rm -rf "$o/pecrestore"
  mkdir -p "$work/log/$tag"
  if [ "$INSTRUCTIONS" = 1 ] && [ "$round" = 1 ]; then  # once more under callgrind: the instructions executed (repeatable)
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" > /dev/null 2> "$work/log/$tag/$name.cg" || {
      echo "$tag $name failed under valgrind: $(tail -3 "$work/log/$tag/$name.cg")" >&2; exit 1; }
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$work/log/$tag/$name.cg" | head -1 | sed "s/^/$name $tag /" >> "$work/instructions"
    [ "$name" = pecrestore ] && rm -rf "$o/pecrestore"
    [ "$name" = pecsave ] && rm -rf "$o/pecstore"
    rm -rf "${o:?}/$name"
  fi
  sync  # the previous step's dirty pages written first: no step pays for another's write-back
  if [ "$DROP_CACHES" = 1 ]; then echo 3 > /proc/sys/vm/drop_caches; fi
  if [ "$WARM_MEMORY" -gt 0 ]; then  # memory the step will take, faulted in and freed just before it
    head -c "${WARM_MEMORY}M" /dev/zero > /dev/shm/ucpkit-bench-warm && rm -f /dev/shm/ucpkit-bench-warm
  fi
  /usr/bin/time -f '%e %U %S %M' -o "$work/log/$tag/$name.time" "$@" > /dev/null 2> "$work/log/$tag/$name.err" || {
    echo "$tag $name failed: $(cat "$work/log/$tag/$name.err")" >&2; exit 1; }
  t=$(tail -1 "$work/log/$tag/$name.time")
  awk -v n="$name" -v g="$tag" '{printf "%s %s %s %.2f %s %.2f\n", n, g, $1, $2 + $3, $4, $2}' <<< "$t" >> "$work/times"
  # The outputs are compared by digest and leave the page cache as soon as no step reads them: the build that
  # runs second in a pair must find the memory as the first found it, not reclaim the first's output.
  if [ "$round" = "$ROUNDS" ]; then
    local out_dir=$o/$name; [ "$name" = pecsave ] && out_dir=$o/pecstore
    mkdir -p "$work/digest/$tag"
    (cd "$out_dir" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum) > "$work/digest/$tag/$name"
  fi
  case $name in load|direct|pecrestore) rm -rf "${o:?}/$name" ;; esac
}

rm -rf "$work/times" "$work/instructions" "$work/out" "$work/log" "$work/digest"
for r in $(seq "$ROUNDS"); do
  round=$r
  for s in $STEPS; do
    if [ $((r % 2)) -eq 1 ]; then step $s "$old" old; step $s "$new" new; else step $s "$new" new; step $s "$old" old; fi
    case $s in load) rm -rf "$work"/out/*/union ;; pecrestore) rm -rf "$work"/out/*/pecstore ;; esac  # both read
  done
done
diff -r "$work/digest/old" "$work/digest/new" > "$work/diff.txt" 2>&1 && same="identical" || same="DIFFERENT (see $work/diff.txt)"
$py - "$work/times" "$ROUNDS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
print(f"median of {sys.argv[2]} rounds, OLD and NEW alternated (NEW/OLD < 1: NEW faster or smaller)")
print("cpu: user + system; user: the tools' own code (system time is the kernel's page-cache and disk work,")
print("the same bytes in both builds, and swings 2-3x between rounds on a shared VM)")
print(f"{'step':<11} {'wall old':>9} {'wall new':>9} {'ratio':>6} {'cpu old':>8} {'cpu new':>8} {'ratio':>6} "
      f"{'user old':>9} {'user new':>9} {'ratio':>6} {'rss old':>9} {'rss new':>9} {'ratio':>6}")
for step in dict.fromkeys(r[0] for r in rows):
    m = {g: [statistics.median(float(r[i]) for r in rows if r[0] == step and r[1] == g) for i in (2, 3, 4, 5)]
         for g in ("old", "new")}
    o, n = m["old"], m["new"]
    print(f"{step:<11} {o[0]:>8.2f}s {n[0]:>8.2f}s {n[0]/o[0]:>6.2f} {o[1]:>7.2f}s {n[1]:>7.2f}s {n[1]/max(o[1],1e-9):>6.2f}"
          f" {o[3]:>8.2f}s {n[3]:>8.2f}s {n[3]/max(o[3],1e-9):>6.2f}"
          f" {o[2]/1024:>7.0f}MB {n[2]/1024:>7.0f}MB {n[2]/o[2]:>6.2f}")
PY
if [ -s "$work/instructions" ]; then
  echo "instructions executed (valgrind --tool=callgrind, round 1)"
  # The counts are printed as read (mawk's printf clamps numbers past 2^31 - 1).
  awk '{n[$1 " " $2] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
       END { printf "%-11s %15s %15s %7s\n", "step", "old", "new", "ratio";
             for (i = 1; i <= k; i++) { s = order[i]; printf "%-11s %15s %15s %7.4f\n", s, n[s " old"], n[s " new"], n[s " new"] / n[s " old"] } }' \
      "$work/instructions"
fi
echo "outputs of the last round: $same"
