#!/usr/bin/env bash
# The DCP flavours torch 2.15's own save code writes, read by ucpkit and judged by torch (issue 48;
# label `frameworks`, docs/frameworks.md "DCP flavours"). scripts/frameworks/dcp_flavours.py saves one
# small FSDP2 model (DTensor Shard(0) on 2 gloo CPU ranks, AdamW state) with torch 2.15's dcp.save as:
# FileSystemWriter (plain), FileSystemWriter with the ZStandard extension (zstd), HuggingFaceStorageWriter
# with save_distributed (hf) and with enable_consolidation (hfcons: its sharded/ folder is the DCP flavour),
# rank-local saves (ranklocal: use_collectives=False, __{rank}.metadata; rankdirs: no_dist=True into
# rank_<r>/), and with an int64 tensor beside the parameters (plain_int64, hf_int64, ranklocal_int64),
# and writes the truth (torch's own full_state_dict gather) beside each. For every flavour, from another
# folder with relative paths: `ucp-info` (exit 0, every check ok, the folder kind), `ucp-union` (every
# tensor of the universal folder's zero/<param>/<state>.pt equal to the truth bit for bit, none missing,
# none extra) and `ucp-load --format dcp --world-size 1` and `2`, whose outputs torch 2.15's dcp.load
# (FileSystemReader) reads equal to the truth bit for bit (tensors; param_groups values by repr).
# One table line per flavour. Known limits, each expected with its exact exit and error (another fails):
# none now (ucp-union refused plain_int64 and ranklocal_int64, whose int64 tensor has no optimizer state,
# until the universal form carried buffers: issue 47; the tensor is in zero/<name>/fp32.pt, int64).
# (ucp-load --format dcp of a rank-local or safetensors-flavour save holding an int64 tensor failed until
# the whole rewrite was registered for those flavours too: the bug this test found, docs/frameworks.md.)
# A known failure that starts to pass is checked like the rest and reported (update the doc).
# Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
py=$FRAMEWORKS_PY
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
t0=$SECONDS
"$py" "$root/scripts/frameworks/dcp_flavours.py" --out saved >save.out 2>save.log || { cat save.out; tail -30 save.log; exit 1; }
cat save.out  # torch's refusals (REFUSED ...) and what was saved instead (NOTE ...)
t_save=$((SECONDS - t0))
# The flavour -> the folder ucpkit is given (hfcons: the DCP flavour is sharded/; the top folder is the
# consolidated plain Hugging Face file, not a DCP flavour).
flavours=(plain zstd hf hfcons ranklocal rankdirs plain_int64 hf_int64 ranklocal_int64)
mkdir elsewhere status union load1 load2
cd elsewhere
for f in "${flavours[@]}"; do
  in=../saved/$f
  [[ $f == hfcons ]] && in=../saved/hfcons/sharded
  [[ -d $in ]] || { echo "$f: torch wrote no folder (see REFUSED above)"; exit 1; }
  run() {  # step, command...: rc and stderr kept for the judge
    local step=$1; shift
    local rc=0
    "$@" >"../status/$f.$step.out" 2>"../status/$f.$step.err" || rc=$?
    echo $rc >"../status/$f.$step.rc"
  }
  run info "$build/bin/ucp-info" --json "$in"
  run union "$build/bin/ucp-union" -q --input "$in" --output "../union/$f"
  run load1 "$build/bin/ucp-load" -q --input "$in" --format dcp --world-size 1 --output "../load1/$f"
  run load2 "$build/bin/ucp-load" -q --input "$in" --format dcp --world-size 2 --output "../load2/$f"
done
cd ..
t_tools=$((SECONDS - t0 - t_save))
"$py" - "${flavours[@]}" <<'PY'
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from safetensors.torch import load_file

flavours = sys.argv[1:]
kinds = {"plain": "dcp", "zstd": "dcp", "plain_int64": "dcp", "hf": "dcp-safetensors", "hfcons": "dcp-safetensors",
         "hf_int64": "dcp-safetensors", "ranklocal": "dcp-rank-local", "rankdirs": "dcp-rank-local",
         "ranklocal_int64": "dcp-rank-local"}
PRECISION = "ucp-load: error: the source does not record its precision (no ds_config or args in its model file): give --dtype"
# (flavour, step) -> (what it is, the exit code and the exact error expected on stderr)
expected_errors = {}


