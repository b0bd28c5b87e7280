"""A Llama-shaped Hugging Face folder for bench/bench_hf.sh, written by transformers' own save_pretrained
(random weights, bf16, no download). Usage: bench_hf_make.py OUT HIDDEN INTERMEDIATE LAYERS VOCAB"""
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

out, hidden, inter, layers, vocab = sys.argv[1], *map(int, sys.argv[2:6])
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=hidden // 128,
                  num_key_value_heads=hidden // 256, vocab_size=vocab, max_position_embeddings=4096)
with torch.device("meta"):
    model = LlamaForCausalLM(cfg)
model = model.to_empty(device="cpu").to(torch.bfloat16)
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.02)
model.save_pretrained(out, max_shard_size="1GB")
