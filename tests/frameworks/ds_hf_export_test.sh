#!/usr/bin/env bash
# The DeepSpeed engine as the judge of a Hugging Face export (label `frameworks`, docs/hf.md; issue 49): DeepSpeed
# 0.19.8 trains transformers' own LlamaForCausalLM at ZeRO-1 and ZeRO-3 and MixtralForCausalLM at ZeRO-1 on 2 CPU
# ranks and saves (ds_hf_models.py: the module names are the Hugging Face names, config.json beside the checkpoint
# as the HF Trainer leaves it); `ucp-load --format hf` writes the weights under those names with that config.json
# (the family map checking the names and shapes against it), and transformers' from_pretrained of our folder reports
# no missing or unexpected key and computes the engine's own logits on a fixed batch exactly (torch.equal); `--audit`
# is refused for such a source (exit 2, nothing written). Run as users run it: relative paths, options left out.
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
  "$build/bin/ucp-load" -q --input "$c/ckpt" --format hf --output "$c.hf"
done
rc=0
"$build/bin/ucp-load" -q --input llama_z1/ckpt --format hf --output refused --audit refused.json 2>/dev/null || rc=$?
[[ $rc -eq 2 && ! -e refused && ! -e refused.json ]] || { echo "FAIL: --audit of a checkpoint in Hugging Face names: exit $rc"; exit 1; }
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
