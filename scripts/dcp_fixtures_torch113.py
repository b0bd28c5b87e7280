"""Old-era DCP fixture: a real checkpoint written by torch 1.13's prototype DCP (outside CI).

    /usr/bin/python3 scripts/dcp_fixtures_torch113.py OUT_DIR

Debian 12's python3-torch (1.13.1) ships DCP as torch.distributed._shard.checkpoint (the module
that became torch.distributed.checkpoint in 2.0), with TensorProperties pickled from
torch.distributed._shard.sharded_tensor.metadata: the class paths of every DCP written before
torch 2.3. Two gloo ranks save with the real save_state_dict:
  * row:   a ShardedTensor 6x5 float32, ChunkShardingSpec(dim=0) over the 2 ranks (rows 0-2, 3-5)
  * col:   a ShardedTensor 4x6 bfloat16, ChunkShardingSpec(dim=1) (columns 0-2, 3-5)
  * plain: a plain 3x4 int64 tensor, equal on both ranks (deduplicated: one whole-tensor chunk)
  * step:  the int 7 (a bytes item: torch.save(7))
Truth: OUT_DIR.truth/tensors.safetensors with the full tensors as this script built them (written
here by a minimal safetensors writer, not by DCP) and manifest.json.
"""
import json
import os
import struct
import sys

import dataclasses

_dataclass = dataclasses.dataclass


def _hashable_dataclass(cls=None, **kw):
    """Python 3.11 refuses an unhashable dataclass instance as a field default, which torch 1.13's
    sharded_tensor/metadata.py uses (ShardedTensorMetadata.tensor_properties = TensorProperties()):
    Debian 12's torch 1.13 + Python 3.11 cannot import torch.distributed._shard otherwise. Giving
    TensorProperties back object.__hash__ changes nothing that is pickled."""
    def wrap(c):
        r = _dataclass(c, **kw)
        if r.__name__ == "TensorProperties":
            r.__hash__ = object.__hash__
        return r
    return wrap if cls is None else wrap(cls)


dataclasses.dataclass = _hashable_dataclass

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def full_tensors():
    g = torch.Generator().manual_seed(113)
    return {
        "row": torch.randn(6, 5, generator=g),
        "col": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "plain": torch.arange(12, dtype=torch.int64).reshape(3, 4) * 1000 - 5000,
    }


def sharded(full, dim, world):
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    spec = ChunkShardingSpec(dim=dim, placements=["rank:%d/cpu" % r for r in range(world)])
    st = sharded_tensor.empty(spec, *full.shape, dtype=full.dtype)
    for shard in st.local_shards():
        sl = tuple(slice(o, o + s) for o, s in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
        shard.tensor.copy_(full[sl])
    return st


def run(rank, world, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed._shard.checkpoint import FileSystemWriter, save_state_dict

    t = full_tensors()
    sd = {"row": sharded(t["row"], 0, world), "col": sharded(t["col"], 1, world), "plain": t["plain"], "step": 7}
    save_state_dict(sd, storage_writer=FileSystemWriter(out))
    dist.barrier()
    dist.destroy_process_group()


_ST = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}


def write_safetensors(path, tensors):
    header, blobs, pos = {}, [], 0
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        raw = t.view(-1).view(torch.uint8).numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.view(torch.int16).numpy().tobytes()
        header[k] = {"dtype": _ST[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    out = sys.argv[1]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(2, out, port), nprocs=2, join=True)
    truth = out.rstrip("/") + ".truth"
    os.makedirs(truth, exist_ok=True)
    write_safetensors(os.path.join(truth, "tensors.safetensors"), full_tensors())
    json.dump({"info": {"torch": torch.__version__, "world": 2, "nontensor": {"step": 7}},
               "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in full_tensors().items()}},
              open(os.path.join(truth, "manifest.json"), "w"), indent=1, sort_keys=True)
    print("torch %s: %s and %s" % (torch.__version__, out, truth))


if __name__ == "__main__":
    main()
