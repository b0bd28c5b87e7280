"""Loads ucp-load --format dcp output with the real torch.distributed.checkpoint (run by
scripts/verify/dcp_load_verify.sh with the pinned framework environment's torch 2.15, or with TRIXIE=... inside
the Debian-trixie chroot with python3-torch 2.6; not in CI).

  python3 dcp_load_verify.py ROOT

ROOT holds cases.tsv (folder, model dtype, the universal folder it was written from), the folders and
the universal folders. For every folder and every load world size W in (1, 2), `dcp.load` fills the nested state dict
rebuilt from the folder's planner_data (model tensors under "model", optimizer state under
"optim"/"state"/<fqn>/<name>, param_groups as a list of dicts under "optim"/"param_groups"):
  W = 1: plain full-size tensors, no process group;
  W = 2: DTensors on a 1-D gloo mesh, Shard(0) (scalars replicated), gathered with full_tensor().
Each tensor is compared bit for bit with the universal truth torch reads: zero/<fqn>/fp32.pt cast with
torch's .to(dtype) for model tensors, exp_avg.pt / exp_avg_sq.pt for the optimizer states; each step
with zero/<fqn>/step.pt; each param_groups value with zero/optimizer_state.pt's (whose DeepSpeed classes
are read as stubs), "params" as the lists of fqns that cover every parameter once. Prints one line per
folder and load, one `RESULT framework=torch version=V case=dcp_load_verify/<folder> tensors=N
equal=yes|no values=M` line per folder (both loads; scripts/frameworks/run_all.sh collects them), then
the totals; exit 1 on any difference.
"""
import json
import os
import pickle
import socket
import sys
import types

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class _Stub(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except Exception:  # deepspeed's classes (ZeroStageEnum, loss scaler): not needed here
            return _Stub(name, (), {"__init__": lambda self, *a, **k: None, "__setstate__": lambda self, s: None})


STUB_PICKLE = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="stub_pickle")


