#!/bin/sh
# Outside CI (issue 30, ported to the pinned framework environment in issue 48; no root, no chroot). A generated
# Megatron-DeepSpeed checkpoint (tests/generator/gen_ds_checkpoint.py, Debian's python3 with torch 1.13, the
# generator's interpreter) through
#   ucp-union --to-names megatron-core -> ucp-load --format torch_dist [layout]
#   -> Megatron-LM's own load_checkpoint at that layout with its default RNG flags (issue 47: no
#      --no-load-rng; ucp-load's args say no_save_rng, so Megatron seeds afresh as on its own layout
#      change), torch2lab mcore_ckpt.py load --check-optim --require-all, through scripts/verify/megatron_core_load_verify.py for settings mcore_ckpt.py fixes), run with the
#      pinned environment's python (torch 2.15.0, scripts/frameworks/setup.sh) and a Megatron-LM source tree
#      (megatron.training + megatron.core; the PyPI megatron-core package has no megatron.training): every
#      local model shard and every fully_reshardable optimizer-state shard (fp32 param, exp_avg, exp_avg_sq)
#      Megatron loaded, compared bit-exact with the full tensors of
#   -> torch's own DCP loader on the same output (megatron_core_load_verify.py truth; Megatron's
#      load_plain_tensors fails on torch 2.15, see there), which scripts/verify/megatron_core_names_verify.py first
#      compares, tensor by tensor, with the generator's truth (optimizer states bit-exact, weights = the fp32
#      master rounded to bf16, padded vocab rows zero).
# So each loaded shard is equal to the generator's truth. The Megatron model is built with the source's
# settings (hidden, heads, query groups, ffn, vocab padded as the source, swiglu, normalization, biases,
# position embeddings, tied or untied output layer: tests/generator/dsgen/models.py build()).
# The line that is the point: Megatron-LM core_v0.19.0 (MCORE, default), the newest line here, on the newest
# torch. ucp-load writes for the line judging it (--megatron-version <the tag's release>): MCORE=core_v0.16.1
# gets the common state as common.pt, which that line reads (issue 47; before, its load failed with
# FileNotFoundError .../common.pt). No chroot is needed.
#
#   scripts/verify/megatron_core_load_verify.sh [BUILD]          # BUILD: a build folder or install prefix (default build/)
#   CASES="llama_tp2 gpt_tp2" scripts/verify/megatron_core_load_verify.sh BUILD
# Megatron-LM sources: $MEGATRON_SRC/megatron-lm-$MCORE (default ~/.cache/ucpkit), made once from
# MEGATRON_GIT=<a (bare) git repository of github:NVIDIA/Megatron-LM> with `git archive $MCORE`; without
# either the script exits 77 (not run). torch2lab (mcore_ckpt.py, its CPU shims): $TORCH2LAB, default
# ../shared/tools/torch2lab. FRAMEWORKS_PY=<python>: another interpreter instead of the pinned one.
# One line per case, PASS/FAIL, and `RESULT framework=megatron-lm version=<tag>
# case=megatron_core_load_verify/<case> tensors=N equal=yes|no` (N: Megatron's loaded shards + the tensors
# the names check compared with the generator's truth; scripts/frameworks/run_all.sh collects them); exit 1 if
# any failed.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
TORCH2LAB=$(cd "${TORCH2LAB:-$ROOT/../shared/tools/torch2lab}" 2>/dev/null && pwd) ||
  { echo "SKIP: no torch2lab folder (set TORCH2LAB)"; exit 77; }
TAG=${MCORE:-core_v0.19.0}
MEGATRON_SRC=${MEGATRON_SRC:-${XDG_CACHE_HOME:-$HOME/.cache}/ucpkit}
LOAD_TIMEOUT=${LOAD_TIMEOUT:-420}
. "$ROOT/scripts/frameworks/env.sh"
frameworks_python "$ROOT"
SRC=$(megatron_src "$TAG") ||
  { echo "NOT RUN megatron-lm $TAG: no source tree in $MEGATRON_SRC/megatron-lm-$TAG and no MEGATRON_GIT to make it"; exit 77; }
