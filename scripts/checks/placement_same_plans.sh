#!/usr/bin/env bash
# Before/after check for moe-replace performance work (issue 31): the plans of two builds on the
# scale cases must be byte-identical. 64 layers x 256 experts (bench/bench_placement.sh's CLI loads:
# w0, then w1 = w0 drifted), 8 GPUs x 4 slots:
#   * every algorithm at 128 and 1,024 nodes; balanced-ft and lazarus with f = 2;
#   * --previous at 128 and 1,024 nodes: f = 1, f = 2, --migration-weight 0.5 and 1, a byte budget;
#   * node loss (--current --failed-nodes) at both sizes;
#   * the heavy-tailed loads (--shape heavy: Pareto, a few dominant experts): every algorithm at 128 and
#     1,024 nodes, --previous with weights 0 and 1 and node loss at 1,024 nodes;
#   * the SmartMoE loads and the EPLB example from ../shared/data, when present.
# The previous plans are placed once, by NEW_BUILD, and read by both. One core each; about 6 minutes
# (379fcc6's hecate takes 15 s a run on the heavy-tailed loads at 1,024 nodes).
# With ALLOW_FROM_SCRATCH_REPORT=1 a plan that differs only in the re-placement's from-scratch comparison
# ("from_scratch", "from_scratch_skipped": what was placed for the report, not the plan) counts as identical.
# Usage: scripts/checks/placement_same_plans.sh OLD_BUILD NEW_BUILD [WORK]   (exit 0: identical; 1: a difference)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 OLD_BUILD NEW_BUILD [WORK]" >&2; exit 2; }
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
work=${3:-$(mktemp -d /tmp/ucpkit-plans.XXXXXX)}
mkdir -p "$work"
data=$root/../shared/data
one_core=(taskset -c 0)
command -v taskset >/dev/null || one_core=()
python3 "$root/bench/placement_scale_loads.py" "$work/w0.json" "$work/w1.json"
python3 "$root/bench/placement_scale_loads.py" --shape heavy "$work/h0.json" "$work/h1.json"
# The binaries' RUNPATH names the tree they were linked in: each build runs with its own library.
tool() { local b=$1; shift; LD_LIBRARY_PATH="$b/lib" "${one_core[@]}" "$b/bin/moe-replace" "$@"; }
for n in 128 1024; do
  for f in 1 2; do
    tool "$new" --input "$work/w0.json" --nodes $n --gpus-per-node 8 --slots-per-gpu 4 --survive-node-failures $f \
      --output "$work/plan${n}f$f.json" -q || { echo "placing the previous plan failed" >&2; exit 1; }
  done
done
tool "$new" --input "$work/h0.json" --nodes 1024 --gpus-per-node 8 --slots-per-gpu 4 --survive-node-failures 1 \
  --output "$work/heavy1024.json" -q || { echo "placing the previous plan failed" >&2; exit 1; }
differ=0
case_() {  # name, then the arguments
  local name=$1; shift
  tool "$old" "$@" --output "$work/old.json" -q >/dev/null 2>"$work/old.err"; local ro=$?
  tool "$new" "$@" --output "$work/new.json" -q >/dev/null 2>"$work/new.err"; local rn=$?
  if [[ $ro != "$rn" ]]; then
    echo "DIFFER $name: exit $ro (old) against $rn (new)"; differ=1
  elif [[ $ro != 0 ]]; then
    echo "FAILED $name: both exit $ro ($(head -1 "$work/new.err"))"; differ=1
  elif cmp -s "$work/old.json" "$work/new.json"; then
    echo "identical $name"
  elif [[ -n ${ALLOW_FROM_SCRATCH_REPORT:-} ]] && python3 - "$work/old.json" "$work/new.json" <<'PY'
import sys
# Everything but the re-placement's from-scratch comparison ("from_scratch" and "from_scratch_skipped",
# written just before "layers_from_scratch"): equal bytes.
def cut(path):
    d = open(path, "rb").read()
    i, j = d.find(b'"from_scratch":'), d.find(b'"layers_from_scratch":')
    return (d[:i], d[j:]) if 0 <= i < j else (d, b"")
sys.exit(0 if cut(sys.argv[1]) == cut(sys.argv[2]) else 1)
PY
  then
    echo "identical $name (but for the from-scratch comparison report)"
  else
    echo "DIFFER $name"; differ=1
  fi
  rm -f "$work/old.json" "$work/new.json"
}
w0=$work/w0.json w1=$work/w1.json
for n in 128 1024; do
  for a in balanced-ft lazarus eplb eplb-global spread compact hecate; do
    case_ "$a $n nodes" --input "$w0" --nodes $n --gpus-per-node 8 --slots-per-gpu 4 --algorithm $a
  done
  for a in balanced-ft lazarus; do
    case_ "$a $n nodes f=2" --input "$w0" --nodes $n --gpus-per-node 8 --slots-per-gpu 4 --survive-node-failures 2 --algorithm $a
  done
  p=$work/plan${n}f1.json
  case_ "--previous $n nodes" --input "$w1" --previous "$p"
  case_ "--previous $n nodes f=2" --input "$w1" --previous "$work/plan${n}f2.json"
  case_ "--previous $n nodes weight 0.5" --input "$w1" --previous "$p" --migration-weight 0.5
  case_ "--previous $n nodes weight 1" --input "$w1" --previous "$p" --migration-weight 1
  case_ "--previous $n nodes budget" --input "$w1" --previous "$p" --max-moved-bytes 20G --expert-bytes 1M
  case_ "node loss $n nodes" --input "$w0" --current "$p" --failed-nodes 0,3
  case_ "node loss $n nodes weight 0.5" --input "$w0" --current "$p" --failed-nodes 0 --migration-weight 0.5
done
h0=$work/h0.json h1=$work/h1.json
for n in 128 1024; do
  for a in balanced-ft lazarus eplb eplb-global spread compact hecate; do
    case_ "heavy-tailed $a $n nodes" --input "$h0" --nodes $n --gpus-per-node 8 --slots-per-gpu 4 --algorithm $a
  done
done
case_ "heavy-tailed --previous 1024 nodes" --input "$h1" --previous "$work/heavy1024.json"
case_ "heavy-tailed --previous 1024 nodes weight 1" --input "$h1" --previous "$work/heavy1024.json" --migration-weight 1
case_ "heavy-tailed node loss 1024 nodes weight 0.5" --input "$h0" --current "$work/heavy1024.json" --failed-nodes 0 --migration-weight 0.5
if [[ -f "$data/smartmoe_expert_loads.json" ]]; then
  case_ "SmartMoE 8x4x4 f=2" --input "$data/smartmoe_expert_loads.json" --nodes 8 --gpus-per-node 4 --slots-per-gpu 4 --survive-node-failures 2
  case_ "EPLB example 2x4x4" --input "$data/eplb_example.json" --nodes 2 --gpus-per-node 4 --slots-per-gpu 4
fi
[[ $# -ge 3 ]] || rm -rf "$work"
exit $differ
