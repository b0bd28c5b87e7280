"""Reliability fixtures: one small Megatron-DeepSpeed GPT checkpoint (TP 1, PP 1, DP 2, ZeRO-1, bf16)
written by scripts/dsgen, the input of the commit and durability tests.
Usage: /usr/bin/python3 tests/reliability/fixtures.py OUT_DIR"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import dsgen  # noqa: E402

out = sys.argv[1]
if os.path.exists(out):
    shutil.rmtree(out)
os.makedirs(out)
dsgen.generate(os.path.join(out, "gpt"), dsgen.ModelConfig(family="gpt", layers=2, hidden=32, heads=4, ffn=128, vocab=96,
               seq=16), dsgen.Layout(tp=1, pp=1, dp=2, zero=1, dtype="bf16", step=10, seed=3), truth=False)

# Items 6, 7, 12 (bugs_test.cpp): variants of gpt.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bugs_fixtures  # noqa: E402

bugs_fixtures.make(out)
