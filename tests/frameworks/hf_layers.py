"""Which decoder layers of a Hugging Face MoE config.json are MoE layers, as transformers decides it
(transformers 5.24.0 models/qwen2_moe/modeling_qwen2_moe.py:358-359, the same in Qwen3-MoE: not in
mlp_only_layers and (layer + 1) % decoder_sparse_step == 0; Mixtral: every layer). Shared by the checks."""


def experts_of(config):
    return config.get("num_local_experts", config.get("num_experts", 0))


def moe_layers(config):
    if not experts_of(config):
        return []
    dense, step = set(config.get("mlp_only_layers") or []), config.get("decoder_sparse_step") or 1
    return [layer for layer in range(config["num_hidden_layers"]) if layer not in dense and (layer + 1) % step == 0]
