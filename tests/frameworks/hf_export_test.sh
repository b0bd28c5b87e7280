#!/usr/bin/env bash
# ucp-load --format hf judged by the frameworks (label `frameworks`, docs/hf.md; issue 49): transformers
# 5's own from_pretrained loads our Hugging Face folder with no missing or unexpected key, every tensor
# equals bit for bit the one derived from the tensors Megatron-Core's own loader reads from the source,
# and the logits of the two models on a fixed batch agree within 1e-5 (fp32, CPU): hf_export_check.py.
# Sources: the committed Megatron-Core saves (core_v0.16.1 Llama GQA TP 2 x DP 2 in both optimizer forms;
# core_v0.19.0 GPT with biases TP 2 x PP 2, and an all-MoE model at EP 2 x DP 2, a dense Llama-style model at
# TP 2 x DP 2 and a Qwen2-MoE-shaped model (a dense layer, then an MoE layer with a gated shared expert) at EP 2 x DP 2
# that Megatron-LM trained 2 steps (scripts/fixtures/mcore_trained_fixtures.sh), which megatron-core 0.16.1 cannot
# open: their recorded truth) and a
# Megatron-DeepSpeed Llama (tests/formats/fixtures.py llama_tp2pp2dp2,
# read directly). Run the way users run it: relative paths, from the output's folder, options left out.
# Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
unset TRIXIE  # transformers 5 is in the pinned environment only
frameworks_lab "$root" hf_export
py=$FRAMEWORKS_PY
cd "$LAB"
ln -s "$root/tests/formats/megatron_core/data" data
cases=()
for form in fully_reshardable dp_reshardable; do
  "$build/bin/ucp-load" -q --input data/llama_gqa_tp2_dp2_v016/$form --format hf --output llama_$form
  cases+=(llama_gqa_v016_$form llama_$form data/llama_gqa_tp2_dp2_v016/$form)
done
"$build/bin/ucp-load" -q --input data/gpt_tp2_pp2/fully_reshardable --format hf --output gpt
cases+=(gpt_biases_v019 gpt data/gpt_tp2_pp2/fully_reshardable.truth/tensors.safetensors)
"$build/bin/ucp-load" -q --input data/mixtral_ep2_trained/dp_reshardable --format hf --output mixtral
cases+=(mixtral_trained_v019 mixtral data/mixtral_ep2_trained/dp_reshardable.truth/tensors.safetensors)
"$build/bin/ucp-load" -q --input data/llama_tp2_trained/dp_reshardable --format hf --output llama_trained
cases+=(llama_trained_v019 llama_trained data/llama_tp2_trained/dp_reshardable.truth/tensors.safetensors)
"$build/bin/ucp-load" -q --input data/qwen2_moe_ep2_trained/dp_reshardable --format hf --output qwen2_moe_trained
cases+=(qwen2_moe_trained_v019 qwen2_moe_trained data/qwen2_moe_ep2_trained/dp_reshardable.truth/tensors.safetensors)
"$build/bin/ucp-load" -q --input data/qwen2_moe_ep2_trained/dp_reshardable --format hf --hf-experts fused --output qwen2_moe_fused
cases+=(qwen2_moe_trained_v019_fused qwen2_moe_fused data/qwen2_moe_ep2_trained/dp_reshardable.truth/tensors.safetensors)
"$build/bin/ucp-diff" -q qwen2_moe_trained qwen2_moe_fused 2>/dev/null || { echo "FAIL: ucp-diff of the Qwen2-MoE per-expert and fused exports"; exit 1; }
# The fused expert layout (transformers 5's in-memory gate_up_proj / down_proj): loaded as it is, the same
# model; ucpkit reads it back as the same checkpoint as the per-expert folder.
"$build/bin/ucp-load" -q --input data/mixtral_ep2_trained/dp_reshardable --format hf --hf-experts fused --output mixtral_fused
cases+=(mixtral_trained_v019_fused mixtral_fused data/mixtral_ep2_trained/dp_reshardable.truth/tensors.safetensors)
"$build/bin/ucp-diff" -q mixtral mixtral_fused 2>/dev/null || { echo "FAIL: ucp-diff of the per-expert and fused exports"; exit 1; }
rc=0
"$build/bin/ucp-load" -q --input mixtral --format dcp --hf-experts fused --output bad 2>/dev/null || rc=$?
[[ $rc -eq 2 && ! -e bad ]] || { echo "FAIL: --hf-experts with --format dcp: exit $rc"; exit 1; }
ds=$build/fixtures/formats/llama_tp2pp2dp2
if [[ -d $ds ]]; then
  "$build/bin/ucp-load" -q --input "$ds" --format hf --output ds_llama
  "$build/bin/ucp-load" -q --input "$ds" --format torch_dist --megatron-version 0.16.1 --tp 1 --pp 1 --dp 1 --output ds_td
  cases+=(megatron_deepspeed_llama ds_llama "ds_td/iter_$(printf %07d "$(cat ds_td/latest_checkpointed_iteration.txt)")")
fi
rc=0
PYTHONWARNINGS=ignore "$py" "$root/tests/frameworks/hf_export_check.py" "${cases[@]}" > check.log 2>&1 || rc=$?
grep -v "^W1\|^\[rank0\]:W\|[Ww]arning\|Loading weights" check.log || true
exit "$rc"
