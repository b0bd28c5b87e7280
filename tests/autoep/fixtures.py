#!/usr/bin/python3
"""CI fixtures for the AutoEP tests: DeepSpeed AutoEP ZeRO-1/2 checkpoints (tests/generator/dsgen/autoep.py,
laid out as DeepSpeed v0.19.5's save code writes them) with the universal form autoep_universal.py
writes as ground truth, plus broken variants. Usage: fixtures.py <out_dir>"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
from dsgen import autoep  # noqa: E402
import torch  # noqa: E402

CASES = {
    "dp4_ep2_zero1_bf16": dict(dp=4, ep=2, zero=1, dtype="bf16"),
    "dp4_ep4_zero1_bf16": dict(dp=4, ep=4, zero=1, dtype="bf16"),
    "dp6_ep2_zero2_fp16_data_before_expert": dict(dp=6, ep=2, zero=2, dtype="fp16", data_before_expert=True),
    "dp2_ep1_zero2_fp32": dict(dp=2, ep=1, zero=2, dtype="fp32"),
    # ZeRO-3, partition-native (same seed and shapes as the ZeRO-1/2 cases above: the same weights)
    "dp4_ep2_zero3_bf16": dict(dp=4, ep=2, zero=3, dtype="bf16"),
    # expert-DP partitions with padding (2*10*8 = 160 elements over 3 ranks), expert-DP ranks first
    "dp6_ep2_zero3_fp16_data_before_expert": dict(dp=6, ep=2, zero=3, dtype="fp16", data_before_expert=True, ffn=10),
    # ZeRO-3 targets of ucp-load (the same weights): EP 4, DP 8 (the same run: 224 samples consumed, as
    # at DP 4), and small sub-groups (sub_group_size 200 elements per rank: the dense group cut in
    # several, the expert group in one per layer)
    "dp4_ep4_zero3_bf16": dict(dp=4, ep=4, zero=3, dtype="bf16"),
    "dp8_ep2_zero3_bf16": dict(dp=8, ep=2, zero=3, dtype="bf16", global_samples=224),
    "dp4_ep2_zero3_bf16_sub200": dict(dp=4, ep=2, zero=3, dtype="bf16", sub_group_size=200),
    # the weights of dp6_ep2_zero3_fp16_data_before_expert at DP 3, EP 1: padding in every dense
    # parameter (H = 8 over 3 ranks) and expert weight (4*10*8 = 320 over 3)
    "dp3_ep1_zero3_fp16_data_before_expert": dict(dp=3, ep=1, zero=3, dtype="fp16", data_before_expert=True, ffn=10,
                                                  global_samples=7 * 8 * 6),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, kw in CASES.items():
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        autoep.write(d, os.path.join(d, "truth"), **kw)

    # A second step of dp4_ep2_zero1_bf16 with other weights (pec-save / pec-restore chain).
    d = os.path.join(out, "dp4_ep2_zero1_bf16_step8")
    shutil.rmtree(d, ignore_errors=True)
    autoep.write(d, os.path.join(d, "truth"), dp=4, ep=2, zero=1, dtype="bf16", step=8, seed=97)

    # Broken variants of dp4_ep2_zero1_bf16.
    src = os.path.join(out, "dp4_ep2_zero1_bf16")
    ck = "global_step7"

    def variant(name):
        d = os.path.join(out, "bad_" + name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("truth"))
        return os.path.join(d, ck)

    os.remove(os.path.join(variant("missing_expert_file"), "layer_1_expert_3_mp_rank_00_model_states.pt"))

    def edit_model(name, fn):
        path = os.path.join(variant(name), "mp_rank_00_model_states.pt")
        sd = torch.load(path, weights_only=False)
        fn(sd)
        torch.save(sd, path)

    def drop_field(sd):
        del sd["ds_autoep_layers"][0]["expert_key_prefix"]
    edit_model("layer_missing_prefix", drop_field)

    def bad_count(sd):
        sd["ds_autoep_layers"][1]["num_experts"] = 6
    edit_model("layer_count_mismatch", bad_count)

    def not_list(sd):
        sd["ds_autoep_layers"] = {"moe_layer_id": 0}
    edit_model("layers_not_list", not_list)

    def bad_local_shape(sd):
        sd["param_shapes"][1]["model.layers.0.mlp.experts.w2"] = torch.Size([3, 8, 12])
    edit_model("local_shape_mismatch", bad_local_shape)

    # AutoEP under ZeRO-3 with TP 2 (a dense ZeRO-3 TP 2 checkpoint given ds_autoep_layers: DeepSpeed
    # refuses AutoEP + AutoTP under ZeRO-3, engine.py:1850-1853, so it is refused as never written).
    import glob
    import dsgen
    z3 = os.path.join(out, "bad_zero3_tp2")
    shutil.rmtree(z3, ignore_errors=True)
    dsgen.generate(z3, dsgen.ModelConfig(family="gpt", hidden=4, heads=2, ffn=8, vocab=10, seq=2, layers=1),
                   dsgen.Layout(dp=2, tp=2, zero=3), truth=False)
    for path in glob.glob(os.path.join(z3, "global_step*", "zero_pp_rank_*_model_states.pt")):
        sd = torch.load(path, weights_only=False)
        sd["ds_autoep_layers"] = autoep.autoep_layer_info(1, 4, 2, 2, zero3=True)
        torch.save(sd, path)

    # Broken variants of dp4_ep2_zero3_bf16.
    z3src = os.path.join(out, "dp4_ep2_zero3_bf16")

    def edit_z3(name, fn, rank):
        d = os.path.join(out, "bad_" + name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(z3src, d, ignore=shutil.ignore_patterns("truth"))
        path = os.path.join(d, ck, f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
        sd = torch.load(path, weights_only=False)
        fn(sd)
        torch.save(sd, path)

    def version2(sd):
        sd["ds_autoep_layers"][1]["checkpoint_format_version"] = 2
    edit_z3("zero3_format_version", version2, 1)

    def rank0_place(sd):  # DP rank 2 (EP rank 0, expert-DP rank 1) claims expert-DP rank 0
        sd["ds_autoep_layers"] = autoep.autoep_layer_info(2, 4, 2, 4, zero3=True)
    edit_z3("zero3_wrong_place", rank0_place, 2)

    # An expert file whose key names another expert.
    p = os.path.join(variant("expert_file_wrong_key"), "layer_0_expert_1_mp_rank_00_model_states.pt")
    sd = torch.load(p, weights_only=False)
    sd["model.layers.0.mlp.experts.w1.2"] = sd.pop("model.layers.0.mlp.experts.w1.1")
    torch.save(sd, p)


if __name__ == "__main__":
    main()
