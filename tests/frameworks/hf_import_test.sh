#!/usr/bin/env bash
# A Hugging Face model into a Megatron-Core layout and back (label `frameworks`, docs/hf.md; issue 49):
# transformers' own save_pretrained writes each family (hf_models.py: Llama GQA bf16, Llama with tied
# embeddings fp32, Qwen2 fp32, Qwen3 bf16, Mixtral fp32 and Qwen3-MoE bf16 with experts per expert, Qwen2-MoE fp32
# with a gated shared expert and a dense layer between its MoE layers; one
# Python process makes them all, one checks all imports, one all round trips: hf_export_check.py,
# hf_round_trip_check.py); `ucp-load --format torch_dist --tp 2 --pp 2` (MoE: `--ep 2 --dp 2`, 8 ranks)
# writes it as a Megatron-Core save directly from the folder (optimizer state as a fresh run's); megatron-core 0.16.1's own
# loader reads that save into its GPTModel, whose every tensor equals the Hugging Face original bit for bit
# and whose logits agree with transformers' within 1e-5 (hf_export_check.py); `ucp-load --format hf` of our
# save gives back every tensor of the original bit for bit, and transformers' model of it computes the
# original's logits exactly (also through Megatron-DeepSpeed at TP 2 x PP 2 x DP 2 for the dense Llama folders);
# the import's --audit lists every tensor once with the SHA-256 of each parameter as
# hf_import_audit_check.py derives it from the original. Run as users run it: relative paths, from the work folder, options left out.
# Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
unset TRIXIE  # transformers 5 is in the pinned environment only
frameworks_lab "$root" hf_import
py=$FRAMEWORKS_PY
cd "$LAB"
quiet() { grep -v "^W1\|^\[rank0\]:W\|[Ww]arning\|Loading weights\|Writing model" || true; }
run_py() {  # one Python process for every case (torch, transformers and Megatron start once); its log filtered
  local rc=0
  PYTHONWARNINGS=ignore "$py" "$@" > py.log 2>&1 || rc=$?
  quiet < py.log
  return "$rc"
}
specs=(llama:llama_bfloat16:bfloat16 llama:llama_float32_tied:float32:tied qwen2:qwen2_float32:float32 qwen3:qwen3_bfloat16:bfloat16
       mixtral:mixtral_float32:float32 qwen3_moe:qwen3_moe_bfloat16:bfloat16 qwen2_moe:qwen2_moe_float32:float32)
run_py "$root/tests/frameworks/hf_models.py" "${specs[@]}"
imports=() trips=() audits=()
for spec in "${specs[@]}"; do
  IFS=: read -r family name _ <<< "$spec"
  layout=(--dp 1)
  [[ $family == mixtral || $family == *_moe ]] && layout=(--ep 2 --dp 2)  # EP within DP: 8 ranks
  "$build/bin/ucp-load" -q --input "$name" --format torch_dist --tp 2 --pp 2 "${layout[@]}" --megatron-version 0.16.1 \
    --output "$name.td" --audit "$name.import.json" 2>&1 | quiet
  "$build/bin/ucp-load" -q --input "$name.td" --format hf --output "$name.back" --audit "$name.audit.json" 2>&1 | quiet
  "$build/bin/ucp-diff" -q "$name" "$name.td" 2>&1 | quiet || { echo "FAIL: ucp-diff calls $name and its import different"; exit 1; }
  # A release checkpoint (weights without a training run): what Megatron's default load_checkpoint takes as
  # pretrained weights, with the job's own optimizer and schedule (docs/hf.md, "Training-ready").
  [[ $(cat "$name.td/latest_checkpointed_iteration.txt") == release && -f $name.td/release/metadata.json ]] ||
    { echo "FAIL: the import of $name is not Megatron's release folder"; exit 1; }
  imports+=("${name}_import" "$name" "$name.td/release")
  trips+=("$name" "$name.back" "$name.audit.json")
  audits+=("$name" "$name.import.json")
done
# Megatron-DeepSpeed (docs/hf.md "Megatron-DeepSpeed output"): the dense Llama folders (GQA bf16, tied fp32) renamed
# for a fresh GPTModelPipe run (ucp-union --to-names megatron-deepspeed), laid out at TP 2 x PP 2 x DP 2 by ucp-load
# --format deepspeed, and Mixtral as GPTModel with native DeepSpeed MoE at EP 2 x DP 2; exported back: the same
# round-trip check as above, bit for bit and logits exactly.
for name in llama_bfloat16 llama_float32_tied mixtral_float32; do
  "$build/bin/ucp-union" -q --input "$name" --to-names megatron-deepspeed --output "$name.mdsu" 2>&1 | quiet
  if [[ $name == mixtral* ]]; then  # native DeepSpeed MoE: GPTModel at TP = PP = 1, experts over EP 2 within DP 2
    "$build/bin/ucp-load" -q --input "$name.mdsu" --format deepspeed --ep 2 --dp 2 --output "$name.mds" 2>&1 | quiet
    ls "$name.mds"/global_step0/layer_[0-3]_expert_[0-3]_mp_rank_00_model_states.pt > /dev/null ||
      { echo "FAIL: $name.mds has not an expert file per layer and expert"; exit 1; }
  else
    "$build/bin/ucp-load" -q --input "$name.mdsu" --format deepspeed --tp 2 --pp 2 --dp 2 --output "$name.mds" 2>&1 | quiet
    ls "$name.mds"/global_step0/layer_0[1-7]-model_0[01]-model_states.pt > /dev/null ||
      { echo "FAIL: $name.mds has not the pipeline layer files of TP 2 x PP 2"; exit 1; }
  fi
  "$build/bin/ucp-load" -q --input "$name.mds" --format hf --output "$name.mds.back" --audit "$name.mds.audit.json" 2>&1 | quiet
  "$build/bin/ucp-diff" -q "$name" "$name.mds" 2>&1 | quiet || { echo "FAIL: ucp-diff calls $name and its Megatron-DeepSpeed import different"; exit 1; }
  trips+=("$name" "$name.mds.back" "$name.mds.audit.json")
  [[ -z $(ls -A . | grep "ucp-fresh-mds\|ucp-names") ]] || { echo "FAIL: scratch folders left beside $name.mdsu"; exit 1; }
