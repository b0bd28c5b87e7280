"""The DeepSpeed engine trains a transformers model and saves it (tests/frameworks/ds_hf_export_test.sh): what a
job that fine-tunes a Hugging Face model under DeepSpeed (HF Trainer with a DeepSpeed config, or its own loop)
leaves behind, its module names the Hugging Face names.

    ds_hf_models.py OUT CASE [CASE ...]      CASE: llama_z1, llama_z3, mixtral_z1

Per case, 2 gloo ranks on CPU: the model built from its own config class with a fixed seed (transformers 5.24.0
LlamaConfig / MixtralConfig: hidden 16, 2 layers, 4 heads in 2 key-value groups, vocabulary 64; Mixtral 4 experts of
24, top 2), torch.optim.AdamW, deepspeed.initialize at ZeRO 1 or 3 (fp32), 2 training steps on fixed batches,
engine.save_checkpoint(OUT/CASE/ckpt), the config beside it (config.save_pretrained with the architectures the
model's save_pretrained records, as the HF Trainer saves it into its checkpoint folder), then the engine's own forward (eval, no grad) on a fixed batch: its logits to
OUT/CASE/logits.pt. The DeepSpeed code relied on (0.19.8, site-packages/deepspeed/): init_distributed(dist_backend=
"gloo") comm/comm.py:844; initialize(model, optimizer, config) __init__.py:433; the ZeRO stage
"zero_optimization": {"stage": S} and "zero_allow_untested_optimizer" (a client torch optimizer) read by
runtime/config.py; engine.backward / engine.step; engine.save_checkpoint runtime/engine.py:4869. Nothing is
downloaded."""
import os
import sys


def worker(rank, out, cases, port):
    os.environ.update(DS_ACCELERATOR="cpu", USE_LIBUV="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_SIZE="2")
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import deepspeed
    import deepspeed.ops
    # The CPU accelerator's shared-memory allreduce is a JIT build that serves inference only
    # (scripts/frameworks/ds_train_loop.py says where): marked not compatible, as on a platform without it.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM
    for case in cases:
        family, zero = case.split("_z")
        torch.manual_seed(0)
        kw = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5, tie_word_embeddings=False)
        if family == "mixtral":
            kw.update(num_local_experts=4, num_experts_per_tok=2, intermediate_size=24)
            config = MixtralConfig(**kw)
            model = MixtralForCausalLM(config)
        else:
            config = LlamaConfig(**kw)
            model = LlamaForCausalLM(config)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 4,
              "zero_optimization": {"stage": int(zero)}, "zero_allow_untested_optimizer": True, "steps_per_print": 1000}
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
        for step in range(2):
            ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(100 * step + rank))
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        ckpt = os.path.join(out, case, "ckpt")
        engine.save_checkpoint(ckpt)
        engine.eval()
        ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            logits = engine(input_ids=ids).logits
        if rank == 0:
            config.architectures = [type(model).__name__]  # what the model's save_pretrained records (modeling_utils.py:3447)
            config.save_pretrained(ckpt)
            torch.save({"ids": ids, "logits": logits}, os.path.join(out, case, "logits.pt"))
            print(f"ds_hf_models: {case} trained 2 steps at ZeRO {zero} on 2 ranks, saved", flush=True)
        del engine


if __name__ == "__main__":
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2:], 20000 + os.getpid() % 20000), nprocs=2)
