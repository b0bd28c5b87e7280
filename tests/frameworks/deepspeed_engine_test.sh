#!/usr/bin/env bash
# DeepSpeed 0.19.8's real engine as the judge of ucp-union and ucp-load (issue 48; label `frameworks`,
# docs/frameworks.md). DeepSpeed is installed from PyPI into the pinned environment (scripts/frameworks/setup.sh)
# and runs on CPU gloo ranks (scripts/frameworks/ds_train_loop.py, which cites the DeepSpeed file:line of every
# save and load option used):
#  1. it trains three cases on 2 ranks and saves them with engine.save_checkpoint: dense ZeRO-1, dense ZeRO-3,
#     native MoE (deepspeed.moe.layer.MoE, 4 experts, EP 2, ZeRO-1); each run goes on 2 steps (the continuation);
#  2. ucp-union of each equals DeepSpeed's own ds_to_universal (checkpoint/ds_to_universal.py, run from the
#     environment's python): fp32, exp_avg, exp_avg_sq, step and zero/optimizer_state.pt, bit for bit (native
#     MoE: ds_to_universal fails, its error is printed; ucp-union is then judged by the engine's state alone);
#     and holds exactly the state the engine held when it saved (safe_get_full_fp32_param /
#     safe_get_full_optimizer_state);
#  3. ucp-load writes each for 4 ranks at another ZeRO stage and/or EP (from the universal folder or directly
#     from the checkpoint); the engine at that layout load_checkpoint's our output: the state it holds (weights,
#     fp32 master, Adam moments, Adam and global step) equals the source run's bit for bit, and its next step's
#     losses equal the source run's continuation bit for bit (the same micro-batches), the second step's losses
#     and the state then within 1e-5 (DP 4 reduces the gradients in another order than DP 2 x 2 micro-batches: a
#     loss of the second step 1 ulp apart, as DeepSpeed's own universal load gives it, failed a CI run on 2026-11-29);
#     where DeepSpeed's own universal load can reach the layout (ZeRO-1 -> ZeRO-2, ZeRO-3 -> ZeRO-3), the engine
#     loading ds_to_universal's folder ("checkpoint": {"load_universal": true}) holds the same state, and trains
#     on to the same losses and state as the engine that loaded ours. Where it cannot (ZeRO-1 <-> ZeRO-3), its
#     refusal is printed;
#  4. pec-save stores the native-MoE checkpoint (all 4 experts of each MoE layer: a full save) and pec-restore
#     rebuilds it in a fresh folder (docs/pec.md): byte for byte the saved step; the engine at the source's layout
#     (2 ranks, EP 2, ZeRO-1) load_checkpoint's it and holds the source run's state, and its next 2 steps' losses
#     and the state then equal the source run's continuation bit for bit.
# The tools run as users run them: from another folder, relative paths. Exit 77 (skipped) when the framework
# environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
py=$FRAMEWORKS_PY
loop=$root/scripts/frameworks/ds_train_loop.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
start=$SECONDS
"$py" "$loop" save --out src --world 2 >save.log 2>&1 || { tail -30 save.log; exit 1; }
grep '^ds_train_loop:' save.log
t_save=$SECONDS
"$py" "$loop" universal --out src >universal.log 2>&1 || { tail -30 universal.log; exit 1; }
grep '^ds_to_universal:' universal.log
python3 - universal.log <<'PY'
import json, sys
res = {j["case"]: j for j in (json.loads(line.split(": ", 1)[1]) for line in open(sys.argv[1])
                              if line.startswith("ds_to_universal: "))}
assert res["dense"]["ok"] and res["zero3"]["ok"], res
PY
t_universal=$SECONDS
mkdir elsewhere t
for c in dense zero3 moe; do
  (cd elsewhere && "$build/bin/ucp-union" -q --input "../src/$c/ckpt" --output "../src/$c/u" 2>>../union.log) ||
    { cat union.log; exit 1; }
done
load() { (cd elsewhere && "$build/bin/ucp-load" -q --input "$1" --output "../t/$2" "${@:3}"); }
load ../src/dense/u dense_z3 --dp 4 --zero-stage 3       # universal folder in, ZeRO-1 -> ZeRO-3
load ../src/dense/ckpt dense_z2 --dp 4 --zero-stage 2    # the checkpoint in (direct), ZeRO-1 -> ZeRO-2
load ../src/zero3/ckpt zero3_z2 --dp 4 --zero-stage 2    # direct, ZeRO-3 -> ZeRO-2
load ../src/zero3/u zero3_z3 --dp 4                      # ZeRO-3 kept (the source's)
load ../src/moe/u moe_ep4 --dp 4 --ep 4                  # EP 2 -> 4
load ../src/moe/ckpt moe_ep2_z2 --dp 4 --zero-stage 2    # direct, EP 2 kept, expert-DP 1 -> 2, ZeRO-2
# NAME:CASE:CHECKPOINT:ZERO:EP:LOAD_UNIVERSAL (the engine's layout: 4 ranks; jobs2: 2 ranks, the source's)
jobs=(dense_z3:dense:t/dense_z3:3:0:0 dense_z3_ds:dense:src/dense/dsu:3:0:1
      dense_z2:dense:t/dense_z2:2:0:0 dense_z2_ds:dense:src/dense/dsu:2:0:1
      zero3_z2:zero3:t/zero3_z2:2:0:0 zero3_z2_ds:zero3:src/zero3/dsu:2:0:1
      zero3_z3:zero3:t/zero3_z3:3:0:0 zero3_z3_ds:zero3:src/zero3/dsu:3:0:1
      moe_ep4:moe:t/moe_ep4:1:4:0 moe_ep2_z2:moe:t/moe_ep2_z2:2:2:0)
