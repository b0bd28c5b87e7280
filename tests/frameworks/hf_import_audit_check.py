"""The import's audit of tests/frameworks/hf_import_test.sh, judged against safetensors' own reader and hashlib.

    hf_import_audit_check.py ORIGINAL AUDIT [ORIGINAL AUDIT ...]

AUDIT is the --audit file of `ucp-load --input ORIGINAL --format torch_dist` (the import of the Hugging Face
folder ORIGINAL written by transformers' save_pretrained). Checked: every tensor of ORIGINAL is the source of
exactly one record; every Megatron-Core parameter is listed once; each record's SHA-256 is what hashlib gives
for the parameter derived here, independently of ucpkit, from the original tensors (Megatron-Core's layouts:
linear_qkv per query group [q..., k, v], SwiGLU linear_fc1 [gate; up]) in the record's dtype; the totals and,
for an MoE model, the experts of every MoE layer (hf_layers.py). One RESULT line per case; exit 1 naming the case otherwise."""
import glob
import hashlib
import json
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from hf_layers import experts_of, moe_layers  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def derived(record, tensors, config):
    src = [tensors[f["name"]] for f in record["from"]]
    transform = " ".join(record["transform"])
    if transform.startswith("expert "):
        src = [src[0][int(transform.split()[1])]]
    if "q_proj, k_proj, v_proj" in transform:
        heads, groups = config["num_attention_heads"], config["num_key_value_heads"]
        q, k, v = src
        # per query group: its heads / groups query rows, then its key rows, then its value rows
        parts = [t.reshape(groups, -1, *t.shape[1:]) for t in (q, k, v)]
        assert parts[0].shape[1] == parts[1].shape[1] * heads // groups, (record["name"], [p.shape for p in parts])
        return torch.cat(parts, dim=1).reshape(-1, *q.shape[1:])
    return src[0] if len(src) == 1 else torch.cat(src, dim=0)  # gate_proj over up_proj: SwiGLU's [W; V]


def check(orig, audit_path):
    tensors = {}
    for f in sorted(glob.glob(f"{orig}/*.safetensors")):
        tensors.update(load_file(f))
    config = json.load(open(f"{orig}/config.json"))
    audit = json.load(open(audit_path))
    records = audit["tensors"]
    names = [r["name"] for r in records]
    assert len(names) == len(set(names)), "a parameter listed twice"
    used = [f["name"] for r in records for f in r["from"]]
    assert sorted(used) == sorted(tensors), ("sources not used exactly once", sorted(set(used) ^ set(tensors)))
    values = 0
    for r in records:
        t = derived(r, tensors, config).to(DTYPES[r["dtype"]]).contiguous()
        assert list(t.shape) == r["shape"], (r["name"], list(t.shape), r["shape"])
        digest = hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()
        assert digest == r["sha256"], (r["name"], r["transform"], digest, r["sha256"])
        values += t.numel()
    assert audit["totals"]["tensors"] == len(records) and audit["totals"]["values"] == values, audit["totals"]
    want = {str(layer): experts_of(config) for layer in moe_layers(config)}
    assert audit["experts_per_layer"] == want, (audit["experts_per_layer"], want)
    print(f"RESULT check=hf_import_audit case={orig} parameters={len(records)} sources={len(used)} values={values} sha256=all_equal")


if __name__ == "__main__":
    args = sys.argv[1:]
    for i in range(0, len(args), 2):
        try:
            check(args[i], args[i + 1])
        except Exception as e:  # noqa: BLE001
            print(f"FAIL: hf_import_audit {args[i]}: {e!r}")
            sys.exit(1)
