"""ucp-load --format safetensors judged by the real safetensors library (tests/frameworks/safetensors_test.sh runs
it with the pinned environment's python, scripts/frameworks/setup.sh: safetensors 0.8.0, torch 2.15.0).

    python safetensors_check.py <build dir>

In a temporary folder: the generator (tests/generator/gen_ds_checkpoint.py, Debian's /usr/bin/python3) writes
the SOURCES with their truth; from another folder with relative paths, ucp-union writes each one's universal
folder and ucp-load --format safetensors writes the CASES (from the universal folder or directly from the
checkpoint; --dtype given or the source's; one file or --shard-size shards; mpirun -np 2 when mpirun is on PATH).
Per case:
  * the folder holds `model.safetensors.index.json` and the files its weight_map names, nothing else; the files
    are `model.safetensors` (one) or `model-0000k-of-0000n.safetensors`, k = 1..n; every tensor is in the file
    the index names, once; `metadata.total_size` is the sum of the tensors' bytes; a file over --shard-size holds
    one tensor; each file's `__metadata__` is {"format": "pt"} (safe_open(...).metadata());
  * the tensors, read by `safetensors.torch.load_file` (the library's own loader), are exactly the truth's
    parameters (meta.json), each of the output dtype, of the truth's shape, and bytes equal to the truth's fp32
    master converted by torch (`.to(dtype)`: round to nearest even; fp32 as is). A ZeRO-3 truth is flat with the
    vocabulary's padding rows: reshaped to meta.json's shape and cut to the model's vocabulary (the export
    holds the unpadded rows, docs/ucp-load.md).
Prints one line and one `RESULT framework=safetensors ...` line per case; then a negative control (one byte of
the first case's first tensor flipped in a copy must make that tensor, and only it, differ). Exit 0 when all
are equal."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import safetensors
import torch
from safetensors import safe_open
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "generator"))
import dsgen  # noqa: E402,F401  (DeepSpeed stand-ins for the truth files' SubparamShape)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INDEX = "model.safetensors.index.json"
SMALL = ["--layers", "2", "--heads", "4", "--vocab", "100"]
SOURCES = {  # folder -> generator options
    "llama": ["--model", "llama", "--tp", "2", "--dp", "2", "--zero", "1", "--dtype", "bf16", "--hidden", "64",
              "--kv-heads", "2", "--ffn", "96"] + SMALL,
    "moe": ["--model", "dsmoe", "--dp", "4", "--ep", "2", "--experts", "4", "--zero", "1", "--dtype", "fp16",
            "--hidden", "32", "--ffn", "64"] + SMALL,
    "gpt3": ["--model", "gpt", "--dp", "2", "--zero", "3", "--dtype", "fp32", "--hidden", "32", "--ffn", "64"] + SMALL,
}
CASES = [  # name, source, input (universal folder or the checkpoint), --dtype (None: the source's), --shard-size, ranks
    ("llama_universal_sharded", "llama", "universal", None, 20000, 1),
    ("llama_direct", "llama", "direct", None, 0, 1),
    ("llama_direct_fp32", "llama", "direct", "fp32", 0, 1),
    ("moe_universal", "moe", "universal", None, 0, 1),
    ("moe_universal_bf16_sharded", "moe", "universal", "bf16", 8000, 1),
    ("moe_direct_mpi2_sharded", "moe", "direct", None, 8000, 2),
    ("gpt_zero3_universal", "gpt3", "universal", None, 0, 1),
    ("gpt_zero3_direct_bf16", "gpt3", "direct", "bf16", 0, 1),
]


def run(cmd, cwd, env=None):
    """Runs a command; on failure prints it with its output and exits 1."""
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(f"{' '.join(cmd)} (in {cwd}): exit {r.returncode}\n{r.stdout[-3000:]}")
        sys.exit(1)


def export(build, work):
    """The sources, their universal folders and the cases' outputs -> [(name, out, truth, dtype, shard bytes)]."""
    for src, options in SOURCES.items():
        run(["/usr/bin/python3", os.path.join(ROOT, "tests", "generator", "gen_ds_checkpoint.py"), "--output", src]
            + options, work)
    elsewhere = os.path.join(work, "elsewhere")
    os.mkdir(elsewhere)
    os.mkdir(os.path.join(work, "out"))
    for src in SOURCES:
        run([os.path.join(build, "bin", "ucp-union"), "-q", "--input", "../" + src, "--output", f"../{src}.universal"],
            elsewhere)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cases = []
    for name, src, kind, dtype, shard, ranks in CASES:
        source = "../" + src + (".universal" if kind == "universal" else "")
        cmd = [os.path.join(build, "bin", "ucp-load"), "-q", "--input", source, "--format", "safetensors",
               "--output", "../out/" + name]
        cmd += ["--dtype", dtype] if dtype else []
        cmd += ["--shard-size", str(shard)] if shard else []
        if ranks > 1:
            if not shutil.which("mpirun"):
                print(f"{name}: not run (no mpirun on PATH)")
                continue
            cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
        run(cmd, elsewhere, env)
        # not given: the source's training precision, as the generator records it
        dtype = dtype or json.load(open(os.path.join(work, src, "truth", "meta.json")))["layout"]["dtype"]
        cases.append((name, os.path.join(work, "out", name), os.path.join(work, src, "truth"), dtype, shard))
    return cases


