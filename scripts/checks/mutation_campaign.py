#!/usr/bin/env python3
"""Mutation campaign (issue 16): damaged copies of a generated DeepSpeed checkpoint given to ucp-union
(one-step mode) and ucp-extract. Every run must

* end with exit code 0, 1 or 2 (never a signal, never a hang: --timeout);
* when it exits 0, give exactly the clean run's output (every file equal, manifest.json with the input
  folder's name normalized), unless the mutation changed what the checkpoint says: that is proved by
  comparing torch.load of the mutated file with torch.load of the clean one (torch 1.13, /usr/bin/python3):
  a file whose zip CRCs all hold (zipfile.testzip) and that torch reads as different values is a
  different valid checkpoint (counted "0-valid-different"); a file with a broken CRC, one torch refuses,
  or one torch reads as equal values, with a different output is a failure, except a file torch refuses
  only for a class path it cannot import, when every differing output file holds the clean run's values
  (compared with a permissive unpickler; counted "0-renamed-class-same-values");
* leave everything outside its output folder as it was (the input files' bytes, the folder holding the
  output: no staging or temporary left, nothing else created).

Mutations (chosen at random, seeded): `flip` (1-8 random bytes XORed, zip CRCs left stale), `flip-pkl`
(1-4 bytes of a data.pkl record changed and its CRC-32 rewritten, so only the pickle reader stands
between the damage and the output), `truncate` (cut at a random length), `swap-records` (two records
of equal size exchanged, CRCs rewritten), `swap-files` (two rank files exchanged), `drop` (a file removed).

Usage: mutation_campaign.py --build BUILD --input CHECKPOINT [--runs N | --seconds S] [--seed N] [--jobs J]
Prints the figures per mutation and tool; exit 1 when any run broke a rule (each one listed)."""
import argparse
import collections
import concurrent.futures
import hashlib
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib

TORCH_COMPARE = r'''
import sys, torch
sys.path.insert(0, sys.argv[3])
import dsgen.stubs  # noqa: F401  (DeepSpeed's pickled classes)
def eq(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            a.shape == b.shape and bool(torch.equal(a.view(torch.uint8) if a.dtype != torch.bool else a,
                                                    b.view(torch.uint8) if b.dtype != torch.bool else b)) \
            if a.numel() and a.is_contiguous() and b.is_contiguous() else (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a.keys()) == list(b.keys()) and all(eq(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) == type(b) and len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dict__") and hasattr(b, "__dict__") and type(a) == type(b):
        return eq(vars(a), vars(b))
    try:
        return bool(a == b) and type(a) == type(b)
    except Exception:
        return False
import zipfile
try:
    bad = zipfile.ZipFile(sys.argv[2]).testzip()
except Exception as e:
    bad = type(e).__name__
if bad is not None:
    print("refused (zip CRC or structure: %s)" % bad)
    sys.exit(0)
clean = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
try:
    mutated = torch.load(sys.argv[2], map_location="cpu", weights_only=False)
except Exception as e:
    print("refused", type(e).__name__)
    sys.exit(0)
print("equal" if eq(clean, mutated) else "different")
'''


# Outputs of a run whose input torch refuses only because a class path was renamed (ModuleNotFoundError,
# AttributeError): ucpkit carries classes it does not interpret through unchanged, so the output names
# the same missing class. The rule lets such a run exit 0 when the mutation cannot change values,
# proved by comparing: every output file that differs from the clean run's is loaded on both sides with
# an unpickler that stands in a placeholder for a class it cannot import, and must hold the same values
# (tensors bit for bit, plain values equal, objects by their state) with only class paths differing.
SAME_VALUES = r"""
import os, pickle, sys, torch
sys.path.insert(0, sys.argv[3])
import dsgen.stubs  # noqa: F401
class Missing:
    def __init__(self, *args, **kwargs):
        self.__dict__["__missing_args"] = args
    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["__missing_state"] = state
class Permissive(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return type(name, (Missing,), {})
class permissive_pickle:
    Unpickler = Permissive
    load = pickle.load
    __name__ = "pickle"
# torch 1.13's load ignores its pickle_module argument unless weights_only (it resets it to the
# module-level `pickle`), so the module it names is replaced.
import torch.serialization
torch.serialization.pickle = permissive_pickle
def state(o):
    d = dict(vars(o))
    if isinstance(o, Missing):
        args = d.pop("__missing_args", ())
        st = d.pop("__missing_state", None)
        if st is not None:
            return st
        if args and not d:
            return args
    return d
def eq(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            a.shape == b.shape and bool(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                                               and torch.equal(a.nan_to_num(0), b.nan_to_num(0))))
    if isinstance(a, Missing) or isinstance(b, Missing):
        return hasattr(a, "__dict__") and hasattr(b, "__dict__") and eq(state(a), state(b))
    if type(a).__module__ == "numpy" and type(b).__module__ == "numpy" and hasattr(a, "dtype"):
        import numpy
        return a.dtype == b.dtype and numpy.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a.keys()) == list(b.keys()) and all(eq(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dict__") and hasattr(b, "__dict__") and type(a) == type(b):
        return eq(vars(a), vars(b))
    try:
        return bool(a == b) and type(a) == type(b)
    except Exception:
        return False
clean_dir, out_dir = sys.argv[1], sys.argv[2]
for rel in sys.argv[4:]:
    if not rel.endswith(".pt"):
        print("different", rel)
        sys.exit(0)
    a = torch.load(os.path.join(clean_dir, rel), map_location="cpu", weights_only=False)
    b = torch.load(os.path.join(out_dir, rel), map_location="cpu", weights_only=False)
    if not eq(a, b):
        print("different", rel)
        sys.exit(0)
print("same-values")
"""


