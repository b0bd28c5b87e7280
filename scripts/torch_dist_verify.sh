#!/bin/sh
# ucp-load --format torch_dist checked by Megatron-LM's own loader (issue 30 part A; not run in CI:
# needs the torch2lab chroot, a few minutes per case on 2 cores). For each case:
#   committed fixture (tests/formats/megatron_core/data, written by Megatron's save_checkpoint)
#   -> ucp-union -> ucp-load --format torch_dist [layout] -> Megatron's load_checkpoint at that layout
#   (torch2lab mcore_ckpt.py load --check-optim: every loaded local model shard and fully_reshardable
#   optimizer-state shard compared bit-exact with the source's truth, "N shards compared, M mismatches")
#   -> Megatron's load_plain_tensors of our output (mcore_ckpt.py truth) compared with the source's
#   truth: every tensor's shape, dtype and sha256 (tensor count and mismatches printed).
# The dp_reshardable cases are the dp_reshardable -> fully_reshardable conversion of the issue
# (same layout).
#
#   scripts/torch_dist_verify.sh [BUILD]     # BUILD defaults to build/ (ucp-union, ucp-load in BUILD/bin)
#   CASES="gpt_tp1pp1 moe_ep1" scripts/torch_dist_verify.sh   # only these cases
# Runs as root (chroot). Results: one line per case, "PASS"/"FAIL"; exit 1 if any failed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
LAB=${LAB:-$ROOT/../shared/tools/torch2lab/lab.sh}
TRIXIE=${TRIXIE:-/opt/trixie}
DATA=$ROOT/tests/formats/megatron_core/data
WORK=/lab/tdverify
LOAD_TIMEOUT=${LOAD_TIMEOUT:-420}
rm -rf "$TRIXIE$WORK"; mkdir -p "$TRIXIE$WORK"
COMMON="--hidden 16 --vocab 64 --layers 2 --gbs 2 --no-rng"
failed=0

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

# case NAME MODEL VARIANT "ucp-load layout options" "mcore_ckpt.py model+layout options"
case_() {
  name=$1; model=$2; variant=$3; layout=$4; margs=$5
  if [ -n "${CASES:-}" ]; then case " $CASES " in *" $name "*) ;; *) return ;; esac; fi
  d=$TRIXIE$WORK/$name
  mkdir -p "$d"
  cp -r "$DATA/$model/fully_reshardable.truth" "$d/src.truth"
  "$BUILD/bin/ucp-union" --input "$DATA/$model/$variant" --output "$d/u" > "$d/union.log" 2>&1 || { echo "FAIL $name: ucp-union"; tail -3 "$d/union.log"; failed=1; return; }
  # shellcheck disable=SC2086
  "$BUILD/bin/ucp-load" --input "$d/u" --format torch_dist $layout --output "$d/td" > "$d/load.log" 2>&1 || { echo "FAIL $name: ucp-load"; tail -3 "$d/load.log"; failed=1; return; }
  t0=$(date +%s)
  # shellcheck disable=SC2086
  run_until "$d/mcore_load.log" "reshard-load check:" "$LOAD_TIMEOUT" \
    "$LAB" mcore_ckpt.py load --ckpt $WORK/$name/td --truth $WORK/$name/src.truth --check-optim --require-all $COMMON $margs
  t1=$(date +%s)
  check=$(grep -a "reshard-load check:" "$d/mcore_load.log" | tail -1)
  run_until "$d/truth.log" "^truth:" 300 env TORCH2LAB_PORT=0 "$LAB" mcore_ckpt.py truth --ckpt $WORK/$name/td --out $WORK/$name/td.truth
  cmp=$(python3 - "$d/src.truth/manifest.json" "$d/td.truth/manifest.json" <<'EOF'
import json, sys
try:
    a = json.load(open(sys.argv[1]))["tensors"]; b = json.load(open(sys.argv[2]))["tensors"]
except Exception as e:
    print("no truth of the output (%s)" % e); sys.exit(0)
bad = [k for k in a if k not in b or a[k] != b[k]] + [k for k in b if k not in a]
print("load_plain_tensors: %d tensors, %d differ%s" % (len(a), len(bad), (" (first: %s)" % bad[0]) if bad else ""))
EOF
)
  ok=1
  case "$check" in *", 0 mismatches"*) ;; *) ok=0 ;; esac
  case "$check" in *" 0 shards compared"*) ok=0 ;; esac
  case "$cmp" in *", 0 differ"*) ;; *) ok=0 ;; esac
  if [ $ok = 1 ]; then echo "PASS $name ($layout): ${check#*: }; $cmp; load $((t1 - t0)) s"
  else echo "FAIL $name ($layout): ${check:-no check line} ; $cmp"; tail -5 "$d/mcore_load.log"; failed=1; fi
}

GPT="--heads 4 --groups 4"
LLAMA="--heads 4 --groups 2 --extra --disable-bias-linear"
MOE="--moe --experts 4 --heads 4 --groups 2 --grouped-gemm"
case_ gpt_same_dp gpt_tp2_pp2 dp_reshardable "" "--tp 2 --pp 2 $GPT"
case_ gpt_tp1pp1 gpt_tp2_pp2 fully_reshardable "--tp 1 --pp 1 --dp 1" "--tp 1 --pp 1 $GPT"
case_ gpt_tp2pp1 gpt_tp2_pp2 fully_reshardable "--tp 2 --pp 1 --dp 1" "--tp 2 --pp 1 $GPT"
case_ gpt_tp1pp2 gpt_tp2_pp2 fully_reshardable "--tp 1 --pp 2 --dp 1" "--tp 1 --pp 2 $GPT"
case_ moe_same_dp moe_ep2 dp_reshardable "" "--ep 2 --dp 2 $MOE"
case_ moe_ep1 moe_ep2 fully_reshardable "--ep 1 --dp 2" "--ep 1 --dp 2 $MOE"
case_ moe_tp2ep2 moe_ep2 fully_reshardable "--tp 2 --ep 2 --dp 2" "--tp 2 --ep 2 --dp 2 $MOE"
case_ llama_same_dp llama_gqa_tp2_dp2_v016 dp_reshardable "" "--tp 2 --dp 2 $LLAMA"
case_ llama_tp1dp2 llama_gqa_tp2_dp2_v016 fully_reshardable "--tp 1 --dp 2" "--tp 1 --dp 2 $LLAMA"
exit $failed
