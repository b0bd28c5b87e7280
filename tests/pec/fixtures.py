"""PEC fixtures: a chain of native DeepSpeed MoE checkpoints (one per training step, each with its
own values) written by the issue-3 generator (tests/generator/dsgen), their universal-layout truth, chains of
DeepSpeed AutoEP checkpoints under ZeRO-3 (tests/generator/dsgen/autoep.py) with their truth, and
seeded token counts per save interval in the three accepted formats.
Usage: /usr/bin/python3 tests/pec/fixtures.py OUT_DIR"""
import hashlib
import json
import os
import random
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "generator"))

STEPS = [100, 200, 300, 400, 500]


def chain(out, name, steps, **layout):
    import dsgen  # imports torch (seconds): only when the fixtures are made
    cfg = dsgen.ModelConfig(family="dsmoe", layers=4, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=128, seq=16,
                            experts=4)
    for i, step in enumerate(steps):
        d = os.path.join(out, name, f"step{step}")
        lay = dsgen.Layout(dp=4, ep=2, zero=1, dtype="bf16", step=step, seed=1000 * (i + 1) + len(name), **layout)
        dsgen.generate(d, cfg, lay, truth=(name == "ds"))


def autoep_zero3_chain(out, name, steps, **kw):
    """DeepSpeed AutoEP under ZeRO-3 (partition-native, tests/generator/dsgen/autoep.py zero=3, DeepSpeed
    v0.19.5's save code): one checkpoint per step with its own values and its universal-form truth
    (2 AutoEP layers of 4 experts)."""
    from dsgen import autoep
    for i, step in enumerate(steps):
        d = os.path.join(out, name, f"step{step}")
        autoep.write(d, os.path.join(d, "truth"), zero=3, step=step, seed=7000 + 31 * i + len(name), **kw)


def bad_autoep_place(out):
    """autoep_z3 step 100 where DP rank 2 (EP rank 0, expert-DP rank 1) records expert-DP rank 0 in its
    model file: its shard's ds_zero_partition_groups contradicts it (pec-save must refuse it)."""
    import torch
    from dsgen import autoep
    d = os.path.join(out, "autoep_z3_bad_place")
    shutil.copytree(os.path.join(out, "autoep_z3", "step100"), d, ignore=shutil.ignore_patterns("truth"))
    path = os.path.join(d, "global_step100", "zero_pp_rank_2_mp_rank_00_model_states.pt")
    sd = torch.load(path, weights_only=False)
    sd["ds_autoep_layers"] = autoep.autoep_layer_info(2, 4, 2, 4, zero3=True)
    sd["universal_checkpoint_info"]["ds_autoep_layers"] = sd["ds_autoep_layers"]
    torch.save(sd, path)


def tokens(out):
    rng = random.Random(5)
    tdir = os.path.join(out, "tokens")
    os.makedirs(tdir, exist_ok=True)
    for step in STEPS:
        m = [[rng.randrange(0, 1000) for _ in range(4)] for _ in range(2)]
        with open(os.path.join(tdir, f"step{step}.json"), "w") as f:
            json.dump(m, f)
    m = [[10, 20, 30, 40], [1, 2, 3, 4]]
    with open(os.path.join(tdir, "fixed.csv"), "w") as f:
        f.write("moe_layer,expert,tokens\n")
        for l, row in enumerate(m):
            for e, t in enumerate(row):
                f.write(f"{l},{e},{t}\n")
    with open(os.path.join(tdir, "fixed.jsonl"), "w") as f:
        for l, row in enumerate(m):
            f.write(json.dumps({"layer": l, "tokens_per_expert": row}) + "\n")


def generator_digest():
    """This script and the generator's sources (tests/generator/dsgen): a build folder outlives changes to either,
    and fixtures made by another version of them are made again (as tests/reshard/fixtures.py does)."""
    h = hashlib.sha256()
    with open(os.path.abspath(__file__), "rb") as f:
        h.update(b"fixtures.py\0" + f.read())
    gdir = os.path.join(HERE, "..", "generator", "dsgen")
    for name in sorted(os.listdir(gdir)):
        if name.endswith(".py"):
            with open(os.path.join(gdir, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


def main():
    out = sys.argv[1]
    stamp = os.path.join(out, "done")
    key = "generator " + generator_digest() + "\n"
    if os.path.exists(stamp) and open(stamp).read() == key:
        return  # made by this very generator: reused
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    chain(out, "ds", STEPS)
    chain(out, "dbe", STEPS[:3], data_before_expert=True, bf16_optimizer=True)
    # One checkpoint of each later DeepSpeed version line ("ds" above is the default 0.14 line).
    for line in ("0.17.1", "0.19.2", "0.19.3", "0.19.5"):
        chain(out, "line" + line, STEPS[:1], ds_line=line)
    autoep_zero3_chain(out, "autoep_z3", STEPS[:3], dp=4, ep=2, dtype="bf16")
    # expert-DP ranks first, fp16, padded partitions (2*10*8 = 160 elements of w1 over 3 ranks)
    autoep_zero3_chain(out, "autoep_z3_dbe", STEPS[:3], dp=6, ep=2, dtype="fp16", data_before_expert=True, ffn=10)
    bad_autoep_place(out)
    tokens(out)
    with open(stamp, "w") as f:  # last: an interrupted run leaves no stamp and is made again
        f.write(key)


if __name__ == "__main__":
    main()