def same(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def universal_path(key):
    """A truth key -> the universal state file that holds it (docs/formats-dcp.md, ucp-union's table)."""
    parts = key.split(".")
    if parts[:2] == ["optim", "state"]:
        return os.path.join("zero", ".".join(parts[2:-1]), parts[-1] + ".pt")
    if parts[0] == "model":
        parts = parts[1:]
    return os.path.join("zero", ".".join(parts), "fp32.pt")


def check_union(folder, truth):
    got = {}
    for p in sorted(os.listdir(os.path.join(folder, "zero"))):
        d = os.path.join(folder, "zero", p)
        if os.path.isdir(d):
            for s in os.listdir(d):
                got[os.path.join("zero", p, s)] = os.path.join(d, s)
    want = {universal_path(k): k for k in truth}
    bad = sorted(set(want) ^ set(got))
    for rel, k in want.items():
        if rel in got:
            obj = torch.load(got[rel], map_location="cpu", weights_only=False)
            t = obj["param"] if isinstance(obj, dict) else obj
            if not same(t, truth[k]):
                bad.append(rel)
    return len(want), bad


def check_load(folder, truth, nontensor, world):
    md = FileSystemReader(folder).read_metadata()
    ranks = {n.split("_")[2] for n in os.listdir(folder) if n.endswith(".distcp")}  # __{rank}_{k}.distcp
    assert ranks == {str(r) for r in range(world)}, f"{folder}: data files of ranks {sorted(ranks)}, want {world}"
    sd = {k: (torch.empty(v.size, dtype=v.properties.dtype) if hasattr(v, "properties") else None)
          for k, v in md.state_dict_metadata.items()}
    dcp.load(sd, storage_reader=FileSystemReader(folder))  # no process group: one process reads it all
    # ucp-load's DCP output from the universal form uses get_state_dict's keys (model.<fqn>): a top-level
    # key of the safetensors flavour is found under model.<key> (docs/ucp-load.md "DCP output")
    name = {k: (k if k in sd else "model." + k) for k in truth}
    bad = [k for k in truth if name[k] not in sd or not isinstance(sd[name[k]], torch.Tensor)
           or not same(sd[name[k]], truth[k])]
    extra = sorted(k for k, v in sd.items() if isinstance(v, torch.Tensor) and k not in name.values())
    values = [k for k in nontensor if k in sd]
    bad += extra + [k for k in values if repr(sd[k]) != nontensor[k]]
    return len(truth), len(values), bad


failed, known, fixed, rows = [], [], [], []
# The zstd flavour is what it says: every item of its .metadata carries torch's zstd descriptor.
zmd = FileSystemReader("saved/zstd").read_metadata()
descs = {tuple(getattr(i, "transform_descriptors", None) or ()) for i in zmd.storage_data.values()}
if descs != {("stream.zstd/1",)}:
    failed.append(f"zstd: the items' transform_descriptors are {descs}, not stream.zstd/1")
for f in flavours:
    tdir = os.path.join("saved", f + ".truth")
    truth = load_file(os.path.join(tdir, "tensors.safetensors"))
    nontensor = json.load(open(os.path.join(tdir, "info.json")))["nontensor"]
    cells = []
    for step in ("info", "union", "load1", "load2"):
        rc = int(open(f"status/{f}.{step}.rc").read())
        err = open(f"status/{f}.{step}.err").read()
        exp = expected_errors.get((f, step))
        if rc != 0:
            if exp and rc == exp[1] and exp[2] in err:
                cells.append(f"{step}: {exp[0].lower()} (exit {rc})")
                if exp[0] == "KNOWN FAILURE":
                    known.append(f"{f} {step}: exit {rc}: " + " ".join(l for l in err.splitlines() if "error" in l))
                continue
            failed.append(f"{f} {step}: exit {rc}: {err.strip()[-600:]}")
            cells.append(f"{step}: FAILED (exit {rc})")
            continue
        if exp:
            fixed.append(f"{f} {step} ({exp[0]}) now exits 0")
        try:
            if step == "info":
                j = json.load(open(f"status/{f}.info.out"))
                checks = {c["name"]: c["status"] for c in j["checks"]}
                ok = j["kind"] == "dcp" and j["dcp"]["folder"] == kinds[f] and j["dcp"]["world_size"] == 2 and \
                    all(s == "ok" for s in checks.values()) and j["dcp"]["tensor_entries"] == len(truth)
                cells.append(f"info: {j['dcp']['folder']}, {len(checks)} checks ok" if ok else "info: WRONG")
                if not ok:
                    failed.append(f"{f} info: {j['dcp']} {checks}")
            elif step == "union":
                n, bad = check_union(os.path.join("union", f), truth)
                cells.append(f"union: {n - len(bad)}/{n} equal")
                if bad:
                    failed.append(f"{f} union differs: {bad[:6]}")
            else:
                n, nv, bad = check_load(os.path.join(step, f), truth, nontensor, int(step[-1]))
                cells.append(f"{step} -> dcp.load: {n - len([b for b in bad if b in truth])}/{n} equal"
                             + (f" + {nv} values" if nv else ""))
                if bad:
                    failed.append(f"{f} {step} differs: {bad[:6]}")
        except Exception as e:  # a reader refusing our output is a failure of that cell
            cells.append(f"{step}: FAILED ({type(e).__name__})")
            failed.append(f"{f} {step}: {type(e).__name__}: {e}")
    rows.append((f, cells))

print("flavour          | " + " | ".join(["ucp-info", "ucp-union -> zero/*.pt", "ucp-load ws1 -> torch dcp.load",
                                          "ucp-load ws2 -> torch dcp.load"]))
for f, cells in rows:
    print(f"{f:<16} | " + " | ".join(c.split(": ", 1)[1] for c in cells))
for k in known:
    print("KNOWN FAILURE (ucpkit bug, docs/frameworks.md):", k)
for x in fixed:
    print("NOW PASSES (update docs/frameworks.md and this test's expectations):", x)
for x in failed:
    print("FAILED:", x)
sys.exit(1 if failed else 0)
PY
echo "dcp flavours: torch save ${t_save} s, ucpkit tools ${t_tools} s, whole test $((SECONDS - t0)) s"
