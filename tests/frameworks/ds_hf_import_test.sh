#!/usr/bin/env bash
# The DeepSpeed engine as the judge of a Hugging Face import (label `frameworks`, docs/hf.md "DeepSpeed output";
# issue 49): transformers 5.24.0 saves a Llama (untied and tied), a Mixtral, a Qwen3-MoE (one dense layer) and a Qwen2-MoE (shared
# expert) model (ds_hf_import.py models); `ucp-load --format deepspeed --dp 2 --zero-stage 1|3 --param-group` writes
# each as the DeepSpeed engine would have saved it before its first step; DeepSpeed 0.19.8's load_checkpoint of it
# on 2 CPU ranks, then 3 training steps, gives the same losses (torch.equal, every step) as the run that started
# from the weights in memory (ds_hf_import.py resume). Our output exported back to Hugging Face compares equal to
# the original bit for bit (ucp-diff), and ucp-diff of the folder and our checkpoint compares them in transformers'
# names (equal; the --param-group lr the one difference). A Llama with tied embeddings too (its head the embedding's tensor in the
# module, shared_params as the engine records it). Refusals: --param-group without a Hugging Face input or not
# JSON, ZeRO 0 (the engine keeps that optimizer in its model file), TP 2 (exit 2); nothing
# left. A bf16 folder (a released model's precision) runs with DeepSpeed's bf16 on, at ZeRO 1 and 3. The import's
# --audit lists every module tensor once with the SHA-256 hashlib computes of the tensor DeepSpeed's file holds. Run as users run it: relative paths,
# from another folder, options left out. Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
unset TRIXIE
frameworks_lab "$root" ds_hf_import
py=$FRAMEWORKS_PY
cd "$LAB"
rm -rf m && mkdir -p m run
PYTHONWARNINGS=ignore "$py" "$root/tests/frameworks/ds_hf_import.py" models m > models.log 2>&1 || { tail -30 models.log; exit 1; }
cases=(llama_z1 llama_z2 llama_z3 llama_tied_z1 llama_tied_z3 llama_bf16_z1 llama_bf16_z3 mixtral_z1 mixtral_z3 qwen3_moe_z1 qwen3_moe_z3 qwen2_moe_z1 qwen2_moe_z3)
cd run  # the job's own folder: the model and the output named relative to it
for c in "${cases[@]}"; do
  "$build/bin/ucp-load" -q --input "../m/${c%_z*}" --output "../m/$c" --dp 2 --zero-stage "${c##*_z}" \
    --param-group '{"lr": 0.01}' 2>/dev/null
  [[ -f "../m/$c/config.json" && -f "../m/$c/generation_config.json" && -n "$(ls "../m/$c/global_step0/" | grep model_states)" ]] || { echo "FAIL $c: not written"; exit 1; }
done
cd ..
PYTHONWARNINGS=ignore "$py" "$root/tests/frameworks/ds_hf_import.py" resume m 0.01 "${cases[@]}" > resume.log 2>&1 ||
  { grep -E "FAIL|Error|Exception|terminate" resume.log | tail -20; exit 1; }
grep "^RESULT" resume.log
for c in llama_z3 llama_tied_z1 mixtral_z1 qwen3_moe_z3; do  # the way back: every tensor as the original's
  "$build/bin/ucp-load" -q --input "m/$c" --format hf --output "m/$c.hf" 2>/dev/null
  "$build/bin/ucp-diff" -q "m/${c%_z*}" "m/$c.hf" > /dev/null 2>&1 || { echo "FAIL $c: the export differs from the original"; exit 1; }
done
echo "RESULT round_trip=hf-deepspeed-hf cases=4 equal=bit_for_bit"
# ucp-diff of the folder and our checkpoint compares in transformers' names: equal, or the one setting given.
"$build/bin/ucp-load" -q --input m/mixtral --output m/mixtral_plain --dp 2 --zero-stage 3 2>/dev/null
"$build/bin/ucp-diff" -q m/mixtral m/mixtral_plain 2>/dev/null || { echo "FAIL: ucp-diff of the folder and its import"; exit 1; }
rc=0
"$build/bin/ucp-diff" m/llama m/llama_z1 > diff.txt 2>/dev/null || rc=$?
[[ $rc -eq 3 && $(grep -c "lr: 0.001 vs 0.01" diff.txt) -eq 1 && $(grep -c "^  " diff.txt) -eq 1 ]] ||
  { echo "FAIL: ucp-diff against --param-group's lr: exit $rc"; cat diff.txt; exit 1; }
