#!/bin/sh
# Training-ready Hugging Face import judged by Megatron-LM's own training (issue 49, Megatron half; outside CI:
# about 2.5 minutes on 2 cores). For the model of the resume_ cases of torch_dist_verify.sh (Llama: hidden 16, 4
# heads in 2 key-value groups, ffn 32, vocabulary 64, 2 layers, untied, no biases; TP 2, Megatron-LM core_v0.19.0
# from its source tree, CPU, gloo, the pinned framework Python; scripts/verify/hf_resume_verify.py):
#   1. transformers' own save_pretrained writes the model in $DTYPE (default bf16; fp32 also runs);
#   2. ucp-load --input hf --format torch_dist --tp 2 --dp 1 --output ours (relative paths, options left out);
#   3. reference: Megatron-LM builds the same job fresh (no --load), the Hugging Face weights are copied into it
#      in memory by an independent mapping (hf_resume_verify.py megatron_shards), its fp32 main params refreshed
#      by Megatron's reload_model_params, iteration 0; 3 steps of Megatron's own train_step on seeded batches.
#      It also prints transformers' own fp32 loss of the first batch (a check of the mapping);
#   4. each case: Megatron-LM resumes from a save with load_checkpoint, then the same 3 steps;
#   5. the "resumed iteration ..., lr [...]" line and every loss line must equal the reference's, character
#      for character (the losses printed as Python floats of Megatron's fp32 values: equal text = equal bits).
# Cases:
#   default      ours, the job's default load flags (the acceptance point: a training-ready import);
#   finetune     ours, --finetune (Megatron's flag for starting from pretrained weights: weights only,
#                iteration 0, a fresh optimizer and scheduler);
#   te_keys      (FAMILY=mixtral) ours, default flags, the job asking for the Transformer Engine spec's keys: its MoE
#                layers' pre-MLP norm under pre_mlp_layernorm.weight (gpt_layer_specs.py; TE needs a GPU, so the local
#                spec with that one key-map entry removed, hf_resume_verify.py _te_spec_keys);
#   parallel_load  ours, --ckpt-fully-parallel-load (the issue's "fully-parallel-load-style loading": each
#                data-parallel rank reads a part and they exchange it; DP=2 gives it ranks to spread over).
# DP: the job's data-parallel size (default 1; the import is written at TP 2 DP 1 whatever it is, and Megatron
# reshards it on load), the reference's too.
# FAMILY=mixtral: an all-MoE Mixtral instead (4 experts of ffn 24, top 2; transformers' MixtralForCausalLM),
# imported at TP 1 x EP 2 x DP 2 and trained by the job at that layout (mcore_ckpt's MoE job: SequentialMLP,
# aux-loss load balancing, allgather dispatcher; no shared expert, every layer MoE); DP is then 2.
# PP: pipeline stages (default 1) of the import and of the job alike (PP=2: one layer a stage; the reference
# copies each stage's layers under Megatron's local layer numbers).
#
#   scripts/verify/hf_resume_verify.sh [BUILD]     # BUILD: a build folder or install prefix with bin/ (default build/)
#   CASES="default" DTYPE=fp32 KEEP=1 scripts/verify/hf_resume_verify.sh
# Megatron-LM sources, torch2lab, FRAMEWORKS_PY: as scripts/verify/torch_dist_verify.sh (MEGATRON_GIT, MEGATRON_SRC,
# TORCH2LAB). Results: PASS/FAIL per case and `RESULT framework=megatron-lm version=core_v0.19.0
# case=hf_resume/<case> tensors=N equal=yes|no` (N: the loss lines compared). Exit 1 if any failed, 77 if it
# cannot run.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
TORCH2LAB=$(cd "${TORCH2LAB:-$ROOT/../shared/tools/torch2lab}" 2>/dev/null && pwd) ||
  { echo "SKIP: no torch2lab folder (set TORCH2LAB)"; exit 77; }
TAG=core_v0.19.0
DTYPE=${DTYPE:-bf16}
FAMILY=${FAMILY:-llama}
CASES=${CASES:-default finetune parallel_load$([ "$FAMILY" = mixtral ] && echo ' te_keys')}
DP=${DP:-1}
PP=${PP:-1}
MEGATRON_SRC=${MEGATRON_SRC:-${XDG_CACHE_HOME:-$HOME/.cache}/ucpkit}
[ -x "$BUILD/bin/ucp-load" ] || { echo "SKIP: no $BUILD/bin/ucp-load"; exit 77; }
. "$ROOT/scripts/frameworks/env.sh"
frameworks_python "$ROOT"
WORK=$(mktemp -d)
if [ -n "${KEEP:-}" ]; then echo "work folder kept: $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi

SRC=$(megatron_src "$TAG") ||
  { echo "NOT RUN megatron-lm $TAG: no source tree in $MEGATRON_SRC/megatron-lm-$TAG and no MEGATRON_GIT to make it"; exit 77; }
MENV=$MEGATRON_ENV
# The job: mcore_ckpt.megatron_argv's Llama at TP 2 (its --swiglu, RMSNorm, rope, untied embeddings; lr 1e-3,
# min lr 1e-4, 1 warm-up iteration, cosine, weight decay 0.1, Adam betas 0.9 / 0.95, bf16 unless fp32).
JOB="--hidden 16 --vocab 64 --layers 2 --gbs 2 --train --tp 2 --pp $PP --dp $DP --heads 4 --groups 2 --dtype $DTYPE"
EXTRA="--disable-bias-linear"
IMPORT="--tp 2 --pp $PP --dp 1"
RANKS=$((2 * PP * DP))
if [ "$FAMILY" = mixtral ]; then
  DP=2 RANKS=$((2 * PP)) IMPORT="--tp 1 --pp $PP --ep 2 --dp 2"
  JOB="--hidden 16 --vocab 64 --layers 2 --gbs 2 --train --tp 1 --pp $PP --dp 2 --ep 2 --heads 4 --groups 2 --dtype $DTYPE --moe --experts 4 --shared-ffn 0"
  EXTRA="--disable-bias-linear --moe-layer-freq 1"  # after mcore_ckpt's [0]+[1]*N: every layer MoE, as Mixtral
