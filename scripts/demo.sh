#!/usr/bin/env bash
# End-to-end demo on a small generated example (fresh machine: installs and builds first).
#   1. generate a Megatron-DeepSpeed GPT checkpoint (bf16, ZeRO-1, TP=2 PP=2 DP=2) with Debian's PyTorch
#   2. ucp-union (one-step map + reduce) -> universal checkpoint, checked against the generator's truth
#   3. ucp-load -> the same model for TP=1 PP=1 DP=4, then back to universal: must be identical
#   4. moe-replace on real SmartMoE expert loads (if ../shared/data is present)
# Usage: scripts/demo.sh [work_dir]   (default: a fresh temporary folder)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${UCPKIT_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" "$build"
bin=$build/bin
work=${1:-$(mktemp -d /tmp/ucpkit-demo.XXXXXX)}
mkdir -p "$work"
py=/usr/bin/python3
step() { printf '\n== %s\n' "$*"; }

step "1. generating a GPT checkpoint (bf16, ZeRO-1, TP=2 PP=2 DP=2) in $work/source"
rm -rf "$work/source"
$py "$root/scripts/gen_ds_checkpoint.py" --output "$work/source" --model gpt --tp 2 --pp 2 --dp 2 \
    --zero 1 --dtype bf16 --layers 4 --hidden 64 --heads 4 --ffn 256 --vocab 250 --seq 32 --seed 1
ls "$work/source/global_step"*/ | head -20

step "2. ucp-union (one-step) -> $work/universal"
rm -rf "$work/universal"
"$bin/ucp-union" --input "$work/source" --output "$work/universal" --json | tee "$work/union.json"
$py "$root/tests/ucp/check_universal.py" "$work/universal" "$work/source"

step "3. ucp-load -> TP=1 PP=1 DP=4 ZeRO-1 in $work/target, then back to universal"
rm -rf "$work/target" "$work/universal2"
"$bin/ucp-load" --input "$work/universal" --output "$work/target" --tp 1 --pp 1 --dp 4 --zero-stage 1 --json
"$bin/ucp-union" --input "$work/target" --output "$work/universal2" -q
# Same atomic tensors bit for bit (the layout-describing optimizer_state.pt and model copies differ).
$py "$root/tests/load/same_universal.py" "$work/universal" "$work/universal2"

data=$root/../shared/data/smartmoe_expert_loads.json
if [ -f "$data" ]; then
  step "4. moe-replace on SmartMoE loads: 4 nodes x 8 GPUs x 2 slots, every expert survives 1 node failure"
  "$bin/moe-replace" --loads "$data" --nodes 4 --gpus-per-node 8 --slots-per-gpu 2 --fault-tolerance 2 \
      --output "$work/placement.json"
fi
step "done: outputs in $work"