def zip_records(raw):
    """(name, data start, data end, central-directory offset) of each stored record (small files)."""
    out = []
    try:
        zf = zipfile.ZipFile(__import__("io").BytesIO(raw))
        infos = zf.infolist()
    except Exception:
        return out
    cd = raw.find(b"PK\x01\x02")
    cds = {}
    while cd >= 0 and cd + 46 <= len(raw):
        n = struct.unpack("<H", raw[cd + 28:cd + 30])[0]
        cds[raw[cd + 46:cd + 46 + n].decode("utf-8", "replace")] = cd
        cd = raw.find(b"PK\x01\x02", cd + 46)
    for i in infos:
        off = i.header_offset
        if raw[off:off + 4] != b"PK\x03\x04" or i.filename not in cds:
            continue
        n, m = struct.unpack("<HH", raw[off + 26:off + 30])
        start = off + 30 + n + m
        out.append((i.filename, start, start + i.compress_size, cds[i.filename], i.flag_bits))
    return out


def set_crc(raw, rec):
    """Rewrites a record's CRC-32 (central directory, local header when set, data descriptor)."""
    name, start, end, cd, flags = rec
    crc = struct.pack("<I", zlib.crc32(bytes(raw[start:end])) & 0xFFFFFFFF)
    old = bytes(raw[cd + 16:cd + 20])
    raw[cd + 16:cd + 20] = crc
    local = struct.unpack("<I", raw[cd + 42:cd + 46])[0]
    if raw[local + 14:local + 18] == old:
        raw[local + 14:local + 18] = crc
    if flags & 0x8:
        d = end + 4 if raw[end:end + 4] == b"PK\x07\x08" else end
        if raw[d:d + 4] == old:
            raw[d:d + 4] = crc


def mutate(rng, ckpt_dir, kind):
    """Applies one mutation in place; returns (description, relative path of the file changed or None)."""
    files = sorted(os.path.relpath(os.path.join(r, f), ckpt_dir) for r, _, fs in os.walk(ckpt_dir) for f in fs)
    pts = [f for f in files if f.endswith(".pt")]
    if kind == "swap-files":
        a, b = rng.sample(pts, 2)
        pa, pb = os.path.join(ckpt_dir, a), os.path.join(ckpt_dir, b)
        tmp = pa + ".swap"
        os.rename(pa, tmp)
        os.rename(pb, pa)
        os.rename(tmp, pb)
        return "swap-files %s %s" % (a, b), None
    if kind == "drop":
        a = rng.choice(files)
        os.remove(os.path.join(ckpt_dir, a))
        return "drop %s" % a, None
    rel = rng.choice(pts)
    path = os.path.join(ckpt_dir, rel)
    raw = bytearray(open(path, "rb").read())
    if kind == "flip":
        spots = sorted(rng.randrange(len(raw)) for _ in range(rng.randint(1, 8)))
        for s in spots:
            raw[s] ^= rng.randint(1, 255)
        desc = "flip %s @%s" % (rel, ",".join(map(str, spots)))
    elif kind == "truncate":
        n = rng.randrange(len(raw))
        del raw[n:]
        desc = "truncate %s to %d" % (rel, n)
    elif kind == "flip-pkl":
        recs = [r for r in zip_records(bytes(raw)) if r[0].endswith("data.pkl")]
        rec = recs[0]
        spots = sorted(rng.randrange(rec[1], rec[2]) for _ in range(rng.randint(1, 4)))
        for s in spots:
            raw[s] = rng.randrange(256) if rng.random() < 0.5 else raw[s] ^ (1 << rng.randrange(8))
        set_crc(raw, rec)
        desc = "flip-pkl %s @%s" % (rel, ",".join(str(s - rec[1]) for s in spots))
    elif kind == "swap-records":
        recs = [r for r in zip_records(bytes(raw)) if "/data/" in r[0]]
        by_size = collections.defaultdict(list)
        for r in recs:
            by_size[r[2] - r[1]].append(r)
        pairs = [v for v in by_size.values() if len(v) >= 2]
        if not pairs:
            return mutate(rng, ckpt_dir, "flip")
        a, b = rng.sample(rng.choice(pairs), 2)
        da, db = bytes(raw[a[1]:a[2]]), bytes(raw[b[1]:b[2]])
        raw[a[1]:a[2]], raw[b[1]:b[2]] = db, da
        set_crc(raw, a)
        set_crc(raw, b)
        desc = "swap-records %s %s %s" % (rel, a[0], b[0])
    else:
        raise ValueError(kind)
    open(path, "wb").write(bytes(raw))
    return desc, rel


