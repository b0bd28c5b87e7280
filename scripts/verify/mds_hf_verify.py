"""Megatron-DeepSpeed's own code judges ucpkit's Megatron-DeepSpeed output of a Hugging Face folder (docs/hf.md
"Megatron-DeepSpeed output"; run by mds_hf_verify.sh, one process per rank under torch.distributed.run).

    mds_hf_verify.py CHECKPOINT HF_FOLDER TP PP

Megatron-DeepSpeed's initialize_megatron, setup_model_and_optimizer (pretrain_gpt.model_provider: GPTModelPipe,
deepspeed.initialize) and load_checkpoint with --finetune read CHECKPOINT at TP x PP on gloo CPU ranks; the
DeepSpeed pipeline engine's eval_batch (pretrain_gpt.get_batch_pipe, CrossEntropy over Megatron's padded vocabulary)
gives the loss of one fixed batch, against the loss transformers' model of HF_FOLDER gives on it (fp32; its logits
with the padded vocabulary's zero logits appended, as Megatron's padded rows are zeros). Prints
`RESULT framework=megatron-deepspeed ... loss_abs_diff=X` on rank 0; exit 1 when the difference is over 1e-5.
A Mixtral folder (num_local_experts; env EP, the expert-parallel size) is GPTModel with native DeepSpeed MoE: loaded
with --no-pipeline-parallel --create-moe-param-group, and every tensor each rank loaded is compared with the folder's
tensor it must be (mapped here on its own), exactly, instead of a loss (below).

Around Megatron-DeepSpeed 4efb479 on this CPU machine kind (each cited): no fused kernels or dataset helpers are
compiled (initialize._compile_dependencies: nothing here uses them); the vision monitor and two DeepSpeed modules
0.19.8 no longer has are stand-ins (imported, never called by a load or a forward); RotaryEmbedding.forward returns
[cos, sin] (megatron/model/rotary_pos_embedding.py:30-40) while apply_rotary_pos_emb (:53-74) takes the angles and
utils.update_rotary_pos_emb (megatron/utils.py:39) calls .to() on the list: the angles are given as the older code
did. Attention with grouped key/value heads does not run at that commit (transformer.py:734-739 splits the fused QKV
in three equal parts; :728-729 asserts equal sizes), so the judged models have as many key/value heads as query heads."""
import importlib
import json
import os
import sys
import types

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29781")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("LOCAL_RANK", "0")
# DeepSpeed's CPU accelerator counts LOCAL_SIZE devices (deepspeed/accelerator/cpu_accelerator.py device_count), and
# Megatron-DeepSpeed's _initialize_distributed wants local rank == rank % device count.
os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
sys.path.insert(0, os.environ["MDS_SRC"])
ckpt, hf, tp, pp = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
cfg = json.load(open(f"{hf}/config.json"))
experts = cfg.get("num_local_experts", 0)  # Mixtral: GPTModel with native DeepSpeed MoE in every layer
assert cfg["num_key_value_heads"] == cfg["num_attention_heads"], "grouped-query attention does not run at 4efb479"
bf16 = cfg.get("dtype") == "bfloat16"
world = int(os.environ["WORLD_SIZE"])
ds = {"train_batch_size": world // (int(tp) * int(pp)), "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
      "bf16": {"enabled": bf16}, "fp16": {"enabled": False}}
ds_file = f"ds_config.rank{os.environ['RANK']}.json"
json.dump(ds, open(ds_file, "w"))
sys.argv = ["mds_hf_verify", "--num-layers", str(cfg["num_hidden_layers"]), "--hidden-size", str(cfg["hidden_size"]),
            "--num-attention-heads", str(cfg["num_attention_heads"]),
            "--num-key-value-heads", str(cfg["num_key_value_heads"]), "--ffn-hidden-size", str(cfg["intermediate_size"]),
            "--seq-length", "8", "--max-position-embeddings", str(cfg["max_position_embeddings"]),
            "--micro-batch-size", "1", "--global-batch-size", str(ds["train_batch_size"]), "--swiglu", "--normalization", "rmsnorm",
            "--layernorm-epsilon", str(cfg["rms_norm_eps"]), "--use-rotary-position-embeddings",
            "--rotary-position-embeddings-theta", str(int(cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 10000)))),
            "--disable-bias-linear", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
            "--no-gradient-accumulation-fusion",
            # NullTokenizer adds one token (its eod) to --vocab-size: the folder's vocabulary
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(cfg["vocab_size"] - 1),
            "--deepspeed", "--deepspeed_config", ds_file, "--tensor-model-parallel-size", tp,
            "--pipeline-model-parallel-size", pp, "--lr", "0.0", "--train-iters", "1", "--use-cpu-initialization",
            "--local_rank", os.environ["LOCAL_RANK"], "--load", ckpt, "--finetune"]
if experts:  # every token through its top k experts, none dropped, the second one not sampled, no auxiliary loss
    sys.argv += ["--no-pipeline-parallel", "--num-experts", str(experts), "--expert-interval", "1",
                 "--topk", str(cfg["num_experts_per_tok"]), "--moe-expert-parallel-size", os.environ["EP"],
                 "--disable-moe-token-dropping", "--disable-moe-top2-2nd-expert-sampling", "--moe-loss-coeff", "0",
                 "--create-moe-param-group"]
if not cfg.get("tie_word_embeddings", False):
    sys.argv.append("--untie-embeddings-and-output-weights")
if bf16:
    sys.argv.append("--bf16")

import megatron.initialize as mi  # noqa: E402

