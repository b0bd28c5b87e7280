"""Writes a GPT-like state dict of about `gib` GiB (bf16 weight matrices, fp32 norms/biases and one
fp32 master-weight block) with torch.save. Usage: make_state_dict.py <out.pt> [gib]"""
import collections
import sys

import torch

out = sys.argv[1]
gib = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
torch.manual_seed(0)
h, vocab = 2048, 50304
sd = collections.OrderedDict()


def add(name, shape, dtype):
    sd[name] = torch.randn(shape).to(dtype)


budget = gib * 2**30
add("language_model.embedding.word_embeddings.weight", (vocab, h), torch.bfloat16)
add("language_model.embedding.position_embeddings.weight", (2048, h), torch.bfloat16)
add("optimizer.fp32_master.word_embeddings", (vocab // 4, h), torch.float32)
layer = 0
while sum(t.numel() * t.element_size() for t in sd.values()) + 100 * 2**20 < budget:
    p = f"language_model.encoder.layers.{layer}."
    add(p + "input_layernorm.weight", (h,), torch.float32)
    add(p + "input_layernorm.bias", (h,), torch.float32)
    add(p + "self_attention.query_key_value.weight", (3 * h, h), torch.bfloat16)
    add(p + "self_attention.query_key_value.bias", (3 * h,), torch.float32)
    add(p + "self_attention.dense.weight", (h, h), torch.bfloat16)
    add(p + "self_attention.dense.bias", (h,), torch.float32)
    add(p + "post_attention_layernorm.weight", (h,), torch.float32)
    add(p + "post_attention_layernorm.bias", (h,), torch.float32)
    add(p + "mlp.dense_h_to_4h.weight", (4 * h, h), torch.bfloat16)
    add(p + "mlp.dense_h_to_4h.bias", (4 * h,), torch.float32)
    add(p + "mlp.dense_4h_to_h.weight", (h, 4 * h), torch.bfloat16)
    add(p + "mlp.dense_4h_to_h.bias", (h,), torch.float32)
    layer += 1
add("language_model.encoder.final_layernorm.weight", (h,), torch.float32)
add("language_model.encoder.final_layernorm.bias", (h,), torch.float32)
torch.save(sd, out)
total = sum(t.numel() * t.element_size() for t in sd.values())
print(f"{len(sd)} tensors, {layer} layers, {total / 2**30:.3f} GiB of tensor data")