WORK=$(mktemp -d)
if [ -n "${KEEP:-}" ]; then echo "work folder kept: $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
cp -r "$ROOT/tests/generator" "$WORK/generator"
cp "$ROOT/scripts/verify/megatron_core_names_verify.py" "$WORK/"
echo "== Megatron-LM $TAG ($SRC) on $("$FRAMEWORKS_PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)"
# The environment of every Megatron run (scripts/frameworks/env.sh): the tree and torch2lab's CPU shims.
MENV=$MEGATRON_ENV
failed=0

run_until() {  # LOG PATTERN TIMEOUT cmd...: as in scripts/verify/torch_dist_verify.sh
  log=$1; pat=$2; limit=$3; shift 3
  : > "$log"
  setsid "$@" > "$log" 2>&1 &
  pid=$!
  waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$limit" ]; do
    grep -aq "$pat" "$log" && break
    sleep 2; waited=$((waited + 2))
  done
  sleep 1
  kill -TERM -- "-$pid" 2>/dev/null; sleep 1; kill -KILL -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

result() {  # NAME TENSORS yes|no
  echo "RESULT framework=megatron-lm version=$TAG case=megatron_core_load_verify/$1 tensors=$2 equal=$3"
}

# case NAME "generator options" "ucp-load layout" "mcore_ckpt.py options" "flags to drop" "extra Megatron args"
case_() {
  name=$1; gen=$2; layout=$3; margs=$4; drop=$5; extra=$6
  if [ -n "${CASES:-}" ]; then case " $CASES " in *" $name "*) ;; *) return ;; esac; fi
  d=$WORK/$name
  mkdir -p "$d"
  # shellcheck disable=SC2086
  /usr/bin/python3 "$ROOT/tests/generator/gen_ds_checkpoint.py" --output "$d/src" $gen > "$d/gen.log" 2>&1 || { echo "FAIL $name: generator"; result "$name" 0 no; failed=1; return; }
  (cd "$d" && "$BUILD/bin/ucp-union" -q --input src --output mc --to-names megatron-core) > "$d/union.log" 2>&1 || { echo "FAIL $name: ucp-union"; tail -3 "$d/union.log"; result "$name" 0 no; failed=1; return; }
  # shellcheck disable=SC2086
  (cd "$d" && "$BUILD/bin/ucp-load" -q --input mc --format torch_dist $layout --megatron-version "${TAG#core_v}" --output td) > "$d/load.log" 2>&1 || { echo "FAIL $name: ucp-load"; tail -3 "$d/load.log"; result "$name" 0 no; failed=1; return; }
  cp "$ROOT/scripts/verify/megatron_core_load_verify.py" "$d/"
  # shellcheck disable=SC2086
  printf '%s\n' $drop > "$d/drop_flags.txt"
  # shellcheck disable=SC2086
  timeout 300 env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 PYTHONPATH="$TORCH2LAB/shims:$SRC" TORCH2LAB="$TORCH2LAB" $MENV \
    "$FRAMEWORKS_PY" "$d/megatron_core_load_verify.py" truth --ckpt "$d/td" --out "$d/td.truth" > "$d/truth.log" 2>&1
  names=$(PYTHONWARNINGS=ignore "$FRAMEWORKS_PY" "$WORK/megatron_core_names_verify.py" "$d/td.truth" "$d/src/truth" "$WORK/generator" 2>&1 | tail -1)
  t0=$(date +%s)
  # shellcheck disable=SC2086
  run_until "$d/mcore_load.log" "reshard-load check:" "$LOAD_TIMEOUT" \
    env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 PYTHONPATH="$TORCH2LAB/shims:$SRC" TORCH2LAB="$TORCH2LAB" $MENV \
    "$FRAMEWORKS_PY" "$d/megatron_core_load_verify.py" load --ckpt "$d/td" --truth "$d/td.truth" \
    --check-optim --require-all --gbs 1 $margs --extra $extra
  t1=$(date +%s)
  check=$(grep -a "reshard-load check:" "$d/mcore_load.log" | tail -1)
  shards=$(echo "$check" | sed -n 's/.*: \([0-9]*\) shards compared.*/\1/p')
  ntensors=$(echo "$names" | sed -n 's/.* \([0-9][0-9]*\) tensors (.*/\1/p')
  ok=1
  case "$names" in *"equal the generator's truth"*) ;; *) ok=0 ;; esac
  case "$check" in *", 0 mismatches"*) ;; *) ok=0 ;; esac
  case "$check" in *" 0 shards compared"*) ok=0 ;; esac
  if [ $ok = 1 ]; then
    echo "PASS $name ($layout): ${check#*: }; ${names#*: }; load $((t1 - t0)) s"
    result "$name" $((shards + ntensors)) yes
  else
    echo "FAIL $name ($layout): ${check:-no check line} ; $names"; grep -a "Error\|MISMATCH" "$d/mcore_load.log" | tail -5; tail -3 "$d/truth.log"
    result "$name" $((${shards:-0} + ${ntensors:-0})) no
    failed=1
  fi
}