def same(a, b):
    """Dtype, shape and every byte (stricter than torch.equal: NaN payloads, the sign of zero)."""
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def truth_tensors(truth, dtype):
    """Parameter name -> the truth's fp32 master as the export must hold it (converted to dtype)."""
    meta = json.load(open(os.path.join(truth, "meta.json")))
    out = {}
    for p in meta["params"]:
        t = torch.load(os.path.join(truth, "universal", "zero", p["name"], "fp32.pt"), weights_only=False)
        t = (t["param"] if isinstance(t, dict) else t).reshape(p["shape"])
        if p.get("vocab") and t.shape[0] == meta["padded_vocab"]:  # ZeRO-3: padding rows kept in the truth
            t = t[:meta["model"]["vocab"]]
        out[p["name"]] = t.to(dtype)
    return out


def read_folder(out, shard_bytes, errors):
    """The folder through the index and safetensors' own loader: name -> (tensor, file)."""
    index = json.load(open(os.path.join(out, INDEX)))
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    want_files = (["model.safetensors"] if n == 1
                  else ["model-%05d-of-%05d.safetensors" % (k, n) for k in range(1, n + 1)])
    if files != want_files:
        errors.append(f"index names files {files}, not {want_files}")
    if sorted(os.listdir(out)) != sorted(files + [INDEX]):
        errors.append(f"the folder holds {sorted(os.listdir(out))}, the index names {files}")
    if shard_bytes == 0 and n != 1:
        errors.append(f"{n} files without --shard-size")
    if shard_bytes > 0 and n < 2:
        errors.append(f"one file with --shard-size {shard_bytes}: the case does not test sharding")
    got, total = {}, 0
    for fn in files:
        with safe_open(os.path.join(out, fn), framework="pt") as f:
            if f.metadata() != {"format": "pt"}:
                errors.append(f"{fn}: __metadata__ {f.metadata()}")
        tensors = load_file(os.path.join(out, fn))
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        total += size
        if shard_bytes and size > shard_bytes and len(tensors) > 1:
            errors.append(f"{fn}: {len(tensors)} tensors, {size} bytes > --shard-size {shard_bytes}")
        for name, t in tensors.items():
            if name in got:
                errors.append(f"{name}: in {got[name][1]} and {fn}")
            if index["weight_map"].get(name) != fn:
                errors.append(f"{name}: in {fn}, the index says {index['weight_map'].get(name)}")
            got[name] = (t, fn)
    missing = sorted(set(index["weight_map"]) - set(got))
    if missing:
        errors.append(f"in the index, in no file: {missing[:5]}")
    if index["metadata"]["total_size"] != total:
        errors.append(f"total_size {index['metadata']['total_size']}, the tensors hold {total} bytes")
    return got, n


def check(out, truth, dtype, shard_bytes):
    errors = []
    got, n_files = read_folder(out, shard_bytes, errors)
    want = truth_tensors(truth, DTYPES[dtype])
    for name in sorted(set(got) - set(want)):
        errors.append(f"{name}: not a parameter of the truth")
    equal = 0
    for name, w in want.items():
        if name not in got:
            errors.append(f"{name}: missing")
        elif not same(got[name][0], w):
            g = got[name][0]
            errors.append(f"{name}: differs (got {g.dtype} {list(g.shape)}, truth {w.dtype} {list(w.shape)})")
        else:
            equal += 1
    return len(want), equal, n_files, errors


def negative_control(out, truth, dtype, shard_bytes):
    """One byte of the first file's first tensor flipped in a copy: exactly that tensor must differ."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "out")
        shutil.copytree(out, copy)
        fn = sorted(set(json.load(open(os.path.join(copy, INDEX)))["weight_map"].values()))[0]
        path = os.path.join(copy, fn)
        raw = bytearray(open(path, "rb").read())
        header_len = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + header_len])
        first = min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
        raw[8 + header_len + header[first]["data_offsets"][0]] ^= 0x01
        open(path, "wb").write(bytes(raw))
        _, _, _, errors = check(copy, truth, dtype, shard_bytes)
    return first, errors


def main():
    build = os.path.abspath(sys.argv[1])
    version = safetensors.__version__
    t0 = time.monotonic()
    failed = []
    with tempfile.TemporaryDirectory() as work:
        cases = export(build, work)
        t_tools = time.monotonic() - t0
        for name, out, truth, dtype, shard_bytes in cases:
            try:
                n, equal, n_files, errors = check(out, truth, dtype, shard_bytes)
            except Exception as e:  # the library refusing our output fails the case
                n, equal, n_files, errors = 0, 0, 0, [f"{type(e).__name__}: {e}"]
            ok = not errors
            files = "model.safetensors" if n_files == 1 else f"{n_files} shards"
            print(f"{name}: {dtype}, {files} + index, {equal}/{n} tensors equal to the truth (safetensors {version} "
                  f"load_file)" + ("" if ok else f": {len(errors)} problems"))
            for e in errors[:10]:
                print(f"  {name}: {e}")
            print(f"RESULT framework=safetensors version={version} case={name} tensors={n} "
                  f"equal={'yes' if ok else 'no'}")
            if not ok:
                failed.append(name)
        name, out, truth, dtype, shard_bytes = cases[0]
        first, errors = negative_control(out, truth, dtype, shard_bytes)
    if len(errors) == 1 and errors[0].startswith(first + ": differs"):
        print(f"negative control: one byte of {first} flipped in a copy of {name}: found, and only it")
    else:
        print(f"negative control FAILED: one byte of {first} flipped, the check reported {errors[:5]}")
        failed.append("negative control")
    if failed:
        print("FAILED:", ", ".join(failed))
    print(f"safetensors: generator and ucpkit tools {t_tools:.1f} s, whole check {time.monotonic() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
