#!/bin/sh
# ucp-load --format torch_dist checked by Megatron-LM's own loader (issue 30 part A, ported to the pinned
# framework environment in issue 48; not run in CI: about 30 s a case and Megatron-LM line on 2 cores).
# Runs with the pinned environment's python (torch 2.15.0, scripts/frameworks/setup.sh; no root, no chroot)
# and Megatron-LM source trees (megatron.training + megatron.core: the PyPI megatron-core package has no
# megatron.training, whose argument parser, model build and load_checkpoint are the judge) of each line in
# $MCORE, default both lines that wrote the committed fixtures:
#   core_v0.19.0  the newest line here (gpt_tp2_pp2 and moe_ep2 were saved by it): every case;
#   core_v0.16.1  the older line users still run (llama_gqa_tp2_dp2_v016 was saved by it): that fixture's
#                 cases only (0.16.1 cannot read a 0.19 save, Megatron's own included: no common.pt).
# Both lines are the point; no chroot is needed for either (the trixie chroot's torch 2.6 is not what these
# cases judge; its path is gone, see git history before issue 48).
# For each case and line:
#   committed fixture (tests/formats/megatron_core/data, written by Megatron's save_checkpoint)
#   -> ucp-union -> ucp-load --format torch_dist [layout] -> Megatron's load_checkpoint at that layout
#   (torch2lab mcore_ckpt.py load --check-optim through scripts/verify/megatron_core_load_verify.py: every loaded local
#   model shard and fully_reshardable optimizer-state shard compared bit-exact with the source's truth,
#   "N shards compared, M mismatches")
#   -> torch's own DCP loader reads every tensor of our output whole (megatron_core_load_verify.py truth; Megatron's
#   load_plain_tensors fails on torch 2.15, see there), compared with the source's truth: every tensor's
#   shape, dtype and sha256.
# The dp_reshardable cases are the dp_reshardable -> fully_reshardable conversion of the issue (same layout).
#
#   scripts/verify/torch_dist_verify.sh [BUILD]     # BUILD: a build folder or install prefix with bin/ (default build/)
#   CASES="gpt_tp1pp1 moe_ep1" MCORE=core_v0.19.0 scripts/verify/torch_dist_verify.sh BUILD   # only these
# Megatron-LM sources: $MEGATRON_SRC/megatron-lm-<tag> (default ~/.cache/ucpkit), made once from
# MEGATRON_GIT=<a (bare) git repository of github:NVIDIA/Megatron-LM> with `git archive <tag>`; a line
# without either is reported as not run. torch2lab (mcore_ckpt.py, its CPU shims): $TORCH2LAB, default
# ../shared/tools/torch2lab. FRAMEWORKS_PY=<python>: another interpreter instead of the pinned one.
# Results: one line per case, "PASS"/"FAIL", and `RESULT framework=megatron-lm version=<tag>
# case=torch_dist_verify/<case> tensors=N equal=yes|no` (N: Megatron's loaded shards + the tensors torch's DCP
# loader read; scripts/frameworks/run_all.sh collects them). Exit 1 if any failed, 77 if nothing could run.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
TORCH2LAB=$(cd "${TORCH2LAB:-$ROOT/../shared/tools/torch2lab}" 2>/dev/null && pwd) ||
  { echo "SKIP: no torch2lab folder (set TORCH2LAB)"; exit 77; }
MCORE=${MCORE:-core_v0.19.0 core_v0.16.1}
MEGATRON_SRC=${MEGATRON_SRC:-${XDG_CACHE_HOME:-$HOME/.cache}/ucpkit}
DATA=$ROOT/tests/formats/megatron_core/data
LOAD_TIMEOUT=${LOAD_TIMEOUT:-420}
. "$ROOT/scripts/frameworks/env.sh"
frameworks_python "$ROOT"
WORK=$(mktemp -d)
if [ -n "${KEEP:-}" ]; then echo "work folder kept: $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
COMMON="--hidden 16 --vocab 64 --layers 2 --gbs 2 --no-rng"
failed=0

# megatron_src TAG and the Megatron runs' environment MENV: scripts/frameworks/env.sh.
MENV=$MEGATRON_ENV

# run_until LOG PATTERN TIMEOUT cmd...: runs cmd (its own process group) with output to LOG until a line
# matches PATTERN or TIMEOUT seconds pass, then ends that process group (Megatron's spawned gloo ranks
# can stay alive after rank 0 has printed its result).
run_until() {
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
  echo "RESULT framework=megatron-lm version=$TAG case=torch_dist_verify/$1 tensors=$2 equal=$3"
}