def tree(root, skip=()):
    """relative path -> sha1 of every file (folders: None), leaving out the relative paths in `skip`."""
    out = {}
    for r, ds, fs in os.walk(root):
        for d in ds:
            rel = os.path.relpath(os.path.join(r, d), root)
            out[rel + "/"] = None
        for f in fs:
            p = os.path.join(r, f)
            out[os.path.relpath(p, root)] = hashlib.sha1(open(p, "rb").read()).hexdigest()
    return {k: v for k, v in out.items() if not any(k == s or k.startswith(s + "/") for s in skip)}


def output_digest(out_dir, input_dir):
    d = {}
    for rel, h in tree(out_dir).items():
        if rel.endswith("manifest.json"):
            text = open(os.path.join(out_dir, rel), "rb").read().replace(os.path.abspath(input_dir).encode(), b"IN")
            h = hashlib.sha1(text).hexdigest()
        d[rel] = h
    return d


def run_tool(build, tool, inp, out, timeout):
    """ucp-union in one step, or ucp-extract to a work folder then ucp-union of it (the work folder sits
    beside the output, under the same rules); (exit code or "timeout"/"signal N", log)."""
    def one(args):
        try:
            p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
            rc = p.returncode if p.returncode >= 0 else "signal %d" % -p.returncode
            return rc, p.stdout.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            return "timeout", ""
    union = [os.path.join(build, "bin", "ucp-union"), "-q", "--no-sync", "--output", out, "--input"]
    if tool == "ucp-union":
        return one(union + [inp])
    work = out + ".work"
    rc, log = one([os.path.join(build, "bin", "ucp-extract"), "-q", "--input", inp, "--output", work])
    if rc != 0:
        return rc, log
    rc, log = one(union + [work])
    shutil.rmtree(work, ignore_errors=True)
    return rc, log


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--input", required=True, help="a generated checkpoint folder (latest + global_stepN/)")
    ap.add_argument("--runs", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--tools", default="ucp-union,ucp-extract+union")
    ap.add_argument("--work", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--kinds", default="flip,flip-pkl,truncate,swap-records,swap-files,drop",
                    help="mutations to draw from (comma-separated)")
    args = ap.parse_args()
    if not args.runs and not args.seconds:
        args.runs = 100
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "generator")  # dsgen's stand-ins
    tools = args.tools.split(",")
    kinds = args.kinds.split(",")
    work = tempfile.mkdtemp(prefix="ucpkit_mutation_", dir=args.work)
    failures, stats = [], collections.Counter()
    try:
        clean_in = os.path.join(work, "clean_in")
        shutil.copytree(args.input, clean_in)
        clean = {}
        for tool in tools:
            os.makedirs(os.path.join(work, "clean_" + tool))
            rc, log = run_tool(args.build, tool, clean_in, os.path.join(work, "clean_" + tool, "out"), args.timeout)
            if rc != 0:
                print("clean run of %s failed (%s): %s" % (tool, rc, log))
                return 1
            clean[tool] = output_digest(os.path.join(work, "clean_" + tool, "out"), clean_in)
        def one(i):
            """Run i: its own seeded draw and sandbox; (stats key, failure text or None, input to keep)."""
            rng = random.Random(args.seed * 1000003 + i)
            tool = tools[i % len(tools)]
            kind = kinds[rng.randrange(len(kinds))]
            sandbox = os.path.join(work, "run%d" % i)
            inp = os.path.join(sandbox, "in")
            shutil.copytree(clean_in, inp)
            os.makedirs(os.path.join(sandbox, "dest"))
            desc, changed = mutate(rng, inp, kind)
            before = tree(sandbox)
            out = os.path.join(sandbox, "dest", "out")
            rc, log = run_tool(args.build, tool, inp, out, args.timeout)
            verdict, result = None, "exit %s" % rc
            # ds_to_universal's tag file beside the output is part of a successful run's output.
            after = tree(sandbox, skip=("dest/out", "dest/latest_universal") if rc == 0 else ("dest/out",))
            if after != before:
                diff = sorted(set(after.items()) ^ set(before.items()))
                verdict = "touched outside the output: %s" % diff[:4]
            elif rc not in (0, 1, 2):
                verdict = "exit %s" % rc
            elif rc != 0 and os.path.exists(out):
                verdict = "exit %s but the output exists" % rc
            elif rc == 0 and open(os.path.join(sandbox, "dest", "latest_universal")).read().strip() != "out":
                verdict = "latest_universal does not name the output"
            elif rc == 0:
                if output_digest(out, inp) == clean[tool]:
                    result = "0-same"
                elif changed is None:
                    verdict = "exit 0, output differs (%s)" % kind
                else:
                    cmp = subprocess.run(["/usr/bin/python3", "-c", TORCH_COMPARE, os.path.join(clean_in, changed),
                                          os.path.join(inp, changed), here], stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT).stdout.decode().strip().splitlines()
                    what = cmp[-1] if cmp else "?"
                    if what == "different":
                        result = "0-valid-different"
                    elif what in ("refused ModuleNotFoundError", "refused AttributeError"):
                        # A renamed class path: the run may exit 0 when the output holds the clean
                        # run's values (compared with a permissive unpickler, SAME_VALUES above).
                        mine = output_digest(out, inp)
                        differ = sorted(r for r in set(mine) | set(clean[tool]) if mine.get(r) != clean[tool].get(r))
                        missing = [r for r in differ if r not in mine or r not in clean[tool]]
                        same = subprocess.run(["/usr/bin/python3", "-c", SAME_VALUES,
                                               os.path.join(work, "clean_" + tool, "out"), out, here] + differ,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT).stdout.decode().strip()
                        if not missing and same.endswith("same-values"):
                            result = "0-renamed-class-same-values"
                        else:
                            verdict = "exit 0, output differs, torch.load of the input: %s; values: %s" % (
                                what, (same.splitlines() or ["?"])[-1])
                    else:
                        verdict = "exit 0, output differs, torch.load of the input: %s" % what
            failure = None
            if verdict:
                result = "FAIL"
                failure = "%s %s: %s | %s" % (tool, desc, verdict, log.strip()[:300])
                shutil.copytree(inp, os.path.join(work, "fail_run%d" % i), dirs_exist_ok=True)
            shutil.rmtree(sandbox, ignore_errors=True)
            return (kind, tool, result), failure

        t0, n = time.time(), 0
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            pending = set()
            while True:
                more = (args.runs and n < args.runs) or (args.seconds and time.time() - t0 < args.seconds)
                while more and len(pending) < 2 * args.jobs:
                    pending.add(pool.submit(one, n))
                    n += 1
                    more = (args.runs and n < args.runs) or (args.seconds and time.time() - t0 < args.seconds)
                if not pending:
                    break
                done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for f in done:
                    key, failure = f.result()
                    stats[key] += 1
                    if failure:
                        failures.append(failure)
        elapsed = time.time() - t0
        print("mutation campaign: %d runs in %.0f s (seed %d, tools %s)" % (n, elapsed, args.seed, ",".join(tools)))
        print("%-13s %-12s %-18s %6s" % ("mutation", "tool", "result", "runs"))
        for (kind, tool, res), c in sorted(stats.items()):
            print("%-13s %-12s %-18s %6d" % (kind, tool, res, c))
        for f in failures:
            print("FAIL", f)
        print("%d failures" % len(failures))
        return 1 if failures else 0
    finally:
        if not failures:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("failing inputs kept under", work)


if __name__ == "__main__":
    sys.exit(main())
