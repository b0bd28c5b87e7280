#!/usr/bin/env bash
# moe-replace benchmark: planning time on one core (64 layers x 256 experts, 128 nodes x 8 GPUs x 4
# slots, metrics with 1e5 Monte Carlo samples), its growth with nodes and experts, end-to-end CLI
# time, and plan quality of every algorithm on the SmartMoE loads for the same slot budget.
# Usage: scripts/bench_placement.sh [build_dir]   (needs bench_placement and moe-replace built)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
bench="$build/bin/bench_placement"
tool="$build/bin/moe-replace"
data="$root/../shared/data"
one_core=(taskset -c 0)
command -v taskset >/dev/null || one_core=()

for exe in "$bench" "$tool"; do
  [[ -x "$exe" ]] || { echo "missing $exe (ninja -C $build bench_placement moe-replace)" >&2; exit 1; }
done

echo "== target: 64 layers x 256 experts, 128 nodes x 8 GPUs x 4 slots, f=2 (CPU seconds, one core)"
for algo in lazarus eplb spread; do "${one_core[@]}" "$bench" speed 64 256 128 8 4 "$algo" 2; done

echo "== growth with nodes (64 layers x 256 experts, 8 GPUs x 4 slots)"
for n in 16 32 64 128 256 512; do "${one_core[@]}" "$bench" speed 64 256 "$n" 8 4 lazarus 2; done

echo "== growth with experts (64 layers, 128 nodes x 8 GPUs x 4 slots)"
for e in 64 128 256 512 1024 2048; do "${one_core[@]}" "$bench" speed 64 "$e" 128 8 4 lazarus 2; done

echo "== end-to-end CLI (read loads, plan, metrics, write plan JSON)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/loads.json" <<'PY'
import json, random, sys
random.seed(1)
json.dump([[int(random.lognormvariate(8, 1)) for _ in range(256)] for _ in range(64)], open(sys.argv[1], "w"))
PY
/usr/bin/time -f "cli: %e s wall, %U s user, %S s sys, %M KiB max RSS" "${one_core[@]}" "$tool" \
  --loads "$tmp/loads.json" --nodes 128 --gpus-per-node 8 --slots-per-gpu 4 --fault-tolerance 2 \
  --output "$tmp/plan.json" -q

if [[ -f "$data/smartmoe_expert_loads.json" ]]; then
  for cfg in "8 4 4 2" "16 2 4 2" "10 1 6 1"; do
    set -- $cfg
    echo "== SmartMoE loads (24 layers x 32 experts, latest snapshot): $1 nodes x $2 GPUs x $3 slots, f=$4"
    "$bench" quality "$data/smartmoe_expert_loads.json" "$1" "$2" "$3" "$4"
  done
else
  echo "== $data/smartmoe_expert_loads.json not found: quality table skipped"
fi
