#!/usr/bin/python3
"""CI fixtures for the ucp tests: a small set of generated checkpoints (every pattern kind, TP/PP/DP,
ZeRO-1/2/3 (ZeRO-3 also with TP 2), BF16_Optimizer, native MoE, trailing all-padding ranks) with ground truth, plus broken
variants for the failure tests. Usage: fixtures.py <out_dir>"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402
import torch  # noqa: E402

CASES = {
    # name: (ModelConfig kwargs, Layout kwargs)
    "gpt_tp2_pp2_dp3": (dict(family="gpt"), dict(tp=2, pp=2, dp=3)),
    "gpt_untied_swiglu_tp2_dp3_zero2_fp16": (dict(family="gpt", tied=False, swiglu=True),
                                             dict(tp=2, dp=3, zero=2, dtype="fp16")),
    "llama_gqa_tp2_dp2_bf16opt": (dict(family="llama", heads=4, kv_heads=2), dict(tp=2, dp=2, bf16_optimizer=True)),
    "mixtral_tp2_dp2_fp32": (dict(family="mixtral", heads=4, kv_heads=2), dict(tp=2, dp=2, dtype="fp32",
                                                                             step_tensor=True)),
    "dsmoe_dp4_ep2": (dict(family="dsmoe"), dict(dp=4, ep=2)),
    # Native MoE whose layers have different expert counts (num_experts = [2, 4]).
    "dsmoe_uneven_experts_dp4_ep2": (dict(family="dsmoe", experts_per_layer=(2, 4)), dict(dp=4, ep=2)),
    "gpt_dp16_padding_ranks": (dict(family="gpt", hidden=6, heads=2, ffn=10, vocab=10, seq=3, layers=1), dict(dp=16)),
    "gpt_no_uc_info": (dict(family="gpt"), dict(tp=2, dp=2, uc_info=False)),
    "gpt_zero3_dp40_subgroups": (dict(family="gpt"), dict(dp=40, zero=3, sub_group_size=2000)),
    # ZeRO-3 with TP (Megatron-DeepSpeed / AutoTP): hidden 4 leaves DP rank 2 an empty slice of
    # every 4-element parameter; sub-group size 8 gives 11 sub-groups per TP rank.
    "gpt_zero3_tp2_dp3_subgroups": (dict(family="gpt", hidden=4, heads=2, ffn=8, vocab=10, seq=2, layers=2),
                                    dict(tp=2, dp=3, zero=3, sub_group_size=8)),
    "llama_gqa_zero3_tp2_dp2_fp16": (dict(family="llama", heads=4, kv_heads=2, layers=2),
                                     dict(tp=2, dp=2, zero=3, dtype="fp16", sub_group_size=600)),
}

# One checkpoint per shipped pattern file (patterns/<name>.json), converted with --patterns by the
# ShippedPatternFiles test: the generator's default sizes, TP = 2 where the family allows it.
PATTERN_CASES = {
    "megatron-gpt-tied": (dict(family="gpt"), dict(tp=2)),
    "megatron-gpt-untied": (dict(family="gpt", tied=False), dict(tp=2)),
    "megatron-gpt-tied-swiglu": (dict(family="gpt", swiglu=True), dict(tp=2)),
    "megatron-gpt-untied-swiglu": (dict(family="gpt", tied=False, swiglu=True), dict(tp=2)),
    "megatron-gpt-pipe-tied": (dict(family="gpt"), dict(tp=2, pp=2)),
    "megatron-gpt-pipe-untied": (dict(family="gpt", tied=False), dict(tp=2, pp=2)),
    "llama-gqa": (dict(family="llama", heads=4, kv_heads=2), dict(tp=2)),
    "mixtral-moe": (dict(family="mixtral", heads=4, kv_heads=2), dict(tp=2)),
    "deepspeed-native-moe": (dict(family="dsmoe"), dict(dp=2, ep=2)),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, (mk, lk) in CASES.items():
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        model = dsgen.generate(d, dsgen.ModelConfig(**mk), dsgen.Layout(**lk))
        if name == "gpt_no_uc_info":
            import json
            with open(os.path.join(out, "gpt_no_uc_info.patterns.json"), "w") as f:
                json.dump(model.uc_info, f)
            info = dict(model.uc_info)
            info["tp_replicated_parameter_patterns"] = info["tp_replicated_parameter_patterns"] + ["no_such_param"]
            with open(os.path.join(out, "unused.patterns.json"), "w") as f:
                json.dump(info, f)
    for name, (mk, lk) in PATTERN_CASES.items():
        d = os.path.join(out, "patterns", name)
        shutil.rmtree(d, ignore_errors=True)
        dsgen.generate(d, dsgen.ModelConfig(**mk), dsgen.Layout(**lk))
    # A shape mismatch between fragments: tp rank 1 claims a row-parallel weight is transposed.
    src = os.path.join(out, "gpt_tp2_pp2_dp3")
    bad = os.path.join(out, "bad_shape")
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(src, bad, ignore=shutil.ignore_patterns("truth"))
    f = os.path.join(bad, "global_step100", "mp_rank_01_model_states.pt")
    sd = torch.load(f, weights_only=False)
    for group in sd["param_shapes"]:
        for k, v in group.items():
            if k.endswith("self_attention.dense.weight"):
                group[k] = torch.Size([v[1], v[0]])
    torch.save(sd, f)
    # Drifted TP replicas: tp rank 1's copy of a LayerNorm weight moved by 1e-6.
    drift = os.path.join(out, "drift")
    shutil.rmtree(drift, ignore_errors=True)
    shutil.copytree(src, drift, ignore=shutil.ignore_patterns("truth"))
    f = os.path.join(drift, "global_step100", "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt")
    sd = torch.load(f, weights_only=False)
    osd = sd["optimizer_state_dict"]
    for g, mapping in enumerate(osd["param_slice_mappings"]):
        for k, frag in mapping.items():
            if k.endswith("input_layernorm.weight"):
                osd["single_partition_of_fp32_groups"][g][frag.start] += 1e-6
                break
        else:
            continue
        break
    torch.save(sd, f)
    print(f"fixtures: {len(CASES) + 2} checkpoints in {out}")


if __name__ == "__main__":
    main()
