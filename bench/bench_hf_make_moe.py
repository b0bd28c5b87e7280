"""A Qwen3-MoE-shaped Hugging Face folder (Qwen3-30B-A3B's hidden size 2048, vocabulary 151,936, 32 heads in 4 KV groups
of 128, experts of 768) with few layers and experts, written by transformers' own save_pretrained (random weights,
bf16, no download): the largest tensors of the real model (its embedding and LM head, 1.2 GB each in fp32) at a size
this VM's disk holds. For the peak-RSS check of docs/hf.md "Benchmark".
Usage: bench_hf_make_moe.py OUT [LAYERS] [EXPERTS]"""
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

out = sys.argv[1]
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
experts = int(sys.argv[3]) if len(sys.argv) > 3 else 8
torch.manual_seed(0)
cfg = Qwen3MoeConfig(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=layers,
                     num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=experts,
                     num_experts_per_tok=2, vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=False)
with torch.device("meta"):
    model = Qwen3MoeForCausalLM(cfg)
model = model.to_empty(device="cpu").to(torch.bfloat16)
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.02)
model.save_pretrained(out, max_shard_size="1GB")
