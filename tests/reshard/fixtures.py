"""Source checkpoints and reference target checkpoints (dsgen, same seed and ground truth) for the
ucp-load round-trip tests. Usage: /usr/bin/python3 tests/reshard/fixtures.py <outdir> [--full]
Writes <outdir>/<case>/src and <outdir>/<case>/ref, and <outdir>/cases.json."""
import hashlib
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "generator"))
import dsgen  # noqa: E402
import cases  # noqa: E402


def _generator_digest():
    """The generator's source: a fixture made by another version of it is made again (a build folder
    outlives changes to tests/generator/dsgen)."""
    h = hashlib.sha256()
    gdir = os.path.join(HERE, "..", "generator", "dsgen")
    for name in sorted(os.listdir(gdir)):
        if name.endswith(".py"):
            with open(os.path.join(gdir, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


GENERATOR = _generator_digest()


def gen(out, model, layout):
    stamp = out.rstrip("/") + ".generated"  # beside the checkpoint, not in it
    key = json.dumps([GENERATOR, model, layout], sort_keys=True)
    if os.path.exists(os.path.join(out, "latest")) and os.path.exists(stamp) and open(stamp).read() == key:
        return
    shutil.rmtree(out, ignore_errors=True)
    cfg = dsgen.ModelConfig(**model)
    lay = dsgen.Layout(**layout)
    dsgen.generate(out, cfg, lay, truth=True)
    with open(stamp, "w") as f:
        f.write(key)


def main():
    out = sys.argv[1]
    matrix = cases.FULL if "--full" in sys.argv[2:] else cases.CI
    os.makedirs(out, exist_ok=True)
    listing = []
    for name, model, src, tgt in matrix:
        d = os.path.join(out, name)
        gen(os.path.join(d, "src"), model, src)
        gen(os.path.join(d, "ref"), model, tgt)
        listing.append({"name": name, "target_args": cases.target_args(tgt), "source": src, "target": tgt})
    for line in cases.MOE_LINES:
        gen(os.path.join(out, "moe_lines", line), cases.DSMOE, dict(cases.MOE_LINE_SOURCE, ds_line=line))
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(listing, f, indent=1)


if __name__ == "__main__":
    main()