# case NAME MODEL VARIANT "ucp-load layout options" "mcore_ckpt.py model+layout options"
case_() {
  name=$1; model=$2; variant=$3; layout=$4; margs=$5
  if [ -n "${CASES:-}" ]; then case " $CASES " in *" $name "*) ;; *) return ;; esac; fi
  # An older line reads only its own line's saves: Megatron-Core 0.19 keeps the common state inside the DCP
  # files (no common.pt, its own saves included), which 0.16.1's load_common_state_dict cannot read
  # (FileNotFoundError: .../common.pt), and ucp-load writes the source's line.
  case "$TAG:$model" in core_v0.16*:*_v016) ;; core_v0.16*:*) return ;; esac
  d=$WORK/$TAG/$name
  mkdir -p "$d"
  cp -r "$DATA/$model/fully_reshardable.truth" "$d/src.truth"
  "$BUILD/bin/ucp-union" --input "$DATA/$model/$variant" --output "$d/u" > "$d/union.log" 2>&1 || { echo "FAIL $name: ucp-union"; tail -3 "$d/union.log"; result "$name" 0 no; failed=1; return; }
  # shellcheck disable=SC2086
  "$BUILD/bin/ucp-load" --input "$d/u" --format torch_dist $layout --output "$d/td" > "$d/load.log" 2>&1 || { echo "FAIL $name: ucp-load"; tail -3 "$d/load.log"; result "$name" 0 no; failed=1; return; }
  cp "$ROOT/scripts/verify/megatron_core_load_verify.py" "$d/"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  run_until "$d/mcore_load.log" "reshard-load check:" "$LOAD_TIMEOUT" \
    env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 PYTHONPATH="$TORCH2LAB/shims:$SRC" TORCH2LAB="$TORCH2LAB" $MENV \
    "$FRAMEWORKS_PY" "$d/megatron_core_load_verify.py" load --ckpt "$d/td" --truth "$d/src.truth" --check-optim --require-all $COMMON $margs
  t1=$(date +%s)
  check=$(grep -a "reshard-load check:" "$d/mcore_load.log" | tail -1)
  # shellcheck disable=SC2086
  timeout 300 env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 PYTHONPATH="$TORCH2LAB/shims:$SRC" TORCH2LAB="$TORCH2LAB" $MENV \
    "$FRAMEWORKS_PY" "$d/megatron_core_load_verify.py" truth --ckpt "$d/td" --out "$d/td.truth" > "$d/truth.log" 2>&1
  cmp=$(python3 - "$d/src.truth/manifest.json" "$d/td.truth/manifest.json" <<'EOF'
import json, sys
try:
    a = json.load(open(sys.argv[1]))["tensors"]; b = json.load(open(sys.argv[2]))["tensors"]
except Exception as e:
    print("no truth of the output (%s)" % e); sys.exit(0)
bad = [k for k in a if k not in b or a[k] != b[k]] + [k for k in b if k not in a]
print("torch DCP loader: %d tensors, %d differ%s" % (len(a), len(bad), (" (first: %s)" % bad[0]) if bad else ""))
EOF
)
  shards=$(echo "$check" | sed -n 's/.*: \([0-9]*\) shards compared.*/\1/p')
  ntensors=$(echo "$cmp" | sed -n 's/.*: \([0-9]*\) tensors, 0 differ.*/\1/p')
  ok=1
  case "$check" in *", 0 mismatches"*) ;; *) ok=0 ;; esac
  case "$check" in *" 0 shards compared"*) ok=0 ;; esac
  case "$cmp" in *", 0 differ"*) ;; *) ok=0 ;; esac
  if [ $ok = 1 ]; then
    echo "PASS $name ($layout): ${check#*: }; $cmp; load $((t1 - t0)) s"
    result "$name" $((shards + ntensors)) yes
  else
    echo "FAIL $name ($layout): ${check:-no check line} ; $cmp"; tail -5 "$d/mcore_load.log"; tail -3 "$d/truth.log"
    result "$name" $((${shards:-0} + ${ntensors:-0})) no
    failed=1
  fi
}