echo "RESULT ucp_diff=transformers_names equal=yes lr_difference_found=yes"
# The two steps by hand: ucp-union --to-names transformers, then ucp-load (--plan of it; --dry-run counts the same tensors).
"$build/bin/ucp-union" -q --input m/qwen2_moe --to-names transformers --param-group '{"lr": 0.01}' --output m/u_qwen2_moe 2>/dev/null
"$build/bin/ucp-load" --plan --input m/u_qwen2_moe --dp 2 --zero-stage 3 > plan.json
"$build/bin/ucp-load" -q --input m/u_qwen2_moe --dp 2 --zero-stage 3 --output m/qwen2_moe_2step 2>/dev/null
"$build/bin/ucp-diff" -q m/qwen2_moe_2step m/qwen2_moe_z3 > /dev/null 2>&1 ||
  { echo "FAIL: the two-step output differs from the one-step one"; exit 1; }
"$build/bin/ucp-load" --dry-run --json --input m/qwen2_moe --output m/x --dp 2 2>/dev/null > dry.json
"$py" -c 'import json,sys; d=json.load(open("dry.json")); p=json.load(open("plan.json")); sys.exit(0 if d["params"] == 35 and p["load"]["format"] == "deepspeed" else 1)' ||
  { echo "FAIL: --dry-run counts or --plan"; cat dry.json; exit 1; }
echo "RESULT two_steps=ucp-union_to-names_transformers+ucp-load equal=yes dry_run_tensors=35"
expect() {  # expect RC NAME ARGS...: exit RC, nothing left at NAME
  local want=$1 name=$2 rc=0
  shift 2
  "$build/bin/ucp-load" "$@" > /dev/null 2> err.txt || rc=$?
  [[ $rc -eq $want && ! -e $name && $(ls -A m | grep -c ucp-load-universal || true) -eq 0 ]] ||
    { echo "FAIL ucp-load $*: exit $rc (want $want), $(head -1 err.txt)"; exit 1; }
}
expect 2 m/bad1 --input m/llama_z1 --output m/bad1 --dp 2 --param-group '{"lr": 0.01}'
expect 2 m/bad2 --input m/llama --output m/bad2 --dp 2 --param-group 'lr=0.01'
expect 2 m/bad4 --input m/llama_bf16 --output m/bad4 --dp 2 --zero-stage 0
grep -q "give --zero-stage 1, 2 or 3" err.txt || { echo "FAIL --zero-stage 0: $(cat err.txt)"; exit 1; }
expect 2 m/bad5 --input m/llama --output m/bad5 --dp 1 --tp 2
echo "RESULT refusals=4 nothing_left=yes"
# The import's audit: every tensor of the engine's module once, its SHA-256 that of the module tensor DeepSpeed saves.
for c in mixtral llama_bf16; do
  "$build/bin/ucp-load" -q --input "m/$c" --output "m/${c}_audit" --dp 2 --audit "m/$c.audit.json" 2>/dev/null
done
PYTHONWARNINGS=ignore "$py" - <<'PY' 2>&1 | grep -v WARNING
import hashlib, json, sys, torch
for c in ("mixtral", "llama_bf16"):
    audit = json.load(open(f"m/{c}.audit.json"))
    module = torch.load(f"m/{c}_audit/global_step0/mp_rank_00_model_states.pt", weights_only=False)["module"]
    names = [r["name"] for r in audit["tensors"]]
    if sorted(names) != sorted(module) or len(set(names)) != len(names) or audit["totals"]["tensors"] != len(module):
        sys.exit(f"FAIL {c}: the audit's tensors are not the module's, each once")
    for r in audit["tensors"]:
        t = module[r["name"]].contiguous()
        if hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest() != r["sha256"] or list(t.shape) != r["shape"]:
            sys.exit(f"FAIL {c}: {r['name']}: the audit's SHA-256 or shape is not the saved tensor's")
    print(f"RESULT audit={c} tensors={len(names)} sha256_equal_hashlib=yes experts_per_layer={json.dumps(audit['experts_per_layer'])}")
PY
