#!/usr/bin/python3
"""Generates a DeepSpeed / Megatron-DeepSpeed checkpoint with seeded random values plus its ground
truth (see docs/fixtures.md). Run with Debian's /usr/bin/python3 (torch 1.13)."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsgen  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--output", required=True, help="folder to create: latest, global_stepN/, truth/")
    ap.add_argument("--model", default="gpt", choices=["gpt", "llama", "mixtral", "dsmoe", "autoep"],
                    help="autoep: DeepSpeed AutoEP (>= 0.19.2) Hugging Face style MoE, ZeRO-1/2 or ZeRO-3 (partition-native), as v0.19.5 saves it "
                         "(tests/generator/dsgen/autoep.py; uses --layers --hidden --ffn --vocab --experts --dp --ep --zero "
                         "--dtype --data-before-expert --step --seed)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None, help="GQA key/value heads (llama, mixtral)")
    ap.add_argument("--ffn", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=100)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--untied", action="store_true", help="gpt: separate output layer")
    ap.add_argument("--swiglu", action="store_true", help="gpt: fused SwiGLU dense_h_to_4h")
    ap.add_argument("--disable-bias-linear", action="store_true",
                    help="gpt, dsmoe: no biases on the linear layers (experts included), LayerNorm biases kept, "
                         "as Megatron-DeepSpeed's --disable-bias-linear (dsgen/models.py ModelConfig.bias_linear)")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--zero", type=int, default=1, choices=[1, 2, 3])
    ap.add_argument("--sub-group-size", type=int, default=1_000_000_000, help="ZeRO-3 sub-group size (elements per rank)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--bf16-optimizer", action="store_true", help="BF16_Optimizer files (no zero_stage)")
    ap.add_argument("--data-before-expert", action="store_true", help="ds_config use_data_before_expert_parallelism (D+E rank order)")
    ap.add_argument("--ds-line", default=dsgen.dsmoe.DEFAULT_LINE, choices=list(dsgen.dsmoe.LINES),
                    help="dsmoe: DeepSpeed version line of the MoE save path (tests/generator/dsgen/dsmoe.py)")
    ap.add_argument("--block-prefix", help="dsmoe: name the blocks <prefix>.N (blocks, h, transformer.layer) instead "
                    "of Megatron's language_model.encoder.layers.N (tests/generator/dsgen/dsmoe.py rename_blocks)")
    ap.add_argument("--moe-param-groups", default="megatron", choices=["megatron", "tutorial"],
                    help="dsmoe: megatron = Megatron-DeepSpeed's decay / no-decay groups; tutorial = DeepSpeed's MoE "
                    "tutorial grouping (one 'parameters' group split by split_params_into_different_moe_groups_for_optimizer "
                    "into a dense and an 'ep_size_<EP>' group, no Megatron client state; needs --block-prefix; "
                    "tests/generator/dsgen/dsmoe.py tutorial_groups)")
    ap.add_argument("--step", type=int, default=100)
    ap.add_argument("--step-tensor", action="store_true")
    ap.add_argument("--pipe-numbering", default="megatron-deepspeed", choices=["megatron-deepspeed", "bigscience"],
                    help="GPTModelPipe layer_NN numbering (dsgen/models.py PIPE_NUMBERING)")
    ap.add_argument("--device-tags", action="store_true",
                    help="cuda:<local rank> storage tags on GPU-held tensors, as a GPU job saves them")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--elastic", action="store_true", help="elastic_checkpoint: base_optimizer_state as a list")
    ap.add_argument("--no-uc-info", action="store_true", help="omit universal_checkpoint_info")
    ap.add_argument("--no-truth", action="store_true")
    ap.add_argument("--patterns-out", help="also write the model's patterns as a pattern file (JSON)")
    a = ap.parse_args()
    if a.model == "autoep":
        from dsgen import autoep
        if a.tp != 1 or a.pp != 1:
            ap.error("--model autoep: TP = PP = 1")
        t0 = time.time()
        try:
            autoep.write(a.output, None if a.no_truth else os.path.join(a.output, "truth"), dp=a.dp, ep=a.ep,
                         zero=a.zero, dtype=a.dtype, layers=a.layers, experts=a.experts, hidden=a.hidden, ffn=a.ffn,
                         vocab=a.vocab, step=a.step, seed=a.seed, data_before_expert=a.data_before_expert)
        except ValueError as e:
            ap.error(f"--model autoep: {e}")
        print(f"gen_ds_checkpoint: autoep dp={a.dp} ep={a.ep} zero={a.zero} {a.dtype}: {time.time() - t0:.1f}s -> "
              f"{a.output}", file=sys.stderr)
        return
    kv = a.kv_heads if a.kv_heads is not None else (max(1, a.heads // 2) if a.model in ("llama", "mixtral") else a.heads)
    cfg = dsgen.ModelConfig(family=a.model, layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=kv,
                            ffn=a.ffn, vocab=a.vocab, seq=a.seq, tied=not a.untied, swiglu=a.swiglu,
                            bias_linear=not a.disable_bias_linear, experts=a.experts, pipe_numbering=a.pipe_numbering)
    lay = dsgen.Layout(tp=a.tp, pp=a.pp, dp=a.dp, zero=a.zero, dtype=a.dtype, bf16_optimizer=a.bf16_optimizer,
                       ep=a.ep, data_before_expert=a.data_before_expert, step=a.step, step_tensor=a.step_tensor,
                       seed=a.seed, uc_info=not a.no_uc_info, elastic=a.elastic, sub_group_size=a.sub_group_size,
                       device_tags=a.device_tags, ds_line=a.ds_line, moe_groups=a.moe_param_groups)
    t0 = time.time()
    if a.block_prefix and a.model != "dsmoe":
        ap.error("--block-prefix: only with --model dsmoe")
    if a.moe_param_groups == "tutorial" and not a.block_prefix:
        ap.error("--moe-param-groups tutorial: with --block-prefix (a model that is not Megatron's)")
    model = dsgen.generate(a.output, cfg, lay, truth=not a.no_truth, block_prefix=a.block_prefix)
    if a.patterns_out:
        import json
        with open(a.patterns_out, "w") as f:
            json.dump(model.uc_info, f, indent=2)
    n = sum(int(__import__("math").prod(p.shape)) for p in model.params if not p.tied_copy)
    print(f"gen_ds_checkpoint: {a.model} tp={a.tp} pp={a.pp} dp={a.dp} ep={a.ep} zero={a.zero} {a.dtype}: "
          f"{len(model.params)} params, {n} elements, {time.time() - t0:.1f}s -> {a.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
