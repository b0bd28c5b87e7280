#!/usr/bin/env python3
"""PEC round-trip fuzz (issue 32): damaged copies of a DeepSpeed MoE checkpoint saved with pec-save and
restored with pec-restore. Every run must

* end every tool with exit code 0 or 1 (never a signal, never a hang: --timeout);
* when both exit 0, give back every file of the step folder byte for byte as it was saved (the damaged
  input): damage is either refused or carried through unchanged (a stale zip CRC-32 stays stale, so
  ucp-union still refuses the restored file), never given a fresh CRC or other values.

Mutations (chosen at random, seeded, on one file of the step folder; optimizer shards are picked half
of the time, since expert fragments are cut out of them and patched back): `flip` (1-8 random bytes
XORed, CRCs left stale), `flip-record` (one byte XORed inside a tensor record of an optimizer shard,
CRC left stale: the laundering case of cause 8), `zero` (a run of 1-64 bytes zeroed), `truncate` (cut at
a random length).

`--case stale-crc` runs the one deterministic case instead: a byte flipped in the middle of the largest
tensor record of the optimizer shards (where the expert partitions lie); the restore must refuse it, or give the damaged
file back unchanged (which ucp-union then refuses).

Usage: pec_fuzz.py --build BUILD --input CHECKPOINT [--runs N] [--seed S] [--case stale-crc]
Prints the figures per mutation and outcome; exit 1 when any run broke a rule (each one listed)."""
import argparse
import collections
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile


def step_folder(root):
    with open(os.path.join(root, "latest")) as f:
        return f.read().strip()


def record_spans(path):
    """(data offset, size) of every stored tensor record ("data/<key>") of a zip file."""
    spans = []
    with open(path, "rb") as raw, zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if "/data/" not in info.filename or info.file_size == 0:
                continue
            raw.seek(info.header_offset)
            head = raw.read(30)
            name_len = int.from_bytes(head[26:28], "little")
            extra_len = int.from_bytes(head[28:30], "little")
            spans.append((info.header_offset + 30 + name_len + extra_len, info.file_size))
    return spans


def mutate(path, kind, rng):
    data = bytearray(open(path, "rb").read())
    if kind == "flip-record":
        spans = record_spans(path)
        if not spans:
            kind = "flip"
        else:
            off, size = rng.choice(spans)
            at = off + rng.randrange(size)
            data[at] ^= rng.randrange(1, 256)
            what = f"byte {at} (tensor record at {off}, {size} bytes)"
    if kind == "flip":
        ats = [rng.randrange(len(data)) for _ in range(rng.randint(1, 8))]
        for at in ats:
            data[at] ^= rng.randrange(1, 256)
        what = "bytes " + ",".join(map(str, ats))
    elif kind == "zero":
        at = rng.randrange(len(data))
        n = rng.randint(1, 64)
        data[at:at + n] = bytes(len(data[at:at + n]))
        what = f"{n} bytes at {at}"
    elif kind == "truncate":
        n = rng.randrange(len(data))
        del data[n:]
        what = f"cut at {n}"
    with open(path, "wb") as f:
        f.write(data)
    return kind, what


def run_tool(argv, timeout):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hang", ""
    return p.returncode, p.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]


