"""Checks a Megatron-Core-named universal folder (ucp-union --to-names megatron-core) against the dsgen
ground truth of its Megatron-DeepSpeed source, with names and the QKV row order derived here from
Megatron-Core's own module tree and attention code (not from patterns/megatron-core/*.json):

* names: GPTModel's state-dict keys at core_v0.19.0 as its checkpoints carry them
  (megatron/core/models/common/embeddings/language_model_embedding.py:56,:67 word / position
  embeddings; gpt_layer_specs.py:459-462 sharded_state_dict_keys_map: input_layernorm. ->
  self_attention.linear_qkv.layer_norm_, pre_mlp_layernorm. -> mlp.linear_fc1.layer_norm_;
  transformer/attention.py linear_qkv / linear_proj; transformer/mlp.py linear_fc1 / linear_fc2;
  transformer/moe/router.py:61 router weight [experts, hidden]; transformer_block.py final_layernorm;
  gpt_model.py output_layer), one name per layer and global expert (docs/formats-megatron-core.md);
* values: every state (fp32, exp_avg, exp_avg_sq) equal to the truth bit for bit (vocabulary tensors
  padded with zero rows to Megatron's padded size, as Megatron-Core stores them); the fused QKV read the
  way Megatron-Core's get_query_key_value_tensors reads it (attention.py:1860-1900: rows viewed as
  [groups, (heads/groups + 2) * head_dim], split into heads/groups query heads, one key, one value head)
  gives the truth's query, key and value heads (dsgen's [Q; K; V], models.py sub-params (q, kv, kv)).

Usage: /usr/bin/python3 check_mcore_names.py <mcore_universal_dir> <truth_dir>   (exit 0: all equal)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "generator"))
import dsgen  # noqa: E402,F401  (registers the DeepSpeed stand-in classes)

# GPTModelPipe's first block index (dsgen PIPE_NUMBERING, Megatron-DeepSpeed gpt_model.py:386-388).
FIRST_BLOCK = {"megatron-deepspeed": 2, "bigscience": 3}


def expected_name(ds, cfg, pipe):
    """Megatron-Core name of the Megatron-DeepSpeed universal name `ds`, and whether it is a fused QKV."""
    parts = ds.split(".")
    if ds.endswith("word_embeddings.weight"):
        return "embedding.word_embeddings.weight", False
    if ds.endswith("position_embeddings.weight"):
        return "embedding.position_embeddings.weight", False
    if ds == "language_model.output_layer.weight" or ds.endswith(".lm_head.weight"):
        return "output_layer.weight", False
    if ds.startswith("language_model.encoder.final_layernorm."):
        return "decoder.final_layernorm." + parts[-1], False
    if pipe and len(parts) == 2:  # "<final norm layer>.weight|bias"
        return "decoder.final_layernorm." + parts[-1], False
    if pipe:
        layer, local = int(parts[0]) - FIRST_BLOCK[cfg["pipe_numbering"]], parts[1:]
    else:
        assert parts[:3] == ["language_model", "encoder", "layers"], ds
        layer, local = int(parts[3]), parts[4:]
    pre = "decoder.layers.%d." % layer
    loc = ".".join(local)
    kind = local[-1]  # weight | bias
    simple = {
        "input_layernorm": "self_attention.linear_qkv.layer_norm_",
        "post_attention_layernorm": "mlp.linear_fc1.layer_norm_",
    }
    if local[0] in simple:
        return pre + simple[local[0]] + kind, False
    if loc.startswith("self_attention.query_key_value."):
        return pre + "self_attention.linear_qkv." + kind, True
    if loc.startswith("self_attention.dense."):
        return pre + "self_attention.linear_proj." + kind, False
    if loc == "mlp.deepspeed_moe.gate.wg.weight":
        return pre + "mlp.router.weight", False
    fc = {"dense_h_to_4h": "linear_fc1", "dense_4h_to_h": "linear_fc2"}
    if local[:4] == ["mlp", "deepspeed_moe", "experts", "deepspeed_experts"]:
        return pre + "mlp.experts.experts.%s.%s.%s" % (local[4], fc[local[5]], kind), False
    if local[0] == "mlp" and local[1] in fc:
        return pre + "mlp." + fc[local[1]] + "." + kind, False
    raise AssertionError("no Megatron-Core name for " + ds)


def megatron_core_qkv_split(t, heads, groups):
    """Megatron-Core's reading of linear_qkv rows (attention.py:1860-1900) -> (q, k, v) per head rows."""
    per = heads // groups
    hd = t.shape[0] // (heads + 2 * groups)
    g = t.reshape(groups, (per + 2) * hd, *t.shape[1:])
    q, k, v = torch.split(g, [per * hd, hd, hd], dim=1)
    return (q.reshape(heads * hd, *t.shape[1:]), k.reshape(groups * hd, *t.shape[1:]),
            v.reshape(groups * hd, *t.shape[1:]))


def main():
    out, truth = sys.argv[1], sys.argv[2]
    meta = json.load(open(os.path.join(truth, "meta.json")))
    cfg, pipe = meta["model"], meta["pipe"]
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    got = {p["name"]: p for p in manifest["params"]}
    errors = []
    expected = set()
    checked = 0
    for p in meta["params"]:
        if p.get("tied_copy"):
            continue
        ds = p["name"]
        name, qkv = expected_name(ds, cfg, pipe)
        if name in expected:
            continue  # the tied embedding's second copy
        expected.add(name)
        if name not in got:
            errors.append("missing %s (from %s)" % (name, ds))
            continue
        states = sorted(os.listdir(os.path.join(truth, "universal", "zero", ds)))
        for st in [s for s in states if s != "step.pt"]:
            t = torch.load(os.path.join(truth, "universal", "zero", ds, st), map_location="cpu")
            t = t["param"] if isinstance(t, dict) else t
            m = torch.load(os.path.join(out, "zero", name, st), map_location="cpu")["param"]
            if qkv and cfg["kv_heads"] != cfg["heads"]:
                hd = cfg["hidden"] // cfg["heads"]
                q, k, v = torch.split(t, [cfg["heads"] * hd, cfg["kv_heads"] * hd, cfg["kv_heads"] * hd], dim=0)
                mq, mk, mv = megatron_core_qkv_split(m, cfg["heads"], cfg["kv_heads"])
                same = all(torch.equal(a, b) for a, b in ((q, mq), (k, mk), (v, mv)))
            elif p.get("vocab"):
                # Megatron's padded vocabulary rows (the generator's padded_vocab, Megatron's
                # _vocab_size_with_padding at the source TP), zeros after the truth's rows.
                rows = t.shape[0]
                same = (m.shape[0] == meta["padded_vocab"] and torch.equal(m[:rows], t)
                        and not torch.any(m[rows:] != 0))
            else:
                same = t.shape == m.shape and torch.equal(t, m)
            if not same:
                errors.append("%s/%s differs from the truth of %s" % (name, st, ds))
            checked += 1
    extra = set(got) - expected
    if extra:
        errors.append("names not expected: %s" % sorted(extra)[:5])
    if errors:
        print("\n".join(errors[:30]))
        return 1
    print("check_mcore_names: %d parameters, %d state tensors equal" % (len(expected), checked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