def bits_equal(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def state_tensor(path, shape, flat):
    """A universal state file's tensor in the parameter's shape: {"param": t}, or (ZeRO-3 sources at TP 1,
    manifest "flat") a bare 1-D tensor, kept 1-D here: a vocabulary tensor's holds the padding rows
    after the real ones, which ucp-load drops (see `expected`)."""
    t = torch.load(path, weights_only=False, pickle_module=STUB_PICKLE)
    t = t["param"] if isinstance(t, dict) else t
    if flat:
        return t.reshape(-1)
    if list(t.shape) != list(shape) and t.numel() == torch.Size(shape).numel():
        t = t.reshape(shape)
    return t


def expected(want, got, notes, key):
    """`want` in the shape of `got` when `want` is a flat form holding `got`'s rows first (vocabulary
    padding rows after them: ucp-load writes the unpadded vocabulary), noted once per key."""
    if want.dim() == 1 and got.dim() > 1 and want.numel() >= got.numel() and want.numel() % got[0].numel() == 0:
        if want.numel() > got.numel():
            notes.append("(%s: %d vocabulary padding rows of the flat universal tensor not written)"
                         % (key, want.numel() // got[0].numel() - got.shape[0]))
        return want[: got.numel()].reshape(got.shape)
    return want


def universal_truth(u):
    """{param: {state: tensor}}, {param: step}, param_groups, as torch reads the universal folder."""
    manifest = json.load(open(os.path.join(u, "manifest.json")))
    states, steps = {}, {}
    for p in manifest["params"]:
        name = p["name"]
        states[name] = {s: state_tensor(os.path.join(u, f["file"]), p["shape"], p.get("flat", False)) for s, f in p["states"].items()}
        step = os.path.join(u, "zero", name, "step.pt")
        if os.path.exists(step):
            steps[name] = torch.load(step, weights_only=False, pickle_module=STUB_PICKLE)
    osd = torch.load(os.path.join(u, "zero", "optimizer_state.pt"), weights_only=False, pickle_module=STUB_PICKLE)
    return states, steps, osd["param_groups"]


def set_path(root, path, value):
    node = root
    for k, nxt in zip(path[:-1], path[1:]):
        if isinstance(node, list):
            while len(node) <= k:
                node.append(None)
        if (node[k] if isinstance(node, list) else node.get(k)) is None:
            node[k] = [] if isinstance(nxt, int) else {}
        node = node[k]
    if isinstance(node, list):
        while len(node) <= path[-1]:
            node.append(None)
    node[path[-1]] = value


def get_path(root, path):
    for k in path:
        root = root[k]
    return root


def target_state_dict(md, mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    sd = {}
    for k, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            v = None
        else:
            v = torch.zeros(m.size, dtype=m.properties.dtype)
            if mesh is not None:
                v = distribute_tensor(v, mesh, [Shard(0) if len(m.size) >= 1 else Replicate()])
        set_path(sd, list(md.planner_data[k]), v)
    return sd


def check_case(root, name, dtype, mesh, truth):
    """Loads one folder; returns (tensors, tensors equal, values, values equal, notes)."""
    states, steps, groups = truth
    path = os.path.join(root, name)
    md = dcp.FileSystemReader(path).read_metadata()
    sd = target_state_dict(md, mesh)
    dcp.load(sd, checkpoint_id=path)
    n = ok = nv = okv = 0
    notes = []
    covered = []
    for k in sorted(md.state_dict_metadata):
        p = list(md.planner_data[k])
        v = get_path(sd, p)
        if not isinstance(md.state_dict_metadata[k], BytesStorageMetadata):
            n += 1
            t = v.full_tensor() if mesh is not None else v
            if p[0] == "model":
                want = states[p[1]]["fp32"].to(DTYPES[dtype])
            elif p[:2] == ["optim", "state"] and p[3] == "step":
                want = steps[p[2]]
            else:
                want = states[p[2]][p[3]]
            want = expected(want, t, notes, k)
            if bits_equal(t, want):
                ok += 1
            else:
                notes.append("tensor %s differs" % k)
            continue
        nv += 1
        if p[:2] == ["optim", "state"] and p[3] == "step":
            good = v == steps[p[2]]
        elif p[:2] == ["optim", "param_groups"] and p[3] == "params":
            good = isinstance(v, list) and all(isinstance(x, str) for x in v)
            covered.extend(v if good else [])
        elif p[:2] == ["optim", "param_groups"]:
            good = v == groups[p[2]][p[3]]
        else:
            good = False
        okv += int(bool(good))
        if not good:
            notes.append("value %s: %r" % (k, v))
    if sorted(covered) != sorted(states):
        notes.append("param_groups params do not list every parameter once")
        okv -= 1
    missing = [s for s in ("fp32", "exp_avg", "exp_avg_sq") for q in states if s not in states[q]]
    if missing:
        notes.append("universal states missing: %r" % missing[:3])
    n_want = sum(len(s) for s in states.values()) + sum(1 for s in steps.values() if torch.is_tensor(s))
    if n != n_want:
        notes.append("%d tensors in the checkpoint, %d in the universal folder" % (n, n_want))
        n = max(n, n_want)
    return n, ok, nv, okv, notes


def run_world(rank, world, port, root, cases, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0", RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    out = [(name, world) + check_case(root, name, dtype, mesh, universal_truth(os.path.join(root, u)))
           for name, dtype, u in cases]
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        results.put(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    root = sys.argv[1]
    cases = [tuple(line.rstrip("\n").split("\t")) for line in open(os.path.join(root, "cases.tsv"))]
    rows = [(name, 1) + check_case(root, name, dtype, None, universal_truth(os.path.join(root, u)))
            for name, dtype, u in cases]
    ctx = mp.get_context("spawn")
    q = ctx.Manager().Queue()
    mp.spawn(run_world, args=(2, free_port(), root, cases, q), nprocs=2, join=True)
    rows.extend(q.get())
    tot = [0, 0, 0, 0]
    bad = 0
    for name, world, n, ok, nv, okv, notes in sorted(rows):
        print("%-46s load at %d rank(s): %d/%d tensors equal, %d/%d values equal (steps, param_groups)"
              % (name, world, ok, n, okv, nv))
        for note in notes:
            print("    " + note)
        bad += (n - ok) + (nv - okv) + sum(1 for x in notes if not x.startswith("("))
        for i, v in enumerate((n, ok, nv, okv)):
            tot[i] += v
    version = torch.__version__.split("+")[0]
    by_folder = {}
    for name, world, n, ok, nv, okv, notes in rows:
        agg = by_folder.setdefault(name, [0, 0, 0, 0, 0])
        for i, v in enumerate((n, ok, nv, okv, sum(1 for x in notes if not x.startswith("(")))):
            agg[i] += v
    for name, (n, ok, nv, okv, bad_notes) in sorted(by_folder.items()):
        good = n and (n, nv) == (ok, okv) and not bad_notes
        print("RESULT framework=torch version=%s case=dcp_load_verify/%s tensors=%d equal=%s values=%d"
              % (version, name, n, "yes" if good else "no", nv))
    print("TOTAL %d loads of %d folders: %d/%d tensors equal, %d/%d values equal"
          % (len(rows), len(cases), tot[1], tot[0], tot[3], tot[2]))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