def round_trip(build, ckpt, work, timeout):
    """Saves `ckpt`, restores it; returns (outcome, detail). Outcomes: save-refused, restore-refused,
    equal, and the rule breakers: crash, changed."""
    store, out = os.path.join(work, "store"), os.path.join(work, "out")
    rc, msg = run_tool([os.path.join(build, "bin", "pec-save"), "--checkpoint", ckpt, "--store", store,
                        "--policy", "sequential", "--k", "1", "-q"], timeout)
    if rc == 1:
        return "save-refused", msg[0] if msg else ""
    if rc != 0:
        return "crash", f"pec-save exit {rc}: {msg}"
    rc, msg = run_tool([os.path.join(build, "bin", "pec-restore"), "--store", store, "--output", out, "-q"], timeout)
    if rc == 1:
        return "restore-refused", msg[0] if msg else ""
    if rc != 0:
        return "crash", f"pec-restore exit {rc}: {msg}"
    tag = step_folder(ckpt)
    src_dir, out_dir = os.path.join(ckpt, tag), os.path.join(out, tag)
    for name in sorted(os.listdir(src_dir)):
        a, b = os.path.join(src_dir, name), os.path.join(out_dir, name)
        if not os.path.exists(b):
            return "changed", f"{name} missing from the restore"
        if open(a, "rb").read() != open(b, "rb").read():
            return "changed", f"{name} restored with other bytes than saved"
    return "equal", ""


def one_run(args, i, rng, case=None):
    work = tempfile.mkdtemp(prefix="pec_fuzz_")
    try:
        ckpt = os.path.join(work, "ckpt")
        shutil.copytree(args.input, ckpt, ignore=shutil.ignore_patterns("truth"))
        tag = step_folder(ckpt)
        files = sorted(os.listdir(os.path.join(ckpt, tag)))
        optim = [f for f in files if f.endswith("optim_states.pt")]
        if case == "stale-crc":
            spans = [(s[1], n, s[0]) for n in optim for s in record_spans(os.path.join(ckpt, tag, n))]
            size, name, off = max(spans)
            path = os.path.join(ckpt, tag, name)
            data = bytearray(open(path, "rb").read())
            data[off + size // 2] ^= 0x40
            open(path, "wb").write(data)
            kind, what = "stale-crc", f"byte {off + size // 2}"
        else:
            name = rng.choice(optim) if optim and rng.random() < 0.5 else rng.choice(files)
            kind = rng.choice(["flip", "flip-record", "zero", "truncate"])
            kind, what = mutate(os.path.join(ckpt, tag, name), kind, rng)
        outcome, detail = round_trip(args.build, ckpt, work, args.timeout)
        if case == "stale-crc" and outcome == "equal":
            # Given back unchanged: the stale CRC must still stop ucp-union.
            rc, msg = run_tool([os.path.join(args.build, "bin", "ucp-union"), "--input", os.path.join(work, "out"),
                                "--output", os.path.join(work, "universal"), "--no-sync", "-q"], args.timeout)
            if rc != 1:
                outcome, detail = "changed", f"ucp-union of the restored checkpoint: exit {rc} {msg}"
        return kind, outcome, f"run {i}: {kind} {name} {what}: {outcome} {detail}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="build folder (bin/pec-save, bin/pec-restore, bin/ucp-union)")
    ap.add_argument("--input", required=True, help="checkpoint folder (latest + global_step<N>)")
    ap.add_argument("--runs", type=int, default=20, help="damaged round trips")
    ap.add_argument("--seed", type=int, default=1, help="seed of the draws (same runs on every machine)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds one tool may run")
    ap.add_argument("--case", choices=["stale-crc"], help="the one deterministic case instead of --runs")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per run")
    args = ap.parse_args()
    if args.runs < 1 or args.timeout <= 0:
        ap.error("--runs and --timeout must be positive")
    rng = random.Random(args.seed)
    counts = collections.Counter()
    bad = []
    runs = 1 if args.case else args.runs
    for i in range(runs):
        kind, outcome, line = one_run(args, i, rng, args.case)
        counts[(kind, outcome)] += 1
        if args.verbose:
            print(line, flush=True)
        if outcome in ("crash", "changed"):
            bad.append(line)
    print(f"pec_fuzz: {runs} runs, seed {args.seed}")
    for (kind, outcome), n in sorted(counts.items()):
        print(f"  {kind:12} {outcome:16} {n}")
    for line in bad:
        print("BAD " + line)
    print(f"pec_fuzz: {len(bad)} rule breakers")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
