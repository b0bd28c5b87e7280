"""Source checkpoints for ucp-load's target-default tests (tests/reshard/defaults_test.cpp), written by
tests/generator/dsgen into a scratch folder: a native DeepSpeed MoE run saved at EP 2 in fp16 (the issue 28
case: EP and precision must be kept when not given) and a dense GPT saved at TP 2 PP 2 in fp16.
Usage: defaults_sources.py out_dir"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402

MOE = dsgen.ModelConfig(family="dsmoe", layers=4, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=128, seq=16, experts=4)
GPT = dsgen.ModelConfig(family="gpt", layers=4, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=100, seq=16)


def main(out):
    shutil.rmtree(out, ignore_errors=True)
    dsgen.generate(os.path.join(out, "moe_fp16_ep2"), MOE,
                   dsgen.Layout(dp=4, ep=2, zero=1, dtype="fp16", step=20, seed=5), truth=False)
    dsgen.generate(os.path.join(out, "gpt_fp16_tp2pp2"), GPT,
                   dsgen.Layout(tp=2, pp=2, dp=1, zero=1, dtype="fp16", step=30, seed=6), truth=False)


if __name__ == "__main__":
    main(sys.argv[1])
