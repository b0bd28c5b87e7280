"""Outside CI (issue 30 part B): Megatron-Core's own reader on a torch_dist save that ucpkit made from a
Megatron-DeepSpeed checkpoint (ucp-union --to-names megatron-core, then ucp-load --format torch_dist), compared
with the generator's truth of that checkpoint. Run by scripts/verify/megatron_core_names_verify.sh in the torch2lab
chroot (torch 2.6, safetensors):

    python3 megatron_core_names_verify.py <megatron truth dir> <dsgen truth dir> <generator dir>

<megatron truth dir>: `mcore_ckpt.py truth` output (dist_checkpointing.load_plain_tensors, Megatron's own
reader: tensors.safetensors); every optimizer state (param = fp32 master, exp_avg, exp_avg_sq) must equal the
truth bit for bit, and every model weight the fp32 master rounded to bf16, with the fused QKV read as
Megatron-Core reads it (attention.py:1860-1900 at core_v0.19.0), the layer axis of stacked keys (or the
per-layer `decoder.layers.{L}.` keys of a model with MoE and dense layers), the expert axis of the experts'
keys (`mlp.experts.experts.linear_fc{1,2}.weight` [E, ...], global expert id first), and the vocabulary
tensors' padded rows zeros.
Exit 0 when all equal."""
import json
import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, sys.argv[3])
import dsgen  # noqa: E402,F401  (DeepSpeed stand-ins for the truth files' SubparamShape)


def non_pipe_names(params):
    """A pipeline source's truth names (GPTModelPipe's: tied_modules.embed.*, `<layer>.<local>` per block,
    `<layer>.weight|bias` for the final norm, `<layer>.lm_head.weight`; tests/generator/dsgen/models.py
    PIPE_NUMBERING after deepspeedai/Megatron-DeepSpeed gpt_model.py:349-424) -> the non-pipe GPTModel
    names the rest of this check maps; the block index is the pipe index minus the first block's,
    found from the names themselves. Non-pipe names map to themselves."""
    names = [p["name"] for p in params]
    blocks = [int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit() and n.count(".") >= 2
              and not n.split(".", 1)[1].startswith("lm_head.")]
    first = min(blocks) if blocks else 0
    out = {}
    for n in names:
        head, _, rest = n.partition(".")
        if n.startswith("tied_modules.embed."):
            out[n] = "language_model.embedding." + n[len("tied_modules.embed."):]
        elif head.isdigit() and rest.startswith("lm_head."):
            out[n] = "language_model.output_layer." + rest[len("lm_head."):]
        elif head.isdigit() and rest in ("weight", "bias"):
            out[n] = "language_model.encoder.final_layernorm." + rest
        elif head.isdigit():
            out[n] = "language_model.encoder.layers.%d.%s" % (int(head) - first, rest)
        else:
            out[n] = n
    return out


