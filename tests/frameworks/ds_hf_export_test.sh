#!/usr/bin/env bash
# The DeepSpeed engine as the judge of a Hugging Face export (label `frameworks`, docs/hf.md; issue 49): DeepSpeed
# 0.19.8 trains transformers' own LlamaForCausalLM at ZeRO-1 and ZeRO-3 and MixtralForCausalLM at ZeRO-1 on 2 CPU
# ranks and saves (ds_hf_models.py: the module names are the Hugging Face names, config.json beside the checkpoint
# as the HF Trainer leaves it); `ucp-load --format safetensors` writes the weights under those names, the config is
# copied in, and transformers' from_pretrained of that folder reports no missing or unexpected key and computes the
# engine's own logits on a fixed batch exactly (torch.equal). `--format hf` does not take such a checkpoint yet (it
# reads Megatron-Core names; docs/hf.md "Not done yet"). Run as users run it: relative paths, options left out.
# Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
unset TRIXIE
frameworks_lab "$root" ds_hf_export
py=$FRAMEWORKS_PY
cd "$LAB"
cases=(llama_z1 llama_z3 mixtral_z1)
PYTHONWARNINGS=ignore "$py" "$root/tests/frameworks/ds_hf_models.py" . "${cases[@]}" > train.log 2>&1 ||
  { tail -30 train.log; exit 1; }
grep "^ds_hf_models:" train.log
for c in "${cases[@]}"; do
  "$build/bin/ucp-load" -q --input "$c/ckpt" --format safetensors --output "$c.hf"
  cp "$c/ckpt/config.json" "$c.hf/"
done
PYTHONWARNINGS=ignore "$py" - "${cases[@]}" <<'PY' 2>&1 | grep -v "Loading weights"
import sys
import warnings
warnings.filterwarnings("ignore")
import torch
import transformers
from transformers import AutoModelForCausalLM
for case in sys.argv[1:]:
    ref = torch.load(f"{case}/logits.pt")
    model, info = AutoModelForCausalLM.from_pretrained(f"{case}.hf", dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    with torch.no_grad():
        logits = model(input_ids=ref["ids"]).logits
    if bad or not torch.equal(logits, ref["logits"]):
        print(f"FAIL case={case}: from_pretrained {bad}, logits max abs diff {(logits - ref['logits']).abs().max().item():.3g}")
        sys.exit(1)
    print(f"RESULT framework=transformers version={transformers.__version__} case=deepspeed_{case} "
          f"architecture={model.config.architectures[0]} tensors={len(model.state_dict())} logits_identical=yes")
PY
