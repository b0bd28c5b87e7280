"""Loads ucpkit's DCP output with the real torch.distributed.checkpoint (run by scripts/verify/dcp_verify.sh with
the pinned framework environment's torch 2.15, or with TRIXIE=... inside the Debian-trixie chroot with
python3-torch 2.6; not in CI).

  python3 dcp_verify.py ROOT

ROOT holds cases.tsv (folder, fixture, world size the folder was written for; written by the
gtest DcpVerifyWriter.WritesOurOutputForRealTorch and by dcp_verify.sh's ucp-load runs), the folders, truth/<fixture>.truth/ and
src/<fixture>/ (the committed fixtures). For every case and every load world size W in (1, 2, 4)
other than the one it was written for, `dcp.load` fills a fresh state dict:
  W = 1: plain full-size tensors, no process group;
  W = 2: DTensors on a 1-D gloo mesh, Shard(0) (scalars replicated);
  W = 4: DTensors on a 2x2 mesh, 2-D and more (Shard(0), Shard(1)), 1-D (Shard(0), Replicate()).
Each tensor (gathered with full_tensor()) is compared bit for bit with the fixture's truth
(tensors.safetensors, recorded by the saving script), each bytes item with what torch's own load of
the original fixture gives. Every case also goes through torch's
format_utils.dcp_to_torch_save (which rebuilds the nesting from planner_data): each value found at its
planner_data path is compared the same way. Prints one line per case and load, one
`RESULT framework=torch version=V case=dcp_verify/<fixture> tensors=N equal=yes|no values=M` line per
fixture (all its folders and loads; scripts/frameworks/run_all.sh collects them), then the totals;
exit 1 on any difference.
"""
import io
import os
import pathlib
import socket
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors.torch import load_file
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

# The committed fixtures saved under Python 3.13 (the trixie chroot) pickle their storage_meta's
# checkpoint_id as pathlib._local.PosixPath, a module Python < 3.13 lacks (torch 2.15's FileSystemReader
# on the pinned environment's Python 3.11: "ModuleNotFoundError: No module named 'pathlib._local'").
# Only the originals' .metadata (the bytes items' reference) need it; our output pickles no path.
if sys.version_info < (3, 13):
    sys.modules.setdefault("pathlib._local", pathlib)


