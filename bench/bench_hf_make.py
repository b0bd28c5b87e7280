"""A Hugging Face folder for bench/bench_hf.sh, written by transformers' own save_pretrained (random weights, bf16, no
download): Llama-shaped, or with `qwen3moe` Qwen3-MoE-shaped (Qwen3-30B-A3B's hidden size 2048, vocabulary 151,936,
32 heads in 4 KV groups of 128, experts of 768; few layers and experts: the real model's largest tensors, its
embedding and LM head of 1.2 GB each in fp32, at a size this VM's disk holds).
Usage: bench_hf_make.py OUT HIDDEN INTERMEDIATE LAYERS VOCAB
       bench_hf_make.py OUT qwen3moe [LAYERS] [EXPERTS] [DTYPE]   (DTYPE bf16 or fp32, default bf16: the fp32 folder of
       bench_hf_large.sh is one larger than half the RAM whose import and export this VM's disk can still hold)"""
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

out = sys.argv[1]
dtype = torch.bfloat16
if sys.argv[2] == "qwen3moe":
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[5] if len(sys.argv) > 5 else "bf16"]
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    experts = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    cls, cfg = Qwen3MoeForCausalLM, Qwen3MoeConfig(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=experts, num_experts_per_tok=2,
        vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=False)
else:
    hidden, inter, layers, vocab = map(int, sys.argv[2:6])
    cls, cfg = LlamaForCausalLM, LlamaConfig(
        hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=hidden // 128,
        num_key_value_heads=hidden // 256, vocab_size=vocab, max_position_embeddings=4096)
torch.manual_seed(0)
with torch.device("meta"):
    model = cls(cfg)
model = model.to_empty(device="cpu").to(dtype)
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.02)
model.save_pretrained(out, max_shard_size="1GB")
