"""The DeepSpeed engine as the judge of a Hugging Face import (tests/frameworks/ds_hf_import_test.sh, docs/hf.md
"DeepSpeed output").

    ds_hf_import.py models OUT                  the Hugging Face folders: OUT/<family> by save_pretrained
    ds_hf_import.py resume OUT LR CASE [...]    CASE: <family>_z<stage>, our checkpoint in OUT/CASE

models: each family's model built from its own config class with a fixed seed (transformers 5.24.0: hidden 16,
2 layers, 4 heads in 2 key-value groups, vocabulary 64; a Llama with tied embeddings too; the MoE ones 4 experts, top 2, Qwen3-MoE with layer 0
dense, Qwen2-MoE with a shared expert), saved with save_pretrained (transformers 5.24.0 modeling_utils.py:3319: one
model.safetensors, config.json, per-expert names for the MoE families; the bf16 one after model.to(bfloat16)).

resume, per case on 2 gloo ranks on CPU: run A starts from the weights in memory (from_pretrained of the folder),
run B from a model of the same config with other random weights that DeepSpeed's engine.load_checkpoint(OUT/CASE)
overwrites (runtime/engine.py:4395 load_checkpoint, load_optimizer_states and load_lr_scheduler_states left at
their defaults); both deepspeed.initialize(model, torch.optim.AdamW(model.parameters(), lr=LR), config) at the
case's ZeRO stage (fp32) and train 3 steps on the same fixed batches. The losses of every step must be equal
(torch.equal): the first checks the weights, the later ones the optimizer state and its hyperparameters. The
DeepSpeed code relied on (0.19.8, site-packages/deepspeed/): init_distributed comm/comm.py:844, initialize
__init__.py:433, engine.backward / engine.step, load_checkpoint. Nothing is downloaded."""
import os
import sys

KW = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5, tie_word_embeddings=False)


def family_model(family, seed):
    import torch
    import transformers as T
    torch.manual_seed(seed)
    if family == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**KW))
    if family == "llama_bf16":  # a released model's precision: saved in bfloat16
        return T.LlamaForCausalLM(T.LlamaConfig(**KW)).to(torch.bfloat16)
    if family == "llama_tied":
        return T.LlamaForCausalLM(T.LlamaConfig(**{**KW, "tie_word_embeddings": True}))
    if family == "mixtral":
        return T.MixtralForCausalLM(T.MixtralConfig(**{**KW, "intermediate_size": 24}, num_local_experts=4,
                                                    num_experts_per_tok=2))
    if family == "qwen3_moe":
        return T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(**KW, head_dim=4, num_experts=4, num_experts_per_tok=2,
                                                      moe_intermediate_size=8, mlp_only_layers=[0]))
    if family == "qwen2_moe":
        return T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(**KW, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                                                      shared_expert_intermediate_size=12))
    raise SystemExit(f"unknown family {family}")


FAMILIES = ["llama", "llama_tied", "llama_bf16", "mixtral", "qwen3_moe", "qwen2_moe"]


def worker(rank, out, lr, cases, port):
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
    from transformers import AutoModelForCausalLM
    failed = 0
    for case in cases:
        family, zero = case.rsplit("_z", 1)
        ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 4,
              "zero_optimization": {"stage": int(zero)}, "zero_allow_untested_optimizer": True, "steps_per_print": 1000}
        bf16 = family.endswith("_bf16")
        if bf16:
            ds["bf16"] = {"enabled": True}  # bf16 module, fp32 master in the ZeRO optimizer
        losses = {}
        for run in ("memory", "checkpoint"):
            if run == "memory":
                model = AutoModelForCausalLM.from_pretrained(os.path.join(out, family),
                                                             dtype=torch.bfloat16 if bf16 else torch.float32)
            else:
                model = family_model(family, 1234)  # other weights: the checkpoint must replace every one
                model = model.to(torch.bfloat16) if bf16 else model.float()
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=lr)
            engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
            if run == "checkpoint":
                path, _ = engine.load_checkpoint(os.path.join(out, case))
                if path is None:
                    raise SystemExit(f"FAIL case={case}: load_checkpoint found no checkpoint")
            losses[run] = []
            for step in range(3):
                ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(100 * step + rank))
                loss = engine(input_ids=ids, labels=ids).loss
                losses[run].append(loss.detach().clone())
                engine.backward(loss)
                engine.step()
            del engine
        same = all(torch.equal(a, b) for a, b in zip(losses["memory"], losses["checkpoint"]))
        if rank == 0:
            shown = ", ".join(f"{a.item()!r}/{b.item()!r}" for a, b in zip(losses["memory"], losses["checkpoint"]))
            if same:
                print(f"RESULT framework=deepspeed version={deepspeed.__version__} case={case} zero_stage={zero} ranks=2 "
                      f"steps=3 losses_identical=yes losses={shown}", flush=True)
            else:
                print(f"FAIL case={case}: losses (from memory / from our checkpoint) {shown}", flush=True)
        failed += not same
    # The worker ends without the interpreter's teardown: after every case had passed, that teardown aborted now and
    # then in the frameworks' native threads ("terminate called without an active exception", SIGABRT; one run in
    # four under ctest, with or without destroy_process_group first).
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)


def main():
    if sys.argv[1] == "models":
        import warnings
        warnings.filterwarnings("ignore")
        for family in FAMILIES:
            family_model(family, 0).save_pretrained(os.path.join(sys.argv[2], family))
            print(f"ds_hf_import: {family} saved", flush=True)
        return
    import torch.multiprocessing as mp
    out, lr, cases = sys.argv[2], float(sys.argv[3]), sys.argv[4:]
    mp.spawn(worker, args=(out, lr, cases, 20000 + os.getpid() % 20000), nprocs=2)


if __name__ == "__main__":
    main()