fi
cp "$ROOT/scripts/verify/hf_resume_verify.py" "$ROOT/scripts/verify/megatron_core_load_verify.py" "$WORK/"
failed=0

mrun() {  # LOG args...: the verify script in Megatron's environment
  log=$1; shift
  # shellcheck disable=SC2086
  (cd "$WORK" && timeout 900 env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 PYTHONPATH="$TORCH2LAB/shims:$SRC" TORCH2LAB="$TORCH2LAB" UCPKIT_TE_KEYS="${UCPKIT_TE_KEYS:-}" $MENV \
    "$FRAMEWORKS_PY" hf_resume_verify.py "$@") > "$WORK/$log" 2>&1
}
lines() { grep -aE "^(resumed iteration|train step)" "$WORK/$1.log" | sort > "$WORK/$1.lines"; }
result() { c=$1; [ "$FAMILY" = llama ] || c="$FAMILY/$1"; echo "RESULT framework=megatron-lm version=$TAG case=hf_resume/$c tensors=$2 equal=$3"; }
# The losses of the last rank (the last pipeline stage's: a first stage prints no loss).
loss0() { grep -a "^train step 0 (rank $((RANKS - 1)))" "$WORK/$1.lines" | sed 's/.*: //; s/}$//'; }

echo "== Megatron-LM $TAG ($SRC), $FAMILY, job $(echo "$JOB" | grep -o -- "--tp [0-9]* --pp [0-9]* --dp [0-9]*\( --ep [0-9]*\)\?"), on $("$FRAMEWORKS_PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null), $DTYPE"
t0=$(date +%s)
(cd "$WORK" && "$FRAMEWORKS_PY" hf_resume_verify.py make --out hf --dtype "$DTYPE" --family "$FAMILY") > "$WORK/make.log" 2>&1 ||
  { echo "FAIL: transformers' save_pretrained"; tail -3 "$WORK/make.log"; result make 0 no; exit 1; }
(cd "$WORK" && "$BUILD/bin/ucp-load" --input hf --format torch_dist $IMPORT --output ours) > "$WORK/load.log" 2>&1 ||
  { echo "FAIL: ucp-load"; tail -3 "$WORK/load.log"; result import 0 no; exit 1; }
t1=$(date +%s)
# shellcheck disable=SC2086
mrun ref.log reference --hf hf --steps 3 $JOB --extra $EXTRA
lines ref
t2=$(date +%s)
steps=$(grep -c "^train step" "$WORK/ref.lines")
[ "$steps" -eq $((3 * RANKS)) ] || { echo "FAIL reference: Megatron's fresh run with the Hugging Face weights did not train 3 steps"; tail -5 "$WORK/ref.log"; result reference "$steps" no; exit 1; }
echo "reference (fresh Megatron job, weights copied in memory, $((t2 - t1)) s): $(grep -m1 '^resumed' "$WORK/ref.lines"); losses $(grep "^train step [0-9]* (rank $((RANKS - 1)))" "$WORK/ref.lines" | sed 's/.*: //; s/}$//' | tr '\n' ' ')"
echo "  transformers' own $(grep -a "^transformers' own loss" "$WORK/ref.log" | sed "s/^transformers' own //"); Megatron's first loss $(loss0 ref)"

case_() {  # NAME SAVE "resume flags" DESCRIPTION
  name=$1; save=$2; flags=$3; what=$4
  case " $CASES " in *" $name "*) ;; *) return ;; esac
  s0=$(date +%s)
  # shellcheck disable=SC2086
  mrun "$name.log" resume --ckpt "$save" --steps 3 $JOB --extra $EXTRA $flags
  lines "$name"
  s1=$(date +%s)
  n=$(grep -c "^train step" "$WORK/$name.lines")
  if [ "$n" -gt 0 ] && cmp -s "$WORK/$name.lines" "$WORK/ref.lines"; then
    echo "PASS $name ($what): $(grep -m1 '^resumed' "$WORK/$name.lines"); $n loss lines equal to the reference's, bit for bit (first $(loss0 "$name")); $((s1 - s0)) s"
    result "$name" "$n" yes
  else
    echo "FAIL $name ($what): differs from the reference"
    diff "$WORK/$name.lines" "$WORK/ref.lines" | head -8
    grep -aE "^[A-Za-z.]*(Error|Exception)" "$WORK/$name.log" | tail -2
    result "$name" "$n" no
    failed=1
  fi
}

case_ default ours "" "ucp-load's import, Megatron's default load flags"
case_ finetune ours "--finetune" "ucp-load's import, --finetune"
case_ parallel_load ours "--ckpt-fully-parallel-load" "ucp-load's import, --ckpt-fully-parallel-load"
# A Transformer Engine spec job's keys (Megatron's default --transformer-impl; TE itself needs a GPU): the MoE layers'
# pre-MLP norm asked for as pre_mlp_layernorm.weight, the TE spec's key (hf_resume_verify.py _te_spec_keys).
export UCPKIT_TE_KEYS=1
case_ te_keys ours "" "ucp-load's import, default flags, the Transformer Engine spec's keys"
unset UCPKIT_TE_KEYS
echo "total $(($(date +%s) - t0)) s"
exit $failed
