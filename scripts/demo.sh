#!/usr/bin/env bash
# End-to-end demo of every tool on small generated examples (fresh machine: installs what the demo
# needs and builds the tools only, scripts/setup.sh --demo).
#   1. generate a Megatron-DeepSpeed GPT checkpoint (bf16, ZeRO-1, TP=2 PP=2 DP=2) with Debian's PyTorch
#   2. ucp-info: what the checkpoint holds
#   3. ucp-extract (map) then ucp-union (reduce) -> universal checkpoint, checked against the generator's truth
#   4. ucp-load -> TP=1 PP=1 DP=4, back to universal, ucp-diff: must be identical
#   5. pec-save at two steps of a generated native-MoE checkpoint (all experts, then 1 of 4 per layer),
#      pec-restore of the latest step from the partial saves, with its lost-token report
#   6. moe-replace on real SmartMoE expert loads from ../shared/data, or on a small generated loads file
#      when that folder is absent (it says which)
# A step that cannot run says "skipped:" and why; the demo never skips silently.
# Usage: scripts/demo.sh [--no-setup] [work_dir]   (default: a fresh temporary folder)
#   --no-setup   use the tools already built in $UCPKIT_BUILD_DIR (default build/), install nothing
#   UCPKIT_DEMO_DATA  folder of the placement data (default ../shared/data beside the repository)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${UCPKIT_BUILD_DIR:-$root/build}
setup=1
if [ "${1:-}" = --no-setup ]; then
  setup=0
  shift
fi
start=$(date +%s)
[ "$setup" = 1 ] && "$root/scripts/setup.sh" --demo "$build"
bin=$build/bin
work=${1:-$(mktemp -d /tmp/ucpkit-demo.XXXXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
py=/usr/bin/python3
step() { printf '\n== %s\n' "$*"; }
skipped() { printf 'skipped: %s\n' "$*"; }
have() { [ -x "$bin/$1" ]; }

step "1. generating a GPT checkpoint (bf16, ZeRO-1, TP=2 PP=2 DP=2) in $work/source"
rm -rf "$work/source"
$py "$root/tests/generator/gen_ds_checkpoint.py" --output "$work/source" --model gpt --tp 2 --pp 2 --dp 2 \
    --zero 1 --dtype bf16 --layers 4 --hidden 64 --heads 4 --ffn 256 --vocab 250 --seq 32 --seed 1
ls "$work/source/global_step"*/ | head -20

step "2. ucp-info: the source checkpoint"
if have ucp-info; then
  "$bin/ucp-info" "$work/source"
else
  skipped "ucp-info is not built in $bin"
fi

step "3. ucp-extract (map) -> $work/fragments, ucp-union (reduce) -> $work/universal"
rm -rf "$work/fragments" "$work/universal"
"$bin/ucp-extract" --input "$work/source" --output "$work/fragments" -q
"$bin/ucp-union" --input "$work/fragments" --output "$work/universal" --json | tee "$work/union.json"
$py "$root/tests/to_universal/check_universal.py" "$work/universal" "$work/source"

step "4. ucp-load -> TP=1 PP=1 DP=4 ZeRO-1 in $work/target, then back to universal, ucp-diff"
rm -rf "$work/target" "$work/universal2"
"$bin/ucp-load" --input "$work/universal" --output "$work/target" --tp 1 --pp 1 --dp 4 --zero-stage 1 --json
"$bin/ucp-union" --input "$work/target" --output "$work/universal2" -q
# Same atomic tensors bit for bit (the layout-describing optimizer_state.pt and model copies differ).
$py "$root/tests/reshard/same_universal.py" "$work/universal" "$work/universal2"
if have ucp-diff; then
  "$bin/ucp-diff" "$work/universal" "$work/universal2"
else
  skipped "ucp-diff is not built in $bin (the comparison above is the test suite's checker)"
fi

step "5. PEC: pec-save at steps 100 and 200 of a native-MoE checkpoint (4 experts per layer, EP=2), pec-restore"
rm -rf "$work/moe" "$work/store" "$work/restored"
for s in 100 200; do
  $py "$root/tests/generator/gen_ds_checkpoint.py" --output "$work/moe/step$s" --model dsmoe --layers 4 --hidden 32 \
      --heads 4 --ffn 64 --vocab 128 --seq 16 --experts 4 --dp 4 --ep 2 --zero 1 --dtype bf16 --step $s \
      --seed $s --no-truth
done
# The first save of a store takes every expert; later saves only --k of them per layer.
# The step is read from the checkpoint (its tag, latest, global_steps); --step would be checked against it.
"$bin/pec-save" --input "$work/moe/step100" --output "$work/store" --policy sequential --k 1
"$bin/pec-save" --input "$work/moe/step200" --output "$work/store" --policy sequential --k 1
# Without token counts (--tokens) the lost-token proportion is reported as unknown, never as 0.
"$bin/pec-restore" --input "$work/store" --output "$work/restored"
ls "$work/restored"

data=${UCPKIT_DEMO_DATA:-$root/../shared/data}
loads=$data/smartmoe_expert_loads.json
if [ -f "$loads" ]; then
  step "6. moe-replace on SmartMoE loads ($loads): 4 nodes x 8 GPUs x 2 slots, every expert on 2 nodes"
  "$bin/moe-replace" --loads "$loads" --nodes 4 --gpus-per-node 8 --slots-per-gpu 2 \
      --survive-node-failures 1 --output "$work/placement.json"
else
  step "6. moe-replace on generated loads: 2 nodes x 4 GPUs x 4 slots, every expert on 2 nodes"
  echo "no $loads (the SmartMoE data): using a generated loads file instead ($work/loads.json, 2 layers x 16 experts)"
  $py -c '
import json, random, sys
rng = random.Random(7)
layers = [[int(10000 / (e + 1) ** 1.2 * rng.uniform(0.8, 1.2)) for e in range(16)] for _ in range(2)]
json.dump({"loads": layers}, open(sys.argv[1], "w"))' "$work/loads.json"
  "$bin/moe-replace" --loads "$work/loads.json" --nodes 2 --gpus-per-node 4 --slots-per-gpu 4 \
      --survive-node-failures 1 --output "$work/placement.json"
fi
step "done in $(($(date +%s) - start)) s: outputs in $work"
