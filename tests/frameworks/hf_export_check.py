"""The judges of ucp-load --format hf (tests/frameworks/hf_export_test.sh, docs/hf.md).

    hf_export_check.py CASE HF_DIR MEGATRON_ITER_DIR|TRUTH.safetensors [CASE HF_DIR ... ...]

MEGATRON_ITER_DIR is a Megatron-Core torch_dist iteration folder holding the same model as HF_DIR came
from. Megatron-Core's own code (megatron-core from the pinned environment: GPTModel with its local layer
spec, dist_checkpointing.load resharding the save to one CPU rank) loads it; transformers' own
from_pretrained loads HF_DIR. A save megatron-core 0.16.1 cannot open (a core_v0.19 save: its common
state pickles classes 0.16.1 lacks) is given as the truth its fixture recorded instead (TRUTH: every
tensor as Megatron's own reader returned it, layers stacked), loaded into the same GPTModel with the
sizes, norm epsilon and rotary base of HF_DIR's config.json. Checked:
  * from_pretrained reports no missing, unexpected or mismatched key;
  * every Hugging Face tensor equals, bit for bit, the one this script derives from the tensors
    Megatron loaded (its own split of the fused QKV per query group and of SwiGLU's [W; V]: an
    implementation independent of ucpkit's);
  * logits of the two models on a fixed batch (fp32 on CPU): the largest difference, at most 1e-5.
Prints one RESULT line per case (one process for all: torch, transformers and Megatron start once); exit 1
with the case and the reason otherwise.
"""
import contextlib
import json
import os
import re
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from hf_layers import experts_of, moe_layers  # noqa: E402

# Megatron-Core's local layer spec asks CUDA for a device and an RNG tracker; on CPU: the CPU and no fork.
torch.cuda.current_device = lambda: torch.device("cpu")


def truth_args(config):
    """The Megatron args a truth-mode model is built with, from the export's config.json."""
    from argparse import Namespace
    return Namespace(
        num_layers=config["num_hidden_layers"], hidden_size=config["hidden_size"],
        num_attention_heads=config["num_attention_heads"], num_query_groups=config["num_key_value_heads"],
        group_query_attention=True, ffn_hidden_size=config["intermediate_size"], kv_channels=config["head_dim"],
        swiglu=True, normalization="RMSNorm", add_bias_linear=bool(config.get("attention_bias")),
        add_qkv_bias=bool(config.get("qkv_bias")) and not config.get("attention_bias"), qk_layernorm="q_norm" in json.dumps(config), norm_epsilon=config["rms_norm_eps"],
        padded_vocab_size=config["vocab_size"], max_position_embeddings=config["max_position_embeddings"],
        rotary_base=config["rope_parameters"]["rope_theta"],
        untie_embeddings_and_output_weights=not config["tie_word_embeddings"], **truth_moe_args(config))


def truth_moe_args(config):
    """The MoE args of a truth-mode model (Mixtral: intermediate_size is the experts'; Qwen3-MoE; Qwen2-MoE: the
    gated shared expert, the dense layers as Megatron's moe_layer_freq pattern)."""
    experts = experts_of(config)
    if not experts:
        return {}
    moe = moe_layers(config)
    freq = 1 if len(moe) == config["num_hidden_layers"] else [int(layer in moe) for layer in range(config["num_hidden_layers"])]
    shared = config.get("shared_expert_intermediate_size")
    return dict(num_experts=experts, moe_router_topk=config["num_experts_per_tok"],
                moe_ffn_hidden_size=config.get("moe_intermediate_size", config["intermediate_size"]),
                moe_router_pre_softmax=not config.get("norm_topk_prob", True), moe_layer_freq=freq,
                moe_shared_expert_intermediate_size=shared, moe_shared_expert_gate=bool(shared))


