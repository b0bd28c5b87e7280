"""Fixtures of the CLI vocabulary tests (tests/tool): a tiny dense GPT checkpoint (TP 1, DP 2,
ZeRO-1), a tiny native-MoE checkpoint (EP 2, DP 2, 4 experts per MoE layer) written by the generator
(tests/generator/dsgen), token counts for it, expert loads for moe-replace, and gpt_bad_crc: gpt with one
byte of tensor data changed in an optimizer shard (its zip CRC-32 no longer matches).
Usage: /usr/bin/python3 tests/tool/fixtures.py OUT_DIR"""
import json
import os
import random
import shutil
import struct
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "generator"))


def flip_data_byte(path):
    """Changes the middle byte of the largest record's data (the CRC-32 in the directory stays)."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset)
        head = f.read(30)
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))


def main():
    out = sys.argv[1]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    import dsgen  # imports torch (seconds)
    gpt = dsgen.ModelConfig(family="gpt", layers=2, hidden=16, heads=2, kv_heads=2, ffn=32, vocab=64, seq=8)
    dsgen.generate(os.path.join(out, "gpt"), gpt, dsgen.Layout(dp=2, zero=1, dtype="bf16", step=100, seed=5),
                   truth=False)
    moe = dsgen.ModelConfig(family="dsmoe", layers=2, hidden=16, heads=2, kv_heads=2, ffn=32, vocab=64, seq=8,
                            experts=4)
    dsgen.generate(os.path.join(out, "moe"), moe, dsgen.Layout(dp=2, ep=2, zero=1, dtype="bf16", step=100, seed=6),
                   truth=False)
    bad = os.path.join(out, "gpt_bad_crc")
    shutil.copytree(os.path.join(out, "gpt"), bad)
    flip_data_byte(os.path.join(bad, "global_step100", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump([[10, 200, 30, 400]], f)
    rng = random.Random(7)
    with open(os.path.join(out, "loads.json"), "w") as f:
        json.dump([[rng.randint(1, 1000) for _ in range(8)] for _ in range(2)], f)


if __name__ == "__main__":
    main()
