"""DeepSpeed AutoEP source checkpoints for ucp-load's direct-mode tests (tests/reshard/direct_autoep_test.cpp),
written by tests/generator/dsgen/autoep.py (DeepSpeed v0.19.5's save code; file:line there) into a scratch
folder, the same cases as tests/autoep/fixtures.py uses. Usage: autoep_sources.py out_dir name..."""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
from dsgen import autoep  # noqa: E402

CASES = {
    "dp4_ep2_zero1_bf16": dict(dp=4, ep=2, zero=1, dtype="bf16"),
    "dp6_ep2_zero2_fp16_data_before_expert": dict(dp=6, ep=2, zero=2, dtype="fp16", data_before_expert=True),
    "dp4_ep2_zero3_bf16": dict(dp=4, ep=2, zero=3, dtype="bf16"),
    # expert-DP partitions with padding (2*10*8 = 160 elements over 3 ranks), expert-DP ranks first
    "dp6_ep2_zero3_fp16_data_before_expert": dict(dp=6, ep=2, zero=3, dtype="fp16", data_before_expert=True, ffn=10),
}


def main(out, names):
    for name in names:
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        autoep.write(d, os.path.join(d, "truth"), **CASES[name])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
