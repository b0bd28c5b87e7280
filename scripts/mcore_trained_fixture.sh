#!/usr/bin/env bash
# A Megatron-Core torch_dist fixture written by Megatron-LM's own training code (not run in CI): an
# all-MoE, Mixtral-shaped GPT trained 2 steps (its own train_step on mock data) and saved with
# save_checkpoint, then its truth (every tensor through torch's own DCP reader), for issue 49's export
# judge (tests/frameworks/hf_export_test.sh) and the reader tests.
#
#   scripts/mcore_trained_fixture.sh [DEST]   # DEST defaults to tests/formats/megatron_core/data/mixtral_ep2_trained
#
# The route of scripts/torch_dist_verify.sh: the pinned framework python (scripts/frameworks/setup.sh, torch
# 2.15) with the Megatron-LM core_v0.19.0 source tree ($MEGATRON_SRC/megatron-lm-core_v0.19.0, default
# ~/.cache/ucpkit) and torch2lab's CPU shims on PYTHONPATH, through scripts/megatron_core_load_lab.py
# (torch2lab's mcore_ckpt.py). Model: hidden 16, 2 layers, 4 heads in 2 query groups, SwiGLU, RMSNorm,
# RoPE, untied, fp32; MoE in every layer (--moe-layer-freq 1), 4 experts of 24, top 2, no shared expert,
# EP 2 x DP 2 (4 gloo ranks), default dp_reshardable distributed optimizer. Megatron-LM core_v0.19.0
# lines: --num-experts and --moe-layer-freq (default 1: every layer MoE) megatron/training/arguments.py:3351,
# :3353; --mock-data :3135; the 2 steps are train_step (megatron/training/training.py:2336, called by
# torch2lab's mcore_ckpt.py --train), the save save_checkpoint (megatron/training/checkpointing.py:552).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$ROOT/tests/formats/megatron_core/data/mixtral_ep2_trained}
. "$ROOT/scripts/frameworks/env.sh"
frameworks_python "$ROOT"
SRC=${MEGATRON_SRC:-$HOME/.cache/ucpkit}/megatron-lm-core_v0.19.0
T=$(cd "${TORCH2LAB:-$ROOT/../shared/tools/torch2lab}" && pwd)
[ -d "$SRC/megatron" ] || { echo "no Megatron-LM tree at $SRC (see scripts/torch_dist_verify.sh)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$ROOT/scripts/megatron_core_load_lab.py" "$work/"
run() {
  env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 PYTHONPATH="$T/shims:$SRC" TORCH2LAB="$T" PYTHONWARNINGS=ignore \
    PYTHONDONTWRITEBYTECODE=1 TORCH2LAB_CUDA_ON_CPU=1 TORCHDYNAMO_DISABLE=1 OMP_NUM_THREADS=1 \
    CUDA_DEVICE_MAX_CONNECTIONS=1 TORCH2LAB_PORT=0 "$FRAMEWORKS_PY" "$work/megatron_core_load_lab.py" "$@"
}
run save --out "$work/src" --steps 2 --hidden 16 --vocab 64 --layers 2 --gbs 2 --train --moe --experts 4 --ep 2 \
  --dp 2 --heads 4 --groups 2 --shared-ffn 0 --dtype fp32 --extra --moe-layer-freq 1 > "$work/save.log" 2>&1 ||
  { tail -20 "$work/save.log"; exit 1; }
run truth --ckpt "$work/src/iter_0000002" --out "$work/truth" > "$work/truth.log" 2>&1 || { tail -20 "$work/truth.log"; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST/dp_reshardable.truth"
cp -r "$work/src/iter_0000002/." "$DEST/dp_reshardable/"
cp "$work/truth/tensors.safetensors" "$work/truth/manifest.json" "$DEST/dp_reshardable.truth/"
du -sh "$DEST"