def truth_state_dict(path):
    """Megatron's own tensors of a fixture (stacked layers, the TE spec's norm names) as its local spec names them."""
    from safetensors.torch import load_file
    out = {}
    for k, v in load_file(path).items():
        if k.startswith(("optimizer", "chained_")):  # the optimizer's (dp_reshardable saves: chained_<i>. buckets)
            continue
        if k.startswith("decoder.layers."):
            rest = k[len("decoder.layers."):]
            numbered = re.match(r"(\d+)\.(.*)", rest)  # heterogeneous layers (dense between MoE): one key per layer
            layers = [(int(numbered[1]), v)] if numbered else list(enumerate(v))
            rest = numbered[2] if numbered else rest
            rest = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
                    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}.get(rest, rest)
            for layer, t in layers:
                if ".experts.experts." in rest:  # the expert axis after the layer axis: SequentialMLP's local_experts
                    head, tail = rest.split(".experts.experts.")
                    for e in range(t.shape[0]):
                        out[f"decoder.layers.{layer}.{head}.experts.local_experts.{e}.{tail}"] = t[e]
                else:
                    out[f"decoder.layers.{layer}.{rest}"] = t
        else:
            out[k] = v
    return out


def moe_config(a):
    """The MoE fields of TransformerConfig from Megatron args (none for a dense model)."""
    experts = getattr(a, "num_experts", None)
    if not experts:
        return {}
    return dict(num_moe_experts=experts, moe_ffn_hidden_size=a.moe_ffn_hidden_size, moe_router_topk=a.moe_router_topk,
                moe_router_pre_softmax=getattr(a, "moe_router_pre_softmax", False), moe_grouped_gemm=False,
                moe_token_dispatcher_type="allgather", moe_aux_loss_coeff=0.0,
                moe_layer_freq=getattr(a, "moe_layer_freq", 1),
                moe_shared_expert_intermediate_size=getattr(a, "moe_shared_expert_intermediate_size", None),
                moe_shared_expert_gate=getattr(a, "moe_shared_expert_gate", False))


def megatron_model(ckpt, config, te_keys=False):
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    import megatron.core.transformer.moe.moe_utils as moe_utils

    # megatron-core 0.16.1's router names te_general_gemm only when Transformer Engine imports; without it
    # (CPU) its own torch fallback is meant (moe_utils.py router_gating_linear).
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
        dist.init_process_group("gloo", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
    truth = ckpt.endswith(".safetensors")
    a = truth_args(config) if truth else dist_checkpointing.load_common_state_dict(ckpt)["args"]
    eps = getattr(a, "norm_epsilon", None) or getattr(a, "layernorm_epsilon", None) or 1e-5
    cfg = TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        num_query_groups=a.num_query_groups if a.group_query_attention else None, ffn_hidden_size=a.ffn_hidden_size,
        kv_channels=a.kv_channels, gated_linear_unit=a.swiglu, activation_func=torch.nn.functional.silu,
        normalization=a.normalization, add_bias_linear=getattr(a, "add_bias_linear", True), add_qkv_bias=getattr(a, "add_qkv_bias", False),
        qk_layernorm=getattr(a, "qk_layernorm", False), layernorm_epsilon=eps, use_cpu_initialization=True,
        params_dtype=torch.float32, bias_activation_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        bias_dropout_fusion=False, attention_dropout=0.0, hidden_dropout=0.0, persist_layer_norm=False,
        gradient_accumulation_fusion=False, **moe_config(a))
    if cfg.num_moe_experts and cfg.moe_layer_freq != 1:  # dense layers between MoE layers: one spec per layer
        spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization=a.normalization)
    else:
        spec = get_gpt_layer_local_spec(num_experts=cfg.num_moe_experts, moe_grouped_gemm=False, qk_layernorm=cfg.qk_layernorm,
                                        normalization=a.normalization)
    m = GPTModel(cfg, spec, vocab_size=a.padded_vocab_size, max_sequence_length=a.max_position_embeddings,
                 position_embedding_type="rope", rotary_base=getattr(a, "rotary_base", 10000),
                 share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights,
                 rope_scaling=getattr(a, "use_rope_scaling", False))
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *x, **k: contextlib.nullcontext()
    if te_keys:
        # The Transformer Engine spec's keys (Transformer Engine needs a GPU): its MoE layers keep the pre-MLP norm
        # as the TENorm module pre_mlp_layernorm, with no sharded_state_dict_keys_map entry for it
        # (gpt_layer_specs.py get_gpt_layer_with_transformer_engine_spec; the local spec maps it to
        # mlp.linear_fc1.layer_norm_*). The other keys of the two specs are the same for this model (the input
        # norm is linear_qkv.layer_norm_* in both; SequentialMLP experts), Transformer Engine's _extra_state aside.
        for layer in m.decoder.layers:
            if not isinstance(layer.pre_mlp_layernorm, torch.nn.Module) or not list(layer.pre_mlp_layernorm.parameters()):
                continue
            if type(layer.mlp).__name__ != "MoELayer":
                continue
            cfg_map = layer.submodules_config.sharded_state_dict_keys_map
            layer.submodules_config.sharded_state_dict_keys_map = {k: v for k, v in cfg_map.items() if k != "pre_mlp_layernorm."}
        assert any(".pre_mlp_layernorm." in k for k in m.sharded_state_dict()), "no MoE layer to load with TE keys"
    loaded = truth_state_dict(ckpt) if truth else dist_checkpointing.load(m.sharded_state_dict(), ckpt)
    res = m.load_state_dict(loaded, strict=False)
    assert not truth or not res.unexpected_keys, f"truth tensors the model lacks: {res.unexpected_keys[:5]}"
    missing = [k for k in res.missing_keys if not k.endswith("_extra_state")]
    assert not missing, f"Megatron-Core's load left {missing[:5]}"
    return m.eval(), a


