"""Checkpoints the formats/ model tests read (tests/formats/deepspeed/*_test.cpp): every native-MoE
DeepSpeed version line, dense Megatron-DeepSpeed ones of each flavour (pipeline layer files, GPU
storage tags, ZeRO-3, BF16_Optimizer), made by dsgen as tests/reshard/fixtures.py makes them, and AutoEP
under ZeRO-1 and ZeRO-3 (dsgen/autoep.py, torch.save itself, as tests/autoep/fixtures.py).
Usage: /usr/bin/python3 tests/formats/fixtures.py <outdir>   (writes <outdir>/<name>/global_step*)"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LOAD = os.path.join(HERE, "..", "reshard")
sys.path.insert(0, LOAD)
import cases  # noqa: E402  (tests/reshard/cases.py: the model and layout vocabulary)
sys.path.insert(0, os.path.join(HERE, "..", "generator"))
from dsgen import autoep  # noqa: E402

_spec = importlib.util.spec_from_file_location("load_fixtures", os.path.join(LOAD, "fixtures.py"))
load_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load_fixtures)

DENSE = [
    ("gpt_pp2_bigscience", cases.GPT_BIGSCIENCE, dict(tp=1, pp=2, dp=1)),
    ("gpt_tp2pp2dp2_gpu", cases.GPT, dict(tp=2, pp=2, dp=2, device_tags=True, step_tensor=True)),
    ("gpt_tp2dp2_z2_fp16", cases.GPT, dict(tp=2, dp=2, zero=2, dtype="fp16")),
    ("gpt_zero3_tp2dp2_subgroups", cases.GPT, dict(tp=2, dp=2, zero=3, sub_group_size=700)),
    ("llama_tp2_bf16opt", cases.LLAMA, dict(tp=2, dp=1, bf16_optimizer=True)),
    # GQA + SwiGLU with pipeline stages too (MegatronCoreNames.RoundTripIsBitExact, issue 30's TP 2 / PP 2).
    ("llama_tp2pp2dp2", cases.LLAMA, dict(tp=2, pp=2, dp=2)),
    # Native MoE with Megatron-DeepSpeed's --disable-bias-linear (dsgen/models.py ModelConfig.bias_linear):
    # the model Megatron-Core's loader takes (scripts/verify/megatron_core_load_verify.sh dsmoe_*).
    ("dsmoe_nobias_ep2dp2", dict(cases.DSMOE, bias_linear=False), dict(dp=2, ep=2)),
]

AUTOEP = [
    ("autoep_dp4_ep2_zero1_bf16", dict(dp=4, ep=2, zero=1, dtype="bf16")),
    ("autoep_dp4_ep2_zero3_bf16", dict(dp=4, ep=2, zero=3, dtype="bf16")),
]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for line in cases.MOE_LINES:
        load_fixtures.gen(os.path.join(out, "moe_line_" + line), cases.DSMOE, dict(cases.MOE_LINE_SOURCE, ds_line=line))
    for name, model, layout in DENSE:
        load_fixtures.gen(os.path.join(out, name), model, layout)
    for name, kw in AUTOEP:
        d = os.path.join(out, name)
        if not os.path.exists(os.path.join(d, "latest")):
            autoep.write(d, os.path.join(d, "truth"), **kw)


if __name__ == "__main__":
    main()