def bits_equal(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def read_cases(root):
    cases = []
    for line in open(os.path.join(root, "cases.tsv")):
        name, fixture, world = line.rstrip("\n").split("\t")
        cases.append((name, fixture, int(world)))
    return cases


def entries(path):
    md = dcp.FileSystemReader(path).read_metadata()
    return md.state_dict_metadata


def torch_bytes_of(path):
    """Bytes items of an original fixture as torch decodes them: torch.load of each item's bytes found
    through torch's FileSystemReader metadata (both class-path eras: torch 1.13's prototype classes
    are not instances of the 2.x ones, so they are matched by name). A folder without a global
    .metadata (the safetensors flavour, torch 2.14's __{rank}.metadata rank-local save) holds none here:
    its truth records no bytes items that our output could carry."""
    if not os.path.exists(os.path.join(path, ".metadata")):
        return {}
    md = dcp.FileSystemReader(path).read_metadata()
    if any(getattr(info, "transform_descriptors", None) for info in md.storage_data.values()):
        # items stored through a transform (torch >= 2.7's zstd extension): torch's own dcp.load decodes them
        from torch.distributed.checkpoint import DefaultLoadPlanner

        out = {k: None for k, m in md.state_dict_metadata.items() if type(m).__name__ == "BytesStorageMetadata"}
        dcp.load(out, storage_reader=dcp.FileSystemReader(path), planner=DefaultLoadPlanner(allow_partial_load=True))
        return out
    out = {}
    for key, info in md.storage_data.items():
        if type(md.state_dict_metadata[key.fqn]).__name__ != "BytesStorageMetadata":
            continue
        with open(os.path.join(path, info.relative_path), "rb") as f:
            f.seek(info.offset)
            out[key.fqn] = torch.load(io.BytesIO(f.read(info.length)), weights_only=False)
    return out


def truth_key(k, truth):
    """The truth key of our output's key k: the same, or k without "model." where ucp-load rewrote the
    fixture through a universal folder (rank-local and safetensors-flavour inputs), whose DCP output
    uses get_state_dict's keys (model.<fqn>; docs/ucp-load.md "DCP output")."""
    if k not in truth and k.startswith("model.") and k[len("model."):] in truth:
        return k[len("model."):]
    return k


def placements(ndim, world):
    from torch.distributed.tensor import Replicate, Shard

    if world == 2:
        return [Shard(0) if ndim >= 1 else Replicate()]
    if ndim >= 2:
        return [Shard(0), Shard(1)]
    return [Shard(0), Replicate()] if ndim == 1 else [Replicate(), Replicate()]


def check_case(root, name, fixture, world, ref_bytes, mesh):
    """Loads one case at `world`; returns (tensors, tensors equal, bytes items, bytes equal, notes)."""
    from torch.distributed.tensor import distribute_tensor

    path = os.path.join(root, name)
    md = entries(path)
    sd = {}
    for k, m in md.items():
        if isinstance(m, TensorStorageMetadata):
            full = torch.zeros(m.size, dtype=m.properties.dtype)
            sd[k] = full if mesh is None else distribute_tensor(full, mesh, placements(len(m.size), world))
        else:
            sd[k] = None
    dcp.load(sd, checkpoint_id=path)  # no process group (W = 1): torch runs it as one rank
    truth = load_file(os.path.join(root, "truth", fixture + ".truth", "tensors.safetensors"))
    n = ok = nb = okb = 0
    notes = []
    for k in sorted(md):
        if isinstance(md[k], BytesStorageMetadata):
            nb += 1
            if k in ref_bytes and sd[k] == ref_bytes[k]:
                okb += 1
            else:
                notes.append("bytes %s: %r vs torch's %r" % (k, sd[k], ref_bytes.get(k)))
            continue
        t = sd[k] if mesh is None else sd[k].full_tensor()
        n += 1
        tk = truth_key(k, truth)
        if tk in truth and bits_equal(t, truth[tk]):
            ok += 1
        else:
            notes.append("tensor %s differs%s" % (k, "" if tk in truth else " (no truth)"))
    missing = sorted(set(truth) - {truth_key(k, truth) for k, m in md.items() if isinstance(m, TensorStorageMetadata)})
    for k in missing:
        n += 1
        notes.append("tensor %s missing" % k)
    return n, ok, nb, okb, notes


def check_to_torch_save(root, name, fixture, ref_bytes):
    """torch's dcp_to_torch_save of one case (no process group; the nesting rebuilt from our
    planner_data): every value found at its planner_data path, compared as in check_case."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = os.path.join(root, name)
    md = dcp.FileSystemReader(path).read_metadata()
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(path, os.path.join(tmp, "all.pt"))
        nested = torch.load(os.path.join(tmp, "all.pt"), weights_only=False)
    truth = load_file(os.path.join(root, "truth", fixture + ".truth", "tensors.safetensors"))
    n = ok = nb = okb = 0
    notes = []
    for k, m in sorted(md.state_dict_metadata.items()):
        v = nested
        for part in md.planner_data[k]:
            v = v[part]
        if isinstance(m, BytesStorageMetadata):
            nb += 1
            okb += int(k in ref_bytes and v == ref_bytes[k])
        else:
            n += 1
            tk = truth_key(k, truth)
            if tk in truth and bits_equal(v, truth[tk]):
                ok += 1
            else:
                notes.append("tensor %s differs" % k)
    return n, ok, nb, okb, notes


def run_world(rank, world, port, root, cases, refs, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0", RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,) if world == 2 else (2, world // 2))
    out = []
    for name, fixture, saved in cases:
        if saved == world:
            continue
        out.append((name, world) + check_case(root, name, fixture, world, refs[fixture], mesh))
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
    cases = read_cases(root)
    refs = {}
    for _, fixture, _ in cases:
        src = os.path.join(root, "src", fixture)
        if not os.path.exists(os.path.join(src, ".metadata")):
            src = os.path.join(src, "rank_0")
        refs.setdefault(fixture, torch_bytes_of(src))
    rows = []
    for name, fixture, saved in cases:
        if saved != 1:
            rows.append((name, 1) + check_case(root, name, fixture, 1, refs[fixture], None))
    for name, fixture, _ in cases:
        rows.append((name, "dcp_to_torch_save") + check_to_torch_save(root, name, fixture, refs[fixture]))
    ctx = mp.get_context("spawn")
    for world in (2, 4):
        q = ctx.Manager().Queue()
        mp.spawn(run_world, args=(world, free_port(), root, cases, refs, q), nprocs=world, join=True)
        rows.extend(q.get())
    tot = [0, 0, 0, 0]
    bad = 0
    for name, world, n, ok, nb, okb, notes in sorted(rows, key=lambda r: (r[0], str(r[1]))):
        how = "load at %d rank(s)" % world if isinstance(world, int) else world
        print("%-36s %-18s: %d/%d tensors equal, %d/%d bytes items equal" % (name, how, ok, n, okb, nb))
        for note in notes:
            print("    " + note)
        bad += (n - ok) + (nb - okb)
        for i, v in enumerate((n, ok, nb, okb)):
            tot[i] += v
    version = torch.__version__.split("+")[0]
    by_fixture = {}
    fixture_of = {name: fixture for name, fixture, _ in cases}
    for name, world, n, ok, nb, okb, notes in rows:
        agg = by_fixture.setdefault(fixture_of[name], [0, 0, 0, 0])
        for i, v in enumerate((n, ok, nb, okb)):
            agg[i] += v
    for fixture, (n, ok, nb, okb) in sorted(by_fixture.items()):
        print("RESULT framework=torch version=%s case=dcp_verify/%s tensors=%d equal=%s values=%d"
              % (version, fixture, n, "yes" if (n, nb) == (ok, okb) and n else "no", nb))
    print("TOTAL %d loads (dcp.load and dcp_to_torch_save) of %d folders: %d/%d tensors equal, %d/%d bytes items equal"
          % (len(rows), len(cases), tot[1], tot[0], tot[3], tot[2]))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