def main():
    mtruth, dtruth = sys.argv[1], sys.argv[2]
    t = load_file(os.path.join(mtruth, "tensors.safetensors"))
    meta = json.load(open(os.path.join(dtruth, "meta.json")))
    cfg = meta["model"]
    heads, groups, hd = cfg["heads"], cfg["kv_heads"], cfg["hidden"] // cfg["heads"]
    names = {
        "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
        "self_attention.query_key_value.weight": "self_attention.linear_qkv.weight",
        "self_attention.dense.weight": "self_attention.linear_proj.weight",
        "post_attention_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
        "mlp.dense_h_to_4h.weight": "mlp.linear_fc1.weight",
        "mlp.dense_4h_to_h.weight": "mlp.linear_fc2.weight",
        # GPT (LayerNorm with bias, biased linears): Megatron-Core's TE-style names of the local spec
        # (transformer_layer.py sharded_state_dict_keys_map at core_v0.19.0).
        "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
        "self_attention.query_key_value.bias": "self_attention.linear_qkv.bias",
        "self_attention.dense.bias": "self_attention.linear_proj.bias",
        "post_attention_layernorm.bias": "mlp.linear_fc1.layer_norm_bias",
        "mlp.dense_h_to_4h.bias": "mlp.linear_fc1.bias",
        "mlp.dense_4h_to_h.bias": "mlp.linear_fc2.bias",
        # Native DeepSpeed MoE: the gate and the experts (docs/megatron-core-mapping.md).
        "mlp.deepspeed_moe.gate.wg.weight": "mlp.router.weight",
    }
    experts = {"dense_h_to_4h.weight": "mlp.experts.experts.linear_fc1.weight",
               "dense_4h_to_h.weight": "mlp.experts.experts.linear_fc2.weight"}
    xpre = "mlp.deepspeed_moe.experts.deepspeed_experts."
    top = {"language_model.embedding.word_embeddings.weight": "embedding.word_embeddings.weight",
           "language_model.encoder.final_layernorm.weight": "decoder.final_layernorm.weight",
           "language_model.output_layer.weight": "output_layer.weight",
           "language_model.embedding.position_embeddings.weight": "embedding.position_embeddings.weight",
           "language_model.encoder.final_layernorm.bias": "decoder.final_layernorm.bias"}
    errors, checked = [], 0
    plain = non_pipe_names(meta["params"])
    for p in meta["params"]:
        ds = p["name"]  # the truth file's name; `name` the non-pipe one it maps through
        name = plain[ds]
        expert = None
        if name in top:
            key, layer = top[name], None
        else:
            parts = name.split(".")
            layer, local = int(parts[3]), ".".join(parts[4:])
            if local.startswith(xpre):
                expert, rest = local[len(xpre):].split(".", 1)
                expert, mc = int(expert), experts[rest]
            else:
                mc = names[local]
            key = "decoder.layers." + mc
            if "optimizer.state.param." + key not in t:  # not a homogeneous stack: per-layer keys
                key, layer = "decoder.layers.%d.%s" % (layer, mc), None
        for state, prefix in (("fp32", "optimizer.state.param."), ("exp_avg", "optimizer.state.exp_avg."),
                              ("exp_avg_sq", "optimizer.state.exp_avg_sq."), ("fp32", "")):
            want = torch.load(os.path.join(dtruth, "universal", "zero", ds, state + ".pt"), weights_only=False)
            want = want["param"] if isinstance(want, dict) else want
            got = t[prefix + key]
            got = got[layer] if layer is not None else got
            got = got[expert] if expert is not None else got
            if local_is_qkv(ds) and p["kind"] == "subparams":
                # GQA's [Q; K; V] (sub_param_shape); a plain MHA query_key_value is already per head
                # [q k v] interleaved, Megatron-Core's order with groups = heads.
                # Megatron-Core's reading: [groups, (heads/groups + 2) * hd] -> per group q heads, k, v.
                g = got.reshape(groups, (heads // groups + 2) * hd, -1)
                q, k, v = torch.split(g, [heads // groups * hd, hd, hd], dim=1)
                got = torch.cat([q.reshape(-1, g.shape[-1]), k.reshape(-1, g.shape[-1]), v.reshape(-1, g.shape[-1])])
            if prefix == "":
                want = want.to(torch.bfloat16)
            if p.get("vocab"):  # Megatron's padded rows (zeros) after the truth's rows
                if got.shape[0] != meta["padded_vocab"] or torch.any(got[want.shape[0]:] != 0):
                    errors.append("%s%s: padded rows are not %d zero rows" % (prefix, key, meta["padded_vocab"]))
                got = got[:want.shape[0]]
            if got.shape != want.shape or not torch.equal(got, want):
                errors.append("%s%s (%s %s) differs" % (prefix, key, ds, state))
            checked += 1
    if errors:
        print("\n".join(errors[:20]))
        return 1
    with open(os.path.join(mtruth, "names_check.json"), "w") as f:
        json.dump({"checked": checked, "errors": len(errors)}, f)
    print("megatron_core_names_verify: %d tensors (optimizer states and bf16 weights) as Megatron-Core reads them "
          "equal the generator's truth" % checked)
    return 0


def local_is_qkv(ds):
    return ds.endswith("self_attention.query_key_value.weight")


if __name__ == "__main__":
    sys.exit(main())
