"""The load round-trip matrix: (name, model, source layout, target layout). Shared by fixtures.py
(CI subset), scripts/checks/test_load_matrix.sh (everything) and the tests (which read cases.json)."""

# model: dict of dsgen.ModelConfig fields; layouts: dict of dsgen.Layout fields.
GPT = {"family": "gpt", "layers": 4, "hidden": 32, "heads": 4, "kv_heads": 4, "ffn": 64, "vocab": 100, "seq": 16}
GPT_UNTIED_SWIGLU = dict(GPT, tied=False, swiglu=True)
GPT_TIED_SWIGLU = dict(GPT, swiglu=True)
# GPTModelPipe layer numbering of BigScience's fork (embedding 1, blocks from 3; dsgen PIPE_NUMBERING)
GPT_BIGSCIENCE = dict(GPT, pipe_numbering="bigscience")
# Every pipeline case has word and position embeddings tied (both on the first and the last stage).
# Sources with device_tags write cuda:N storage tags and a tensor step, as a GPU job does.
DSMOE = {"family": "dsmoe", "layers": 4, "hidden": 32, "heads": 4, "kv_heads": 4, "ffn": 64, "vocab": 100, "seq": 16,
         "experts": 4}
DSMOE8 = dict(DSMOE, experts=8)
LLAMA = {"family": "llama", "layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 64, "vocab": 100}

CI = [
    # TP growth with DP changing divisibility (2 -> 3), bf16 ZeRO-1
    ("gpt_tp1dp2_to_tp2dp3", GPT, dict(tp=1, dp=2), dict(tp=2, dp=3)),
    # TP shrink, ZeRO stage change 1 -> 2, dtype change bf16 -> fp16
    ("gpt_tp2dp2_to_tp1dp4_z2_fp16", GPT, dict(tp=2, dp=2), dict(tp=1, dp=4, zero=2, dtype="fp16")),
    # PP growth 2 -> 4 with TP growth (pipeline layer files, tied embeddings on first and last stage),
    # BigScience's layer numbering
    ("gpt_pp2_to_tp2pp4dp2", GPT_BIGSCIENCE, dict(tp=1, pp=2, dp=1), dict(tp=2, pp=4, dp=2)),
    # issue 14: Megatron-DeepSpeed numbering, TP2 PP2 DP2 bf16 from a GPU job -> TP2 PP2 DP3 ZeRO-1
    ("gpt_tp2pp2dp2_gpu_to_tp2pp2dp3", GPT, dict(tp=2, pp=2, dp=2, device_tags=True, step_tensor=True),
     dict(tp=2, pp=2, dp=3, step_tensor=True)),
    # GQA sub-params, SwiGLU, averaged norms; BF16_Optimizer source and target, DP 1 -> 5
    ("llama_tp2_to_tp1dp5_bf16opt", LLAMA, dict(tp=2, dp=1, bf16_optimizer=True), dict(tp=1, dp=5, bf16_optimizer=True)),
    # native DeepSpeed MoE: EP 2 -> 4 and 4 -> 2 (global -> local expert numbering, expert-DP groups)
    ("dsmoe_ep2dp4_to_ep4dp4", DSMOE, dict(dp=4, ep=2), dict(dp=4, ep=4)),
    ("dsmoe_ep4dp4_to_ep2dp6", DSMOE, dict(dp=4, ep=4), dict(dp=6, ep=2)),
    # ZeRO stage 1 -> 3 with TP 2, DP 2 -> 3 and several sub-groups per TP rank
    ("gpt_tp2dp2_to_zero3_tp2dp3_subgroups", GPT, dict(tp=2, dp=2), dict(tp=2, dp=3, zero=3, sub_group_size=700)),
    # ZeRO-3 source, TP = 1 (ds_to_universal's flat form, vocabulary padding kept) -> ZeRO-1 TP 2
    ("gpt_zero3_tp1dp2_subgroups_to_tp2dp3", GPT, dict(tp=1, dp=2, zero=3, sub_group_size=700, device_tags=True),
     dict(tp=2, dp=3)),
]

# Native MoE of every DeepSpeed version line (tests/generator/dsgen/dsmoe.py): EP 2 -> 4 -> 2 round trips and
# --ds-version conversions (tests/reshard/moe_lines_test.cpp).
MOE_LINES = ["0.14", "0.17.1", "0.19.2", "0.19.3", "0.19.5"]
MOE_LINE_SOURCE = dict(dp=4, ep=2)

FULL = CI + [
    ("gpt_tp4dp1_to_tp1dp8", GPT, dict(tp=4, dp=1), dict(tp=1, dp=8)),
    ("gpt_untied_swiglu_tp1_to_tp2dp2_fp32", GPT_UNTIED_SWIGLU, dict(tp=1, dp=1), dict(tp=2, dp=2, dtype="fp32")),
    ("gpt_pp4_to_pp2dp3", GPT, dict(tp=1, pp=4, dp=1), dict(tp=1, pp=2, dp=3)),
    ("gpt_tp2pp2dp2_to_tp4pp2dp1", GPT, dict(tp=2, pp=2, dp=2), dict(tp=4, pp=2, dp=1)),
    ("gpt_swiglu_pp2_to_pp3dp2", GPT_TIED_SWIGLU, dict(tp=1, pp=2, dp=1), dict(tp=1, pp=3, dp=2)),
    ("gpt_bigscience_tp2pp2dp2_gpu_to_tp1pp4dp2_fp16", GPT_BIGSCIENCE,
     dict(tp=2, pp=2, dp=2, device_tags=True, step_tensor=True), dict(tp=1, pp=4, dp=2, dtype="fp16", step_tensor=True)),
    ("gpt_z2fp16_to_z1bf16dp7", GPT, dict(tp=1, dp=2, zero=2, dtype="fp16"), dict(tp=1, dp=7)),
    ("llama_tp1_to_tp2dp3", LLAMA, dict(tp=1, dp=1), dict(tp=2, dp=3)),
    ("gpt_dp1_to_dp16_trailing_pad", GPT, dict(tp=1, dp=1), dict(tp=2, dp=16)),
    ("dsmoe8_ep8dp8_to_ep1dp2", DSMOE8, dict(dp=8, ep=8), dict(dp=2, ep=1)),
    ("dsmoe8_ep1dp1_to_ep8dp8", DSMOE8, dict(dp=1, ep=1), dict(dp=8, ep=8)),
    ("dsmoe_data_before_expert_ep2dp4_to_ep4dp8", DSMOE, dict(dp=4, ep=2, data_before_expert=True),
     dict(dp=8, ep=4, data_before_expert=True)),
    ("dsmoe_ep2_to_ep2dp2_fp16_z2", DSMOE, dict(dp=2, ep=2), dict(dp=2, ep=2, zero=2, dtype="fp16")),
    # ZeRO-3 targets: TP = 1 (the union gives ds_to_universal's flat form), GQA + SwiGLU sub-params,
    # DP 16 where small parameters leave ranks with empty slices, fp32
    ("gpt_tp2_to_zero3_tp1dp3_fp16", GPT, dict(tp=2, dp=1), dict(tp=1, dp=3, zero=3, dtype="fp16", sub_group_size=500)),
    ("llama_tp1_to_zero3_tp2dp2", LLAMA, dict(tp=1, dp=2, bf16_optimizer=True), dict(tp=2, dp=2, zero=3)),
    ("gpt_z2fp16_to_zero3_dp16_fp32", GPT, dict(tp=1, dp=2, zero=2, dtype="fp16"),
     dict(tp=1, dp=16, zero=3, dtype="fp32", sub_group_size=300)),
    # ZeRO-3 sources: TP 2 (dict form, sub-groups) -> ZeRO-2 TP 1 fp16; flat TP 1 -> flat TP 1 with
    # other sub-groups and DP; GQA + SwiGLU ZeRO-3 TP 2 -> BF16_Optimizer TP 1
    ("gpt_zero3_tp2dp2_to_z2_tp1dp3_fp16", GPT, dict(tp=2, dp=2, zero=3, sub_group_size=500),
     dict(tp=1, dp=3, zero=2, dtype="fp16")),
    ("gpt_zero3_tp1dp3_to_zero3_tp1dp2", GPT, dict(tp=1, dp=3, zero=3, sub_group_size=400),
     dict(tp=1, dp=2, zero=3, sub_group_size=900)),
    ("llama_zero3_tp2dp2_to_tp1dp2_bf16opt", LLAMA, dict(tp=2, dp=2, zero=3), dict(tp=1, dp=2, bf16_optimizer=True)),
]


def target_args(t):
    """ucp-load arguments for a target layout dict."""
    a = ["--tp", str(t.get("tp", 1)), "--pp", str(t.get("pp", 1)), "--dp", str(t.get("dp", 1)),
         "--zero-stage", str(t.get("zero", 1)), "--dtype", t.get("dtype", "bf16"), "--ep", str(t.get("ep", 1))]
    a += ["--optimizer", "bf16" if t.get("bf16_optimizer") else "zero"]
    if t.get("zero") == 3:
        a += ["--sub-group-size", str(t.get("sub_group_size", 1_000_000_000))]
    # dsgen pads the vocabulary to a multiple of 8 * tp and, unlike Megatron, does not record
    # make_vocab_size_divisible_by in args: say it (else ucp-load infers the largest that fits).
    a += ["--vocab-multiple", "8"]
    return a