# resume_ NAME "save layout+model options" "ucp-load layout" "resume layout+model options" (issue 47, resume
# equivalence): Megatron-LM trains from scratch (its own train_step, 2 steps) and saves dp_reshardable with a
# fully_reshardable copy of the same state, its RNG state included (default flags); ucp-load converts the
# dp_reshardable save to another layout; Megatron resumes at that layout with its default flags twice, from
# our output and from its own fully_reshardable save (its own reshard-on-load), and trains 3 more steps on the
# same seeded batches: the iteration, learning rate and every loss line must be equal, character for character.
resume_() {
  name=$1; sargs=$2; layout=$3; rargs=$4
  if [ -n "${CASES:-}" ]; then case " $CASES " in *" $name "*) ;; *) return ;; esac; fi
  case "$TAG" in core_v0.16*) return ;; esac  # the newest line; 0.16.1 is judged by the load cases
  d=$WORK/$TAG/$name
  mkdir -p "$d"
  cp "$ROOT/scripts/verify/megatron_core_load_verify.py" "$d/"
  RCOMMON="--hidden 16 --vocab 64 --layers 2 --gbs 2 --train"
  # shellcheck disable=SC2086
  timeout 900 env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 PYTHONPATH="$TORCH2LAB/shims:$SRC" TORCH2LAB="$TORCH2LAB" $MENV \
    "$FRAMEWORKS_PY" "$d/megatron_core_load_verify.py" save --out "$d/src" --fully-reshardable-copy "$d/full" --steps 2 \
    $RCOMMON $sargs > "$d/save.log" 2>&1 || { echo "FAIL $name: Megatron's save"; tail -5 "$d/save.log"; result "$name" 0 no; failed=1; return; }
  # shellcheck disable=SC2086
  (cd "$d" && "$BUILD/bin/ucp-load" --input src --format torch_dist $layout --output td) > "$d/load.log" 2>&1 ||
    { echo "FAIL $name: ucp-load"; tail -3 "$d/load.log"; result "$name" 0 no; failed=1; return; }
  for run in ours:td megatron:full; do
    # shellcheck disable=SC2086
    timeout 900 env -i PATH="$PATH" HOME="$HOME" LANG=C.UTF-8 PYTHONPATH="$TORCH2LAB/shims:$SRC" TORCH2LAB="$TORCH2LAB" $MENV \
      "$FRAMEWORKS_PY" "$d/megatron_core_load_verify.py" resume --ckpt "$d/${run#*:}" --steps 3 $RCOMMON $rargs \
      > "$d/${run%%:*}.log" 2>&1
    grep -aE "^(resumed iteration|train step)" "$d/${run%%:*}.log" | sort > "$d/${run%%:*}.lines"
  done
  steps=$(grep -c "^train step" "$d/megatron.lines")
  if [ "$steps" -gt 0 ] && cmp -s "$d/ours.lines" "$d/megatron.lines"; then
    echo "PASS $name ($layout): resumed from ucp-load's output = Megatron's own reshard-on-load: $(grep -m1 '^resumed' "$d/ours.lines"); $steps loss lines equal, last: $(grep '^train step' "$d/ours.lines" | tail -1)"
    result "$name" "$steps" yes
  else
    echo "FAIL $name ($layout): resumes differ"; diff "$d/ours.lines" "$d/megatron.lines" | head -8; tail -3 "$d/ours.log"
    result "$name" "$steps" no
    failed=1
  fi
}

