"""Hugging Face model folders written by transformers' own code (tests/frameworks/hf_import_test.sh).

    hf_models.py FAMILY:OUT:DTYPE[:tied] ...     (one process for every model)

A model of FAMILY (llama, qwen2, qwen3, mixtral, qwen3_moe, qwen2_moe) built from its own config class with a
fixed seed, its weights drawn afresh (so that norms and biases are not the init's constants), saved with
save_pretrained (transformers 5.24.0 src/transformers/modeling_utils.py:3319, safetensors, one file; MoE
experts written back per expert by revert_weight_conversion, :3540-3541). Config classes:
models/llama/configuration_llama.py:31 (tie_word_embeddings :78), models/qwen2/configuration_qwen2.py:25
(biases on q/k/v only: modeling_qwen2.py:181-184), models/qwen3/configuration_qwen3.py:25 (q_norm and
k_norm over head_dim: modeling_qwen3.py:229-230), models/mixtral/configuration_mixtral.py (num_local_experts,
num_experts_per_tok, intermediate_size = the experts'), models/qwen3_moe/configuration_qwen3_moe.py
(num_experts, moe_intermediate_size, norm_topk_prob, mlp_only_layers: layer 3 dense),
models/qwen2_moe/configuration_qwen2_moe.py (shared_expert_intermediate_size, mlp_only_layers: layer 1 dense;
the shared expert's sigmoid gate, modeling_qwen2_moe.py:337-347). Sizes: 4
layers, hidden 32, 4 heads in 2 key-value groups, intermediate 64 (MoE: 4 experts of 48, top 2), vocabulary
128 (what a TP 2 split of the vocabulary takes as it is). Nothing is downloaded."""
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config,  # noqa: E402
                          Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)


def save(family, out, dtype, tied):
    torch.manual_seed(0)
    kw = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=tied)
    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                                 "qwen3": (Qwen3Config, Qwen3ForCausalLM), "mixtral": (MixtralConfig, MixtralForCausalLM),
                                 "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
                                 "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM)}[family]
    if family in ("qwen3", "qwen3_moe"):
        kw["head_dim"] = 8
    if family == "mixtral":  # every layer MoE; intermediate_size is the experts'
        kw.update(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)
    if family == "qwen3_moe":  # layer 3 dense (mlp_only_layers), the others MoE; top k renormalised
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[3])
    if family == "qwen2_moe":  # layer 1 dense, the others MoE with a gated shared expert; top k not renormalised
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=40,
                  norm_topk_prob=False, mlp_only_layers=[1], decoder_sparse_step=1)
    model = model_class(config_class(**kw)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out)


for spec in sys.argv[1:]:
    family, out, dtype, *rest = spec.split(":")
    save(family, out, getattr(torch, dtype), rest == ["tied"])