jobs2=(moe_pec:moe:t/moe_pec:1:2:0)
resume() {  # WORLD JOB...: the engine at WORLD ranks loads each job's checkpoint and trains on
  local world=$1; shift
  "$py" "$loop" resume --out r --world "$world" "${@/#/--job=}" >"resume$world.log" 2>&1 ||
    { tail -30 "resume$world.log"; exit 1; }
  grep '^ds_train_loop:' "resume$world.log"
}
resume 4 "${jobs[@]}"
t_resume=$SECONDS
(cd elsewhere && "$build/bin/pec-save" -q --input ../src/moe/ckpt --output ../pec_store --policy sequential --k 4 &&
  "$build/bin/pec-restore" -q --input ../pec_store --output ../t/moe_pec --report ../t/moe_pec.json) 2>pec.log ||
  { cat pec.log; exit 1; }
tag=$(cat src/moe/ckpt/latest)
cmp src/moe/ckpt/latest t/moe_pec/latest && diff -r "src/moe/ckpt/$tag" "t/moe_pec/$tag" ||
  { echo "pec-restore's output differs from the checkpoint pec-save stored"; exit 1; }
echo "pec-restore: $tag ($(find "t/moe_pec/$tag" -type f | wc -l) files) byte for byte the saved checkpoint's"
resume 2 "${jobs2[@]}"
t_pec=$SECONDS
checks=()
for c in dense zero3 moe; do  # moe: only if ds_to_universal converted it
  if [[ $c != moe ]] || grep -q '"case": "moe", "ok": true' universal.log; then
    checks+=("$c: ucp-union vs ds_to_universal|same-universal|src/$c/u|src/$c/dsu/global_step3_universal")
  fi
done
for c in dense zero3 moe; do
  checks+=("$c: ucp-union vs the engine's state at the save|union-state|src/$c/u|src/$c/truth")
done
for j in "${jobs[@]}" "${jobs2[@]}"; do
  IFS=: read -r name case _ _ _ universal <<<"$j"
  if [[ $universal == 1 ]]; then
    [[ -f r/$name/refused.json ]] && continue
    ours=${name%_ds}
    checks+=("$name (DeepSpeed's universal load) loaded vs the source run|same-state|r/$name/loaded|src/$case/truth")
    checks+=("$ours: 2 steps on from ours vs from DeepSpeed's universal load, losses|same-losses|r/$ours|r/$name")
    checks+=("$ours: 2 steps on from ours vs from DeepSpeed's universal load, state|same-state|r/$ours/after|r/$name/after")
  else
    tool=ucp-load after=close-state second=close-losses
    # the source's layout: bit for bit after the steps too
    [[ $name == *_pec ]] && tool=pec-restore after=same-state second=same-losses
    checks+=("$name ($tool) loaded vs the source run|same-state|r/$name/loaded|src/$case/truth")
    checks+=("$name: the first step on vs the source run's, losses|same-losses|r/$name|src/$case/cont|4")
    checks+=("$name: the second step on vs the source run's, losses|$second|r/$name|src/$case/cont|5")
    checks+=("$name: 2 steps on vs the source run's 2 more steps, state|$after|r/$name/after|src/$case/cont")
  fi
done
"$py" "$loop" check "${checks[@]}" >check.out 2>check.log || { cat check.out; tail -5 check.log; exit 1; }
cat check.out
# DeepSpeed's own universal load reaches ZeRO-1 -> 2 and 3 -> 3 (both checked above); what it refuses is printed
for name in dense_z2_ds zero3_z3_ds; do
  if [[ -f r/$name/refused.json ]]; then cat "r/$name/refused.json"; exit 1; fi
done
for name in dense_z3_ds zero3_z2_ds; do
  if [[ -f r/$name/refused.json ]]; then echo "$name: DeepSpeed's universal load refused: $(cat "r/$name/refused.json")"; fi
done
echo "deepspeed engine: ${#checks[@]} checks equal in $((SECONDS - start)) s (save $((t_save - start)) s," \
  "ds_to_universal $((t_universal - t_save)) s, ucp-union/ucp-load and the resumes $((t_resume - t_universal)) s," \
  "pec-save/pec-restore and the resume at 2 ranks $((t_pec - t_resume)) s, checks $((SECONDS - t_pec)) s)"
echo "RESULT framework=deepspeed version=$("$py" -c 'import importlib.metadata as m; print(m.version("deepspeed"))') case=deepspeed_engine tensors=$(python3 -c 'import re, sys; t = sys.stdin.read(); print(sum(int(n) for n in re.findall(r"\d+ params, (\d+) files", t)) + sum(4 * int(n) for n in re.findall(r"(\d+) params x \([^)]*\)(?:, Adam step [^:]*, global step [^:]*)?: 0 differ", t)))' <check.out) equal=yes"
