#!/usr/bin/env bash
# A Hugging Face model into a Megatron-Core layout and back (label `frameworks`, docs/hf.md; issue 49):
# transformers' own save_pretrained writes each family (hf_models.py: Llama GQA bf16, Llama with tied
# embeddings fp32, Qwen2 fp32, Qwen3 bf16); `ucp-load --format torch_dist --tp 2 --pp 2` writes it as a
# Megatron-Core save directly from the folder (optimizer state as a fresh run's); megatron-core 0.16.1's own
# loader reads that save into its GPTModel, whose every tensor equals the Hugging Face original bit for bit
# and whose logits agree with transformers' within 1e-5 (hf_export_check.py); `ucp-load --format hf` of our
# save gives back every tensor of the original bit for bit, and transformers' model of it computes the
# original's logits exactly. Run as users run it: relative paths, from the work folder, options left out.
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
for case in "llama bfloat16" "llama float32 --tied" "qwen2 float32" "qwen3 bfloat16"; do
  set -- $case
  name=$1_$2${3:+_tied}
  PYTHONWARNINGS=ignore "$py" "$root/tests/frameworks/hf_models.py" "$1" "$name" "$2" ${3:-} 2>&1 | quiet
  "$build/bin/ucp-load" -q --input "$name" --format torch_dist --tp 2 --pp 2 --dp 1 --megatron-version 0.16.1 \
    --output "$name.td" 2>&1 | quiet
  PYTHONWARNINGS=ignore "$py" "$root/tests/frameworks/hf_export_check.py" "$name" "$name.td/iter_0000000" 2>&1 | quiet |
    sed "s/^RESULT /RESULT case=${name}_import /"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "FAIL: $name (import judged by Megatron-Core)"; exit 1; }
  "$build/bin/ucp-load" -q --input "$name.td" --format hf --output "$name.back" --audit "$name.audit.json" 2>&1 | quiet
  PYTHONWARNINGS=ignore "$py" - "$name" "$name.back" "$name.audit.json" <<'PY' 2>&1 | quiet
import sys, json, torch, warnings
warnings.filterwarnings("ignore")
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
a, b = (load_file(f"{d}/model.safetensors") for d in sys.argv[1:3])
assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
differ = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
assert not differ, differ[:5]
ca, cb = (json.load(open(f"{d}/config.json")) for d in sys.argv[1:3])
for k in ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size", "rms_norm_eps", "tie_word_embeddings", "dtype"):
    assert ca.get(k) == cb.get(k), (k, ca.get(k), cb.get(k))
ids = torch.randint(0, ca["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(1))
la, lb = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)(input_ids=ids).logits for d in sys.argv[1:3])
assert torch.equal(la, lb), (la - lb).abs().max()
# The audit lists every tensor once, with the SHA-256 hashlib computes of its bytes in the file.
import hashlib, struct
audit = json.load(open(sys.argv[3]))
raw = open(f"{sys.argv[2]}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
names = [r["name"] for r in audit["tensors"]]
assert sorted(names) == sorted(a) and len(set(names)) == len(names), "the audit does not list every tensor once"
for r in audit["tensors"]:
    lo, hi = header[r["name"]]["data_offsets"]
    assert hashlib.sha256(raw[8 + n + lo:8 + n + hi]).hexdigest() == r["sha256"], r["name"]
assert audit["totals"]["tensors"] == len(a) and audit["totals"]["values"] == sum(t.numel() for t in a.values())
print(f"RESULT case={sys.argv[1]}_round_trip tensors={len(a)} bit_identical=yes logits_identical=yes audit_sha256=yes")
PY
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "FAIL: $name (round trip)"; exit 1; }
  "$build/bin/ucp-diff" -q "$name" "$name.td" || { echo "FAIL: ucp-diff calls $name and its import different"; exit 1; }
done
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
echo "RESULT case=transposed_projection ucp_diff_exit=3"
