"""Reliability fixtures: one small Megatron-DeepSpeed GPT checkpoint (TP 1, PP 1, DP 2, ZeRO-1, bf16)
written by tests/generator/dsgen, the input of the commit and durability tests (and of the output / confinement
tests); fixtures_shards.py adds the shard-agreement cases (agree/) and a native MoE checkpoint (moe/).
Usage: /usr/bin/python3 tests/reliability/fixtures.py OUT_DIR"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsgen  # noqa: E402

out = sys.argv[1]
if os.path.exists(out):
    shutil.rmtree(out)
os.makedirs(out)
dsgen.generate(os.path.join(out, "gpt"), dsgen.ModelConfig(family="gpt", layers=2, hidden=32, heads=4, ffn=128, vocab=96,
               seq=16), dsgen.Layout(tp=1, pp=1, dp=2, zero=1, dtype="bf16", step=10, seed=3), truth=False)

# Shards that must agree, paths from files, outputs over inputs (issue 16 items 2, 3, 5, 8).
import fixtures_shards  # noqa: E402
fixtures_shards.write(out)
fixtures_shards.write_pec_source(out)

# Items 6, 7, 12 (bugs_test.cpp): variants of gpt.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bugs_fixtures  # noqa: E402

bugs_fixtures.make(out)

# WEAK cases (weak_test.cpp): a pickle with control bytes in a string, a fragment_address of another class.
import weak_fixtures  # noqa: E402

weak_fixtures.make(out)