done
# What Megatron-DeepSpeed's GPT has no place for is refused naming it, nothing written: Qwen3's q/k norms (and
# Qwen3-MoE's), Qwen2's QKV bias (and Qwen2-MoE's, with its shared expert).
for name in qwen3_bfloat16 qwen2_float32 qwen3_moe_bfloat16 qwen2_moe_float32; do
  for tool in "ucp-union -q" "ucp-load -q --dp 2"; do
    rc=0
    out=$("$build/bin/"$tool --input "$name" --to-names megatron-deepspeed --output "$name.mdsu" 2>&1) || rc=$?
    [[ $rc -eq 1 && ! -e $name.mdsu && $out == *"error: $name: "*"GPT has no place"* && -z $(ls -A . | grep "ucp-") ]] ||
      { echo "FAIL: $tool --to-names megatron-deepspeed of $name: exit $rc: $out"; exit 1; }
  done
done
run_py "$root/tests/frameworks/hf_export_check.py" "${imports[@]}"
run_py "$root/tests/frameworks/hf_round_trip_check.py" "${trips[@]}"
run_py "$root/tests/frameworks/hf_import_audit_check.py" "${audits[@]}"
# ucp-info of an MoE folder states its experts, its dense layers and its shared expert (what the import makes of it).
"$build/bin/ucp-info" --json mixtral_float32 > mixtral.info.json
"$py" -c 'import json, sys; h = json.load(open(sys.argv[1]))["hf"]; assert h["family"] == "mixtral" and h["experts"] == {"count": 4, "top_k": 2, "expert_ffn": 48} and h["layers"] == 4, h' mixtral.info.json ||
  { echo "FAIL: ucp-info of the Mixtral folder"; exit 1; }
"$build/bin/ucp-info" --json qwen2_moe_float32 > qwen2_moe.info.json
"$py" -c 'import json, sys; h = json.load(open(sys.argv[1]))["hf"]; assert h["family"] == "qwen2_moe" and h["dense_layers"] == [1] and h["experts"]["shared_expert_ffn"] == 40, h' qwen2_moe.info.json ||
  { echo "FAIL: ucp-info of the Qwen2-MoE folder"; exit 1; }
# A converter that transposes a projection (Megatron-Bridge#3743's kind of damage): ucp-diff of the original
# against such an export finds it, exit 3, naming the parameter.
cp -r llama_bfloat16.back transposed
PYTHONWARNINGS=ignore "$py" - transposed <<'PY'
import sys
from safetensors.torch import load_file, save_file
f = f"{sys.argv[1]}/model.safetensors"
t = load_file(f)
t["model.layers.2.self_attn.o_proj.weight"] = t["model.layers.2.self_attn.o_proj.weight"].t().contiguous()
save_file(t, f, metadata={"format": "pt"})
PY
set +e
out=$("$build/bin/ucp-diff" llama_bfloat16 transposed 2>&1)
rc=$?
set -e
[[ $rc -eq 3 && $out == *decoder.layers.2.self_attention.linear_proj.weight* ]] ||
  { echo "FAIL: ucp-diff of a transposed projection: exit $rc"; echo "$out"; exit 1; }
echo "CONTROL case=transposed_projection ucp_diff_exit=3 (a negative control, not a RESULT row)"
# Experts swapped in one layer (a converter that loses the expert order): exit 3, naming an expert.
cp -r mixtral_float32.back swapped
PYTHONWARNINGS=ignore "$py" - swapped <<'PY'
import sys
from safetensors.torch import load_file, save_file
f = f"{sys.argv[1]}/model.safetensors"
t = load_file(f)
a, b = (f"model.layers.1.block_sparse_moe.experts.{e}.w2.weight" for e in (0, 1))
t[a], t[b] = t[b], t[a]
save_file(t, f, metadata={"format": "pt"})
PY
set +e
out=$("$build/bin/ucp-diff" mixtral_float32 swapped 2>&1)
rc=$?
set -e
[[ $rc -eq 3 && $out == *decoder.layers.1.mlp.experts.experts.0.linear_fc2.weight* ]] ||
  { echo "FAIL: ucp-diff of swapped experts: exit $rc"; echo "$out"; exit 1; }
echo "CONTROL case=swapped_experts ucp_diff_exit=3 (a negative control, not a RESULT row)"
