#!/usr/bin/python3
"""Runs every shell example of the documentation verbatim (issue 28: docs examples that run).

Convention (docs/commands.md, "Examples in the docs"): a fenced block tagged ```sh is an example and is
run; ```text (synopses, tables, file layouts), ```json (documents) and ```console (a session with
its output, or a command that needs a cluster or a fresh machine) are not, and an untagged fence
fails the check (every block says whether it runs). The ```sh blocks of one page run in order,
in one work folder made for that page, with the built tools first on PATH; the folder holds what the
examples name:
  scripts/, patterns/   links to the repository's (examples call tests/generator/gen_ds_checkpoint.py)
  checkpoint/           Megatron-DeepSpeed GPT, bf16, ZeRO-1, TP 2 PP 1 DP 2 (global_step100, `latest`)
  moe/                  native DeepSpeed MoE, EP 2 DP 2, 4 experts per MoE layer (global_step100)
  loads.json            expert loads [2 layers][8 experts] for moe-replace
  tokens.json           tokens per expert [1 MoE layer][4 experts] since the previous save, for moe/
A block fails the page when it exits non-zero (bash -e -o pipefail). Exit code: 0 all pages pass,
1 a block failed (file, line and output printed), 2 usage.

Usage: run_examples.py --build BUILD_DIR [--keep] [FILE.md ...]   (default: README.md and docs/*.md)"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAGS = ("sh", "text", "console", "json")
FENCE = re.compile(r"^```([A-Za-z0-9_-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


def untagged(path):
    """Lines of fenced blocks with no tag or an unknown one: every block says whether it runs."""
    text = open(path, encoding="utf-8").read()
    return [text[:m.start()].count("\n") + 1 for m in FENCE.finditer(text) if m.group(1) not in TAGS]


def examples(path):
    """[(line, code)] of the ```sh blocks of a Markdown file, in order."""
    text = open(path, encoding="utf-8").read()
    return [(text[:m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == "sh"]


def make_inputs(base):
    """The checkpoints and files the examples name, generated once (seconds)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "generator"))
    import dsgen  # imports torch
    gpt = dsgen.ModelConfig(family="gpt", layers=2, hidden=16, heads=2, kv_heads=2, ffn=32, vocab=64, seq=8)
    dsgen.generate(os.path.join(base, "checkpoint"), gpt, dsgen.Layout(tp=2, dp=2, zero=1, dtype="bf16", step=100, seed=3),
                   truth=False)
    moe = dsgen.ModelConfig(family="dsmoe", layers=2, hidden=16, heads=2, kv_heads=2, ffn=32, vocab=64, seq=8, experts=4)
    dsgen.generate(os.path.join(base, "moe"), moe, dsgen.Layout(dp=2, ep=2, zero=1, dtype="bf16", step=100, seed=4),
                   truth=False)
    rng = random.Random(5)
    with open(os.path.join(base, "loads.json"), "w") as f:
        json.dump([[rng.randint(1, 1000) for _ in range(8)] for _ in range(2)], f)
    with open(os.path.join(base, "tokens.json"), "w") as f:
        json.dump([[120, 40, 300, 75]], f)


def run_page(page, blocks, base, bin_dir, keep):
    work = tempfile.mkdtemp(prefix="ucpkit-docs-" + os.path.basename(page)[:-3] + "-")
    for name in os.listdir(base):
        src = os.path.join(base, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(work, name))
    for name in ("scripts", "patterns", "tests"):
        os.symlink(os.path.join(ROOT, name), os.path.join(work, name))
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    ok = True
    for line, code in blocks:
        t0 = time.time()
        try:
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=work, env=env, capture_output=True,
                               text=True, timeout=120)
            rc, out = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            rc, out = "timeout after 120 s", e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rel = os.path.relpath(page, ROOT)
        if rc != 0:
            ok = False
            print(f"FAIL {rel}:{line} (exit {rc}, work folder {work})\n--- example\n{code}--- output\n{out}---")
            break
        print(f"ok   {rel}:{line} ({time.time() - t0:.1f} s)")
    if ok and not keep:
        shutil.rmtree(work, ignore_errors=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="build folder (tools in BUILD/bin)")
    ap.add_argument("--keep", action="store_true", help="keep every work folder")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    bin_dir = os.path.join(os.path.abspath(a.build), "bin")
    if not os.path.isdir(bin_dir):
        print(f"run_examples.py: error: {bin_dir}: no such folder (build the tools first)", file=sys.stderr)
        return 2
    files = a.files or [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    bad = [f"{os.path.relpath(f, ROOT)}:{line}" for f in files for line in untagged(f)]
    if bad:
        print("fenced blocks without a tag (```sh runs; ```text, ```console, ```json do not): " + ", ".join(bad))
        return 1
    pages = [(f, examples(f)) for f in files]
    pages = [(f, b) for f, b in pages if b]
    print(f"{sum(len(b) for _, b in pages)} examples in {len(pages)} pages")
    if not pages:
        print("no ```sh example found: nothing was checked")
        return 1
    base = tempfile.mkdtemp(prefix="ucpkit-docs-inputs-")
    try:
        make_inputs(base)
        failed = [f for f, b in pages if not run_page(f, b, base, bin_dir, a.keep)]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if failed:
        print("failed: " + ", ".join(os.path.relpath(f, ROOT) for f in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
