"""Randomized kill campaign over ucp-load (issue 45): a DCP or Megatron-Core torch_dist input converted
to its own format, SIGTERM or SIGKILL at a random time of the run, `--runs` times. After each kill:
the output is absent or whole (byte for byte the output of an uninterrupted run), the input is
untouched, and the next run into the same place completes and leaves nothing hidden beside the
output (staging folders, the scratch universal copy, its conversion's staging: swept).

Usage: /usr/bin/python3 tests/reliability/kill_campaign.py --build BUILD --case dcp|torch_dist
       [--runs 50] [--seed 45]
Exit 0 when every run holds; prints one line per failure and a summary."""
import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INPUTS = {
    # torch 2.6 dcp.save of FSDP2 with Adam state (tests/formats/dcp/data/README.md)
    "dcp": (os.path.join(ROOT, "tests/formats/dcp/data/fsdp_optim_w2"), ["--format", "dcp", "--world-size", "2"]),
    # Megatron-Core core_v0.19.0 torch_dist, TP 2 PP 2 (tests/formats/megatron_core/data/README.md)
    "torch_dist": (os.path.join(ROOT, "tests/formats/megatron_core/data/gpt_tp2_pp2/fully_reshardable"),
                   ["--format", "torch_dist", "--tp", "1", "--pp", "1", "--dp", "1"]),
}


def tree_digest(path):
    """sha256 of every regular file's relative path and bytes under `path` (None when absent)."""
    if not os.path.exists(path):
        return None
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            h.update(os.path.relpath(p, path).encode())
            with open(p, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def hidden(dir_):
    return sorted(n for n in os.listdir(dir_) if n.startswith("."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--case", choices=sorted(INPUTS), required=True)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=45)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    src, options = INPUTS[a.case]
    work = tempfile.mkdtemp(prefix="ucpkit_kill_%s_" % a.case)
    failures = []
    try:
        inp = os.path.join(work, "in")
        shutil.copytree(src, inp)
        input_digest = tree_digest(inp)
        place = os.path.join(work, "place")
        os.makedirs(place)
        out = os.path.join(place, "out")
        cmd = [os.path.join(a.build, "bin", "ucp-load"), "-q", "--no-sync", "--input", inp, "--output", out] + options

        def run_whole(what):
            t0 = time.monotonic()
            r = subprocess.run(cmd + ["--overwrite"], capture_output=True, text=True)
            if r.returncode != 0:
                failures.append("%s: exit %d: %s" % (what, r.returncode, r.stderr.strip()))
            return time.monotonic() - t0

        whole = run_whole("reference run")
        reference = tree_digest(out)
        shutil.rmtree(out)
        kills = {"SIGTERM": 0, "SIGKILL": 0}
        outcomes = {"absent": 0, "whole": 0}
        for i in range(a.runs):
            sig = rng.choice([signal.SIGTERM, signal.SIGKILL])
            delay = rng.uniform(0, whole * 1.2)
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(delay)
            p.send_signal(sig)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                failures.append("run %d: still running 10 s after %s" % (i, sig.name))
            kills[sig.name] += 1
            got = tree_digest(out)
            if got is None:
                outcomes["absent"] += 1
            elif got == reference:
                outcomes["whole"] += 1
            else:
                failures.append("run %d (%s after %.3f s): the output is neither absent nor whole" % (i, sig.name, delay))
            if tree_digest(inp) != input_digest:
                failures.append("run %d (%s after %.3f s): the input changed" % (i, sig.name, delay))
            # The next run completes and removes whatever the killed one left beside the output.
            run_whole("run %d's next run" % i)
            left = hidden(place)
            if left:
                failures.append("run %d (%s after %.3f s): left after the next run: %s" % (i, sig.name, delay, left))
            if tree_digest(out) != reference:
                failures.append("run %d's next run: output differs from the reference" % i)
            shutil.rmtree(out, ignore_errors=True)
        for f in failures:
            print("FAIL " + f)
        print("%s: %d runs (%d SIGTERM, %d SIGKILL; reference run %.2f s): output absent %d, whole %d; %d failures"
              % (a.case, a.runs, kills["SIGTERM"], kills["SIGKILL"], whole, outcomes["absent"], outcomes["whole"],
                 len(failures)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
