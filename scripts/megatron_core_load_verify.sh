#!/bin/sh
# Outside CI (issue 30; needs the torch2lab chroot, ../shared/tools/torch2lab/README.md; run as root). A
# generated Megatron-DeepSpeed checkpoint (tests/generator/gen_ds_checkpoint.py) through
#   ucp-union --to-names megatron-core -> ucp-load --format torch_dist [layout]
#   -> Megatron-LM core_v0.19.0's own load_checkpoint at that layout (torch2lab mcore_ckpt.py load
#      --check-optim --require-all, through scripts/megatron_core_load_lab.py for settings mcore_ckpt.py
#      fixes): every local model shard and every fully_reshardable optimizer-state shard (fp32 param,
#      exp_avg, exp_avg_sq) Megatron loaded, compared bit-exact with the full tensors of
#   -> Megatron's load_plain_tensors of the same output (mcore_ckpt.py truth), which
#      scripts/megatron_core_names_check.py first compares, tensor by tensor, with the generator's truth
#      (optimizer states bit-exact, weights = the fp32 master rounded to bf16, padded vocab rows zero).
# So each loaded shard is equal to the generator's truth. The Megatron model is built with the source's
# settings (hidden, heads, query groups, ffn, vocab padded as the source, swiglu, normalization, biases,
# position embeddings, tied or untied output layer: tests/generator/dsgen/models.py build()).
#
#   scripts/megatron_core_load_verify.sh [BUILD]          # BUILD defaults to build/
#   CASES="llama_tp2 gpt_tp2" scripts/megatron_core_load_verify.sh
# One line per case, PASS/FAIL; exit 1 if any failed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
LAB=${LAB:-$ROOT/../shared/tools/torch2lab/lab.sh}
TRIXIE=${TRIXIE:-/opt/trixie}
WORK=/lab/mcload_verify
LOAD_TIMEOUT=${LOAD_TIMEOUT:-420}
rm -rf "$TRIXIE$WORK"; mkdir -p "$TRIXIE$WORK"
cp -r "$ROOT/tests/generator" "$TRIXIE$WORK/generator"
cp "$ROOT/scripts/megatron_core_names_check.py" "$TRIXIE$WORK/"
failed=0

run_until() {  # LOG PATTERN TIMEOUT cmd...: as in scripts/torch_dist_verify.sh
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

# case NAME "generator options" "ucp-load layout" "mcore_ckpt.py options" "flags to drop" "extra Megatron args"
case_() {
  name=$1; gen=$2; layout=$3; margs=$4; drop=$5; extra=$6
  if [ -n "${CASES:-}" ]; then case " $CASES " in *" $name "*) ;; *) return ;; esac; fi
  d=$TRIXIE$WORK/$name
  mkdir -p "$d"
  # shellcheck disable=SC2086
  /usr/bin/python3 "$ROOT/tests/generator/gen_ds_checkpoint.py" --output "$d/src" $gen > "$d/gen.log" 2>&1 || { echo "FAIL $name: generator"; failed=1; return; }
  "$BUILD/bin/ucp-union" -q --input "$d/src" --output "$d/mc" --to-names megatron-core > "$d/union.log" 2>&1 || { echo "FAIL $name: ucp-union"; tail -3 "$d/union.log"; failed=1; return; }
  # shellcheck disable=SC2086
  "$BUILD/bin/ucp-load" -q --input "$d/mc" --format torch_dist $layout --output "$d/td" > "$d/load.log" 2>&1 || { echo "FAIL $name: ucp-load"; tail -3 "$d/load.log"; failed=1; return; }
  run_until "$d/truth.log" "^truth:" 300 env TORCH2LAB_PORT=0 "$LAB" mcore_ckpt.py truth --ckpt $WORK/$name/td --out $WORK/$name/td.truth
  names=$(chroot "$TRIXIE" python3 $WORK/megatron_core_names_check.py $WORK/$name/td.truth $WORK/$name/src/truth $WORK/generator 2>&1 | tail -1)
  cp "$ROOT/scripts/megatron_core_load_lab.py" "$d/"
  printf '%s\n' $drop > "$d/drop_flags.txt"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  run_until "$d/mcore_load.log" "reshard-load check:" "$LOAD_TIMEOUT" \
    "$LAB" ../$WORK/$name/megatron_core_load_lab.py load --ckpt $WORK/$name/td --truth $WORK/$name/td.truth \
    --check-optim --require-all --no-rng --gbs 1 $margs --extra $extra
  t1=$(date +%s)
  check=$(grep -a "reshard-load check:" "$d/mcore_load.log" | tail -1)
  ok=1
  case "$names" in *"equal the generator's truth"*) ;; *) ok=0 ;; esac
  case "$check" in *", 0 mismatches"*) ;; *) ok=0 ;; esac
  case "$check" in *" 0 shards compared"*) ok=0 ;; esac
  if [ $ok = 1 ]; then echo "PASS $name ($layout): ${check#*: }; ${names#*: }; load $((t1 - t0)) s"
  else echo "FAIL $name ($layout): ${check:-no check line} ; $names"; grep -a "Error\|MISMATCH" "$d/mcore_load.log" | tail -5; failed=1; fi
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