mi._compile_dependencies = lambda: None
knn = types.ModuleType("megatron.model.vision.knn_monitor")
knn.compute_feature_bank = lambda *a, **k: None
sys.modules["megatron.model.vision.knn_monitor"] = knn
for name, attrs in (("deepspeed.compression.compress", ("init_compression", "redundancy_clean")),
                    ("deepspeed.runtime.data_pipeline.data_routing.helper", ("convert_to_random_ltd",))):
    try:
        importlib.import_module(name)
    except ImportError:
        m = types.ModuleType(name)
        for a in attrs:
            setattr(m, a, lambda *x, **k: None)
        sys.modules[name] = m

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from megatron import get_args  # noqa: E402
from megatron.initialize import initialize_megatron  # noqa: E402

initialize_megatron()
from megatron.core.enums import ModelType  # noqa: E402
from megatron.model.rotary_pos_embedding import RotaryEmbedding  # noqa: E402
from megatron.training import setup_model_and_optimizer  # noqa: E402
import megatron.utils as mu  # noqa: E402
import pretrain_gpt  # noqa: E402


def rotary_angles(self, max_seq_len, offset=0):
    freqs = torch.einsum("i , j -> i j", (torch.arange(max_seq_len) + offset).type_as(self.inv_freq), self.inv_freq)
    return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]


RotaryEmbedding.forward = rotary_angles  # what apply_rotary_pos_emb takes (see the docstring)
args = get_args()
args.deepspeed_config_dict = ds  # what megatron/training.py pretrain() makes of the config file
args.deepspeed_config = None
model, _, _ = setup_model_and_optimizer(pretrain_gpt.model_provider, ModelType.encoder_or_decoder)

from transformers import AutoModelForCausalLM  # noqa: E402

torch.manual_seed(0)
tokens = torch.randint(0, cfg["vocab_size"], (1, args.seq_length + 1))
with torch.no_grad():
    logits = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()(tokens[:, :-1]).logits[0].float()
    pad = args.padded_vocab_size - logits.shape[-1]
    logits = torch.cat([logits, torch.zeros(logits.shape[0], pad)], dim=-1)
    ref = F.cross_entropy(logits, tokens[0, 1:]).item()
    if experts:
        loss = None
    else:
        loss = float(model[0].eval_batch(data_iter=iter([{"text": tokens}])))  # get_batch_pipe shifts the labels
if experts:
    # GPTModel's rotary path does not run at 4efb479 (language_model.py:548 unpacks RotaryEmbedding's [cos, sin] and
    # the attention takes them as the two angles, transformer.py:827-829), so no forward: every parameter Megatron-
    # DeepSpeed loaded on this rank (its dense ones, its EP rank's experts) against the Hugging Face tensors it must be,
    # mapped here on their own (the published Mixtral names, the fused QKV [Q; K; V], SwiGLU [w1; w3]).
    from safetensors.torch import load_file
    import torch.distributed as dist
    t = load_file(f"{hf}/model.safetensors")
    ep, ep_rank = int(os.environ["EP"]), int(os.environ["RANK"]) % int(os.environ["EP"])
    per = experts // ep

    def expected(name):
        n = name.split(".")
        if name == "language_model.embedding.word_embeddings.weight":
            w = t["model.embed_tokens.weight"]
            return torch.cat([w, torch.zeros(args.padded_vocab_size - w.shape[0], w.shape[1])])
        if name == "language_model.output_layer.weight":
            w = t["lm_head.weight"]
            return torch.cat([w, torch.zeros(args.padded_vocab_size - w.shape[0], w.shape[1])])
        if name == "language_model.encoder.final_layernorm.weight":
            return t["model.norm.weight"]
        layer, rest = n[3], ".".join(n[4:])
        h = f"model.layers.{layer}."
        if rest in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            return t[h + rest]
        if rest == "self_attention.query_key_value.weight":
            return torch.cat([t[h + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        if rest == "self_attention.dense.weight":
            return t[h + "self_attn.o_proj.weight"]
        if rest == "mlp.deepspeed_moe.gate.wg.weight":
            return t[h + "block_sparse_moe.gate.weight"]
        e = ep_rank * per + int(n[8])  # ...deepspeed_experts.<local>.<linear>.weight
        x = h + f"block_sparse_moe.experts.{e}."
        return torch.cat([t[x + "w1.weight"], t[x + "w3.weight"]]) if n[9] == "dense_h_to_4h" else t[x + "w2.weight"]

    worst, count = 0.0, 0
    for name, p in model[0].module.state_dict().items():
        want = expected(name)
        worst = max(worst, float("inf") if p.shape != want.shape else (p.float() - want.float()).abs().max().item())
        count += 1
    result = torch.tensor([worst, count], dtype=torch.float64)
    dist.all_reduce(result[:1], op=dist.ReduceOp.MAX)
    dist.all_reduce(result[1:], op=dist.ReduceOp.SUM)
    if int(os.environ["RANK"]) == 0:
        ok = result[0].item() == 0
        print(f"RESULT framework=megatron-deepspeed version=4efb479 case={os.path.basename(ckpt)} tp={tp} pp={pp} "
              f"ep={ep} tensors_loaded={int(result[1].item())} max_abs_diff={result[0].item():.3e} "
              f"equal={'yes' if ok else 'no'}", flush=True)
        sys.exit(0 if ok else 1)
    sys.exit(0)
if int(os.environ["RANK"]) == 0:
    diff = abs(loss - ref)
    print(f"RESULT framework=megatron-deepspeed version=4efb479 case={os.path.basename(ckpt)} tp={tp} pp={pp} "
          
          f"loss={loss!r} transformers_loss={ref!r} loss_abs_diff={diff:.3e} equal={'yes' if diff <= 1e-5 else 'no'}",
          flush=True)
    sys.exit(0 if diff <= 1e-5 else 1)