def expected_hf_tensors(mg, a, vocab):
    """The Hugging Face tensors derived from Megatron's own: this script's split, not ucpkit's."""
    sd = {k: v for k, v in mg.state_dict().items() if not k.endswith("_extra_state")}
    heads, hd = a.num_attention_heads, a.kv_channels
    groups = a.num_query_groups if a.group_query_attention else heads
    out = {"model.embed_tokens.weight": sd.pop("embedding.word_embeddings.weight")[:vocab],
           "model.norm.weight": sd.pop("decoder.final_layernorm.weight")}
    if "output_layer.weight" in sd:
        out["lm_head.weight"] = sd.pop("output_layer.weight")[:vocab]
    for layer in range(a.num_layers):
        p, h = f"decoder.layers.{layer}.", f"model.layers.{layer}."
        out[h + "input_layernorm.weight"] = sd.pop(p + "input_layernorm.weight")
        out[h + "post_attention_layernorm.weight"] = sd.pop(p + "pre_mlp_layernorm.weight")
        for kind in ("weight", "bias"):
            qkv = sd.pop(p + f"self_attention.linear_qkv.{kind}", None)
            if qkv is not None:  # per query group: heads/groups query heads, one key head, one value head
                g = qkv.reshape(groups, (heads // groups + 2) * hd, *qkv.shape[1:])
                q, k, v = torch.split(g, [heads // groups * hd, hd, hd], dim=1)
                for name, t in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                    out[h + f"self_attn.{name}.{kind}"] = t.reshape(-1, *qkv.shape[1:])
            for mc, hf in (("self_attention.linear_proj", "self_attn.o_proj"), ("mlp.linear_fc2", "mlp.down_proj")):
                t = sd.pop(p + f"{mc}.{kind}", None)
                if t is not None:
                    out[h + f"{hf}.{kind}"] = t
            fc1 = sd.pop(p + f"mlp.linear_fc1.{kind}", None)
            if fc1 is not None:  # SwiGLU: silu(first half) * second half
                out[h + f"mlp.gate_proj.{kind}"], out[h + f"mlp.up_proj.{kind}"] = torch.chunk(fc1, 2, dim=0)
        shared = p + "mlp.shared_experts."
        if shared + "linear_fc1.weight" in sd:  # Qwen2-MoE's shared expert: SwiGLU, scaled by sigmoid(x . gate_weight)
            out[h + "mlp.shared_expert.gate_proj.weight"], out[h + "mlp.shared_expert.up_proj.weight"] = \
                torch.chunk(sd.pop(shared + "linear_fc1.weight"), 2, dim=0)
            out[h + "mlp.shared_expert.down_proj.weight"] = sd.pop(shared + "linear_fc2.weight")
            if shared + "gate_weight" in sd:
                out[h + "mlp.shared_expert_gate.weight"] = sd.pop(shared + "gate_weight")
        if p + "mlp.router.weight" in sd:  # transformers 5's model holds the experts fused: gate_up_proj[e] = [gate; up]
            out[h + "mlp.gate.weight"] = sd.pop(p + "mlp.router.weight")
            for mc, hf in (("linear_fc1", "gate_up_proj"), ("linear_fc2", "down_proj")):
                out[h + f"mlp.experts.{hf}"] = torch.stack([sd.pop(p + f"mlp.experts.local_experts.{e}.{mc}.weight")
                                                            for e in range(a.num_experts)])
        for mc, hf in (("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")):
            t = sd.pop(p + f"self_attention.{mc}.weight", None)
            if t is not None:
                out[h + f"self_attn.{hf}.weight"] = t
    assert not sd, f"Megatron tensors this check does not map: {sorted(sd)[:5]}"
    return out


def check(case, hf_dir, ckpt):
    from transformers import AutoModelForCausalLM
    import transformers

    config = json.load(open(os.path.join(hf_dir, "config.json")))
    mg, a = megatron_model(ckpt, config)
    hf, info = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"from_pretrained: {bad}"
    vocab = config["vocab_size"]
    want = expected_hf_tensors(mg, a, vocab)
    got = {k: v for k, v in hf.state_dict().items()}
    if config.get("tie_word_embeddings"):
        got.pop("lm_head.weight", None)  # the tied head is the embedding itself
    assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))[:8]
    differ = [k for k in want if not torch.equal(got[k], want[k].to(got[k].dtype))]
    assert not differ, f"tensors differ from Megatron's: {differ[:5]}"

    torch.manual_seed(0)
    batch, seq = 2, min(8, a.max_position_embeddings)
    ids = torch.randint(0, vocab, (batch, seq))
    pos = torch.arange(seq).unsqueeze(0).expand(batch, seq)
    mask = torch.triu(torch.ones(seq, seq), diagonal=1).bool()[None, None]
    with torch.no_grad():
        ref = mg(ids, pos, attention_mask=mask)[..., :vocab]
        ours = hf(input_ids=ids).logits
    diff = (ref - ours).abs().max().item()
    assert diff <= 1e-5, f"logits differ by {diff:.3g} (more than 1e-5)"
    te = ""
    if getattr(a, "num_experts", None) and not ckpt.endswith(".safetensors") and not getattr(a, "transformer_impl", None):
        # No Megatron run chose a layer spec (an import): a Transformer Engine spec job loads it with its own keys too.
        mg_te, _ = megatron_model(ckpt, config, te_keys=True)
        local, tek = mg.state_dict(), mg_te.state_dict()
        differ = [k for k, v in local.items() if not k.endswith("_extra_state") and not torch.equal(v, tek[k])]
        assert not differ, f"the Transformer Engine spec's keys load other values: {differ[:5]}"
        te = " te_spec_keys=equal"
    import importlib.metadata as md
    # The RESULT form of docs/frameworks-outside-ci.md (equal: every tensor bit-exact), then this check's own fields.
    print(f"RESULT framework=transformers version={transformers.__version__} case={case} tensors={len(want)} equal=yes "
          f"megatron-core={md.version('megatron-core')} architecture={config['architectures'][0]} "
          f"logits_max_abs_diff={diff:.3g}{te}")


def main():
    args = sys.argv[1:]
    assert args and len(args) % 3 == 0, "usage: hf_export_check.py CASE HF_DIR CKPT [CASE HF_DIR CKPT ...]"
    for k in range(0, len(args), 3):
        try:
            check(*args[k:k + 3])
        except AssertionError as e:
            print(f"FAIL case={args[k]}: {e}")
            sys.exit(1)


if __name__ == "__main__":
    main()
