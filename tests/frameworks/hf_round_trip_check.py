"""The round trip of tests/frameworks/hf_import_test.sh, judged by transformers and safetensors' own code.

    hf_round_trip_check.py ORIGINAL BACK AUDIT [ORIGINAL BACK AUDIT ...]

BACK is ucp-load --format hf of the Megatron-Core save imported from the Hugging Face folder ORIGINAL (named
<ORIGINAL>.<layout>.back: of the checkpoint in that layout, "mds" Megatron-DeepSpeed), AUDIT
its --audit file. Checked: every tensor equal in dtype, shape and bytes (safetensors' load_file), the config
states the same model, transformers' model of BACK computes ORIGINAL's logits exactly (torch.equal), and the
audit lists every tensor once with the SHA-256 hashlib computes of its bytes and, for an MoE model, every
expert of every layer (experts_per_layer). One RESULT line per case;
exit 1 naming the case otherwise."""
import hashlib
import json
import struct
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from hf_layers import experts_of, moe_layers  # noqa: E402


def via(back):
    """A BACK named <orig>.<layout>.back went through that layout (.mds: Megatron-DeepSpeed); the default is torch_dist."""
    parts = back.split(".")
    return f"_via_{parts[1]}" if len(parts) == 3 else ""


def check(orig, back, audit_path):
    a, b = (load_file(f"{d}/model.safetensors") for d in (orig, back))
    assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
    differ = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
    assert not differ, differ[:5]
    ca, cb = (json.load(open(f"{d}/config.json")) for d in (orig, back))
    for k in ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "rms_norm_eps", "tie_word_embeddings", "dtype",
              "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
              "shared_expert_intermediate_size", "qkv_bias"):
        assert ca.get(k) == cb.get(k), (k, ca.get(k), cb.get(k))
    # the expert count under either key (transformers 5 keeps Qwen3-MoE's as num_local_experts), the MoE layers
    # from decoder_sparse_step and mlp_only_layers
    assert (experts_of(ca), moe_layers(ca)) == (experts_of(cb), moe_layers(cb)), (moe_layers(ca), moe_layers(cb))
    ids = torch.randint(0, ca["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(1))
    la, lb = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)(input_ids=ids).logits for d in (orig, back))
    assert torch.equal(la, lb), (la - lb).abs().max()
    audit = json.load(open(audit_path))
    raw = open(f"{back}/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    names = [r["name"] for r in audit["tensors"]]
    assert sorted(names) == sorted(a) and len(set(names)) == len(names), "the audit does not list every tensor once"
    for r in audit["tensors"]:
        lo, hi = header[r["name"]]["data_offsets"]
        assert hashlib.sha256(raw[8 + n + lo:8 + n + hi]).hexdigest() == r["sha256"], r["name"]
    assert audit["totals"]["tensors"] == len(a) and audit["totals"]["values"] == sum(t.numel() for t in a.values())
    want = {str(layer): experts_of(ca) for layer in moe_layers(ca)}
    assert audit["experts_per_layer"] == want, (audit["experts_per_layer"], want)
    import transformers  # the RESULT form of docs/frameworks-outside-ci.md (equal: every tensor bit-identical)
    print(f"RESULT framework=transformers version={transformers.__version__} case={orig}_round_trip{via(back)} tensors={len(a)} "
          f"equal=yes logits_identical=yes audit_sha256=yes")


args = sys.argv[1:]
for k in range(0, len(args), 3):
    try:
        check(*args[k:k + 3])
    except AssertionError as e:
        print(f"FAIL case={args[k]}_round_trip: {e}")
        sys.exit(1)
