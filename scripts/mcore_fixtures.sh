#!/bin/sh
# Real Megatron-Core `torch_dist` fixtures for tests/formats/megatron_core (issue 30), written by
# Megatron-LM's own argument parser, model/optimizer set-up, optimizer.step() and save_checkpoint
# over gloo CPU ranks (the shared torch2lab tool; not run in CI), and their truth read back through
# Megatron's own reader (dist_checkpointing.load_plain_tensors).
#
#   scripts/mcore_fixtures.sh [DEST]      # DEST defaults to tests/formats/megatron_core/data
#
# Every model is saved twice from the same optimizer state: the default dp_reshardable distributed
# optimizer (--out) and fully_reshardable (--fully-reshardable-copy). Runs as root (chroot).
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$ROOT/tests/formats/megatron_core/data}
LAB=${LAB:-$ROOT/../shared/tools/torch2lab/lab.sh}
TRIXIE=${TRIXIE:-/opt/trixie}
WORK=/lab/mcfx/run
rm -rf "$TRIXIE$WORK"; mkdir -p "$TRIXIE$WORK" "$DEST"
COMMON="--hidden 16 --vocab 64 --layers 2 --gbs 2 --no-rng --steps 2"

# save NAME MCORE_TAG mcore_ckpt.py-save-arguments...: both saves and their truth under $WORK
save() {
  name=$1; tag=$2; shift 2
  echo "== $name ($tag): $*"
  MCORE=$tag "$LAB" mcore_ckpt.py save --out $WORK/$name/dp \
    --fully-reshardable-copy $WORK/$name/full $COMMON "$@" > "$TRIXIE$WORK/$name.log" 2>&1 \
    || { tail -30 "$TRIXIE$WORK/$name.log"; return 1; }
  for f in dp full; do
    MCORE=$tag "$LAB" mcore_ckpt.py truth --ckpt $WORK/$name/$f --out $WORK/$name/$f.truth \
      >> "$TRIXIE$WORK/$name.log" 2>&1 || { tail -30 "$TRIXIE$WORK/$name.log"; return 1; }
  done
}

# fixture NAME MCORE_TAG args...: save, then copy the iteration folders and truth into DEST
fixture() {
  save "$@"
  name=$1
  rm -rf "$DEST/$name"; mkdir -p "$DEST/$name"
  cp -r "$TRIXIE$WORK/$name/dp/iter_0000002" "$DEST/$name/dp_reshardable"
  cp -r "$TRIXIE$WORK/$name/full/iter_0000002" "$DEST/$name/fully_reshardable"
  for f in dp:dp_reshardable full:fully_reshardable; do
    mkdir -p "$DEST/$name/${f#*:}.truth"
    cp "$TRIXIE$WORK/$name/${f%%:*}.truth/tensors.safetensors" "$TRIXIE$WORK/$name/${f%%:*}.truth/manifest.json" \
      "$TRIXIE$WORK/$name/${f%%:*}.truth/common.txt" "$DEST/$name/${f#*:}.truth/"
  done
}

# GPT (MHA: query groups = heads, biases on), TP 2 x PP 2 (one layer per stage)
fixture gpt_tp2_pp2 core_v0.19.0 --tp 2 --pp 2 --heads 4 --groups 4
# Llama-style: GQA (4 heads, 2 groups), SwiGLU, RMSNorm, no biases, TP 2 x DP 2; Megatron-Core
# 0.16.1 (legacy common.pt instead of the common_state item)
fixture llama_gqa_tp2_dp2_v016 core_v0.16.1 --tp 2 --dp 2 --heads 4 --groups 2 --extra --disable-bias-linear
# native MoE, 4 experts, EP 2 (DP 2), layer 0 dense, layer 1 MoE, a shared expert. --grouped-gemm is
# passed but the local backend builds SequentialMLP anyway (megatron/core/models/backends.py:133-142
# at core_v0.19.0): the experts are local_experts.<i> modules, stored with an expert axis
fixture moe_ep2 core_v0.19.0 --moe --experts 4 --ep 2 --dp 2 --heads 4 --groups 2 --grouped-gemm
du -sh "$DEST"