# The generator's models (tests/generator/dsgen/models.py build): 4 layers, hidden 32, 4 heads, ffn 64,
# vocab 100 padded to a multiple of 8 * TP of the source (models.py pad_vocab) = 112 at source TP 2.
# Megatron pads to make_vocab_size_divisible_by * TP (megatron/training/tokenizer: _vocab_size_with_padding),
# so the load passes 8 at TP 2 and 16 at TP 1 for the same 112 rows. Learning rate: the generator's saved
# lr (1e-4) and no Megatron scheduler state (DeepSpeed's {last_batch_iteration, _last_lr}): the common
# state has a constant schedule at it, loaded with --override-opt_param-scheduler and --lr = --min-lr =
# 1e-4 (the param groups are matched by max_lr/min_lr, distrib_optimizer.py:937-970).
SHAPE="--layers 4 --hidden 32 --heads 4 --ffn 64 --vocab 100"
LR="--lr 1e-4 --min-lr 1e-4 --override-opt_param-scheduler"
# Llama (models.py: GQA 2 query groups, SwiGLU, RMSNorm weight only, no biases, rotary, untied head):
# mcore_ckpt.py's own defaults (swiglu, RMSNorm, rope, untied) plus --disable-bias-linear.
LLAMA="$SHAPE --groups 2"
case_ llama_tp2 "--model llama --tp 2 --dp 1" "" "--tp 2 $LLAMA" "" "--disable-bias-linear --make-vocab-size-divisible-by 8 $LR"
case_ llama_tp1pp2 "--model llama --tp 2 --dp 1" "--tp 1 --pp 2 --dp 1" "--tp 1 --pp 2 $LLAMA" "" "--disable-bias-linear --make-vocab-size-divisible-by 16 $LR"
case_ llama_tp1dp2 "--model llama --tp 2 --dp 1" "--tp 1 --dp 2" "--tp 1 --dp 2 --gbs 2 $LLAMA" "" "--disable-bias-linear --make-vocab-size-divisible-by 16 $LR"
# A TP 2 x PP 2 x DP 2 source (GPTModelPipe layer files; CI: MegatronCoreNames ..._tp2pp2), loaded by
# Megatron at TP 2 x PP 2 (4 gloo ranks).
case_ llama_tp2pp2 "--model llama --tp 2 --pp 2 --dp 2" "--tp 2 --pp 2 --dp 1" "--tp 2 --pp 2 $LLAMA" "" "--disable-bias-linear --make-vocab-size-divisible-by 8 $LR"
# GPT (models.py: MHA, GeLU MLP with biases, LayerNorm with bias, learned absolute position embeddings
# of seq 16 = mcore_ckpt.py's --max-position-embeddings, tied head): without --swiglu / --untie...
GPT="$SHAPE --groups 4"
GPTX="--normalization LayerNorm --position-embedding-type learned_absolute"
case_ gpt_tp2 "--model gpt --tp 2 --dp 1" "" "--tp 2 $GPT" "--swiglu --untie-embeddings-and-output-weights" "$GPTX --make-vocab-size-divisible-by 8 $LR"
case_ gpt_tp1pp2 "--model gpt --tp 2 --dp 1" "--tp 1 --pp 2 --dp 1" "--tp 1 --pp 2 $GPT" "--swiglu --untie-embeddings-and-output-weights" "$GPTX --make-vocab-size-divisible-by 16 $LR"
# Native DeepSpeed MoE (models.py dsmoe: GPT-style, MoE in layers 1 and 3, 4 experts, top-1 gate
# without bias) with --disable-bias-linear: Megatron-Core's TopKRouter has a bias exactly when
# add_bias_linear (core/transformer/moe/router.py:64-69), and DeepSpeed's gate `wg` never has one, so
# only the bias-free model has the same parameters on both sides (mcore_ckpt.py --moe passes
# --disable-bias-linear too). EP 2 x DP 2 as saved; the MoE layers by --moe-layer-freq, the expert MLP
# as the source's (ffn 64, no shared expert, GeLU).
MOEX="--moe-layer-freq [0,1,0,1] $GPTX --disable-bias-linear"
# Also written for (and loaded at) EP 1 x DP 2 (every expert on every rank) and EP 4 x DP 4.
MOE="--moe --experts 4 --moe-ffn 64 --shared-ffn 0 $GPT"
MOESRC="--model dsmoe --tp 1 --dp 2 --ep 2 --disable-bias-linear"
MOEDROP="--swiglu --untie-embeddings-and-output-weights"
case_ dsmoe_ep2 "$MOESRC" "" "--dp 2 --ep 2 --gbs 2 $MOE" "$MOEDROP" "$MOEX --make-vocab-size-divisible-by 8 $LR"
case_ dsmoe_ep1dp2 "$MOESRC" "--tp 1 --dp 2 --ep 1" "--dp 2 --ep 1 --gbs 2 $MOE" "$MOEDROP" "$MOEX --make-vocab-size-divisible-by 8 $LR"
case_ dsmoe_ep4dp4 "$MOESRC" "--tp 1 --dp 4 --ep 4" "--dp 4 --ep 4 --gbs 4 $MOE" "$MOEDROP" "$MOEX --make-vocab-size-divisible-by 8 $LR"
# Written at the source's EP 2 x DP 2 and resharded by Megatron-Core's own load to EP 4 x DP 4. Not to
# EP 1 x DP 1: there Megatron builds one optimizer where the save has the ChainedOptimizer's two parts and
# stops with KeyError: 'optimizer' (core/optimizer/optimizer.py:1574-1576, distrib_optimizer.py:962), for
# its own EP 2 save as well (tests/formats/megatron_core/data/moe_ep2 fully_reshardable, loaded by
# mcore_ckpt.py at --ep 1 --dp 1, 2026-11-25). ucp-load writes that layout instead (dsmoe_ep1dp1).
case_ dsmoe_ep2_as_ep4dp4 "$MOESRC" "" "--dp 4 --ep 4 --gbs 4 $MOE" "$MOEDROP" "$MOEX --make-vocab-size-divisible-by 8 $LR"
case_ dsmoe_ep1dp1 "$MOESRC" "--tp 1 --dp 1 --ep 1" "--dp 1 --ep 1 --gbs 1 $MOE" "$MOEDROP" "$MOEX --make-vocab-size-divisible-by 8 $LR"
exit $failed