GPT="--heads 4 --groups 4"
LLAMA="--heads 4 --groups 2 --extra --disable-bias-linear"
MOE="--moe --experts 4 --heads 4 --groups 2 --grouped-gemm"
any=0
for TAG in $MCORE; do
  SRC=$(megatron_src "$TAG") || { echo "NOT RUN megatron-lm $TAG: no source tree in $MEGATRON_SRC/megatron-lm-$TAG and no MEGATRON_GIT to make it"; continue; }
  any=1
  echo "== Megatron-LM $TAG ($SRC) on $("$FRAMEWORKS_PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)"
  case_ gpt_same_dp gpt_tp2_pp2 dp_reshardable "" "--tp 2 --pp 2 $GPT"
  case_ gpt_tp1pp1 gpt_tp2_pp2 fully_reshardable "--tp 1 --pp 1 --dp 1" "--tp 1 --pp 1 $GPT"
  case_ gpt_tp2pp1 gpt_tp2_pp2 fully_reshardable "--tp 2 --pp 1 --dp 1" "--tp 2 --pp 1 $GPT"
  case_ gpt_tp1pp2 gpt_tp2_pp2 fully_reshardable "--tp 1 --pp 2 --dp 1" "--tp 1 --pp 2 $GPT"
  case_ moe_same_dp moe_ep2 dp_reshardable "" "--ep 2 --dp 2 $MOE"
  case_ moe_ep1 moe_ep2 fully_reshardable "--ep 1 --dp 2" "--ep 1 --dp 2 $MOE"
  case_ moe_tp2ep2 moe_ep2 fully_reshardable "--tp 2 --ep 2 --dp 2" "--tp 2 --ep 2 --dp 2 $MOE"
  # expert tensor parallelism (issue 47): Megatron-LM's default ETP = TP at TP 2; kept, then written at TP 1
  # (ETP 1: --etp's default follows TP when the source's ETP was its TP), then TP 2 with --etp 1
  case_ moe_etp_same_dp moe_tp2_etp2 dp_reshardable "" "--tp 2 --ep 2 --etp 2 --dp 2 $MOE"
  case_ moe_etp_tp1 moe_tp2_etp2 fully_reshardable "--tp 1 --dp 2" "--tp 1 --ep 2 --etp 1 --dp 2 $MOE"
  case_ moe_etp1_tp2 moe_tp2_etp2 fully_reshardable "--etp 1" "--tp 2 --ep 2 --etp 1 --dp 2 $MOE"
  case_ llama_same_dp llama_gqa_tp2_dp2_v016 dp_reshardable "" "--tp 2 --dp 2 $LLAMA"
  resume_ resume_gpt_tp2_tp1 "--tp 2 --dp 1 $GPT" "--tp 1 --dp 2" "--tp 1 --dp 2 $GPT"
  resume_ resume_gpt_tp2_pp2 "--tp 2 --dp 1 $GPT" "--tp 1 --pp 2 --dp 1" "--tp 1 --pp 2 --dp 1 $GPT"
  # MoE at TP 2 with Megatron-LM's default ETP (= TP): MoE with TP needs sequence parallelism, which the torch
  # norm of this CPU set-up refuses (transformer/torch_norm.py:50 at core_v0.19.0); megatron_core_load_verify.py
  # builds the same norm marked for sequence parallelism as Megatron's Apex norm is
  # (allow_sequence_parallel_torch_norm), in every run compared. To TP 1 (ETP 1) at EP 4; to EP 4 at TP 2 with
  # ETP 1 (EP above DP, Megatron's expert grid); to PP 2 with 4 layers (with 2, the first stage holds only the
  # dense layer 0, and Megatron's CPU optimizer then fails before loading anything: an expert optimizer without
  # parameters has no Adam step, `assert len(steps) == 1` at optimizer/distrib_optimizer.py:839).
  MOE_TP2="--tp 2 --dp 2 --ep 2 --etp 2 --gbs 4 $MOE"
  resume_ resume_moe_tp2_tp1_ep4 "$MOE_TP2" "--tp 1 --ep 4 --dp 4" "--tp 1 --dp 4 --ep 4 --gbs 4 $MOE"
  resume_ resume_moe_etp2_etp1_ep4 "$MOE_TP2" "--etp 1 --ep 4" "--tp 2 --dp 2 --ep 4 --etp 1 --gbs 4 $MOE"
  resume_ resume_moe_tp2_pp2 "$MOE_TP2 --layers 4" "--tp 1 --pp 2 --ep 2 --dp 2" \
    "--tp 1 --pp 2 --dp 2 --ep 2 --gbs 4 --layers 4 $MOE"
  # MoE at TP 1, EP 2 -> EP 4, not EP 1: Megatron's own load of its EP 2 save at EP 1 fails (KeyError
  # 'optimizer', optimizer/distrib_optimizer.py:962: the save's chained expert optimizer against one unchained
  # part), so there is no reference for EP 1; ucp-load's EP 1 output resumes (issue 47 notes).
  resume_ resume_moe_ep2_ep4 "--tp 1 --dp 4 --ep 2 --gbs 4 $MOE" "--ep 4 --dp 4" "--tp 1 --dp 4 --ep 4 --gbs 4 $MOE"
  case_ llama_tp1dp2 llama_gqa_tp2_dp2_v016 fully_reshardable "--tp 1 --dp 2" "--tp 1 --dp 2 $LLAMA"
done
[ $any = 1 ] || exit 77
exit $failed
