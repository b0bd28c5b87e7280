"""DCP fixtures from newer torch save code (scripts/dcp_fixtures_newer.sh runs this in the trixie chroot).

torch 2.14.1's torch/distributed/checkpoint package (pure Python, Debian python3-torch
2.14.1+dfsg-1) overlaid on the installed torch 2.6.0 (PYTHONPATH overlay, dcp214_shim for the two
helpers 2.14's package imports that 2.6 lacks); the model, its sharding, the Adam steps and the
truth are torch2lab's dcp_save.py functions (TinyLlama with torchtitan names, truth = torch's own
get_state_dict(full_state_dict=True) gathered tensors, not DCP loading).

  --variant zstd       FileSystemWriter(out, _extensions=[ZStandard()]): every item (tensors and
                       bytes items) a zstd stream, _StorageInfo.transform_descriptors ["stream.zstd/1"]
                       (torch 2.14.1 filesystem.py:233-281, :320-372; _extension.py:91-119)
  --variant plain      FileSystemWriter(out) of the same torch: Metadata.version "1.0.0"
                       (filesystem.py:71, :762), StorageMeta.modules (metadata.py:134)
  --variant ranklocal  dcp.save(..., use_collectives=False): every rank writes __{rank}.metadata
                       (state_dict_saver.py:151, filesystem.py:770-806)
  --variant hf         HuggingFaceStorageWriter(out, save_distributed=True): per rank
                       shard-0000{r+1}-model-00001-of-00001.safetensors with DCP_SHARDING_INFO
                       (hf_storage.py:49-137, _hf_utils.py:10-50, filesystem.py:454-467); no metadata file
  --variant hfcons     the same with enable_consolidation=True: sharded/ + consolidated
                       model-00001-of-00001.safetensors + model.safetensors.index.json
  --variant hfmulti    HuggingFaceStorageWriter(save_distributed=True, fqn_to_index_mapping=...):
                       two files per rank, shard-0000{r+1}-model-0000{1,2}-of-00002.safetensors
                       (hf_storage.py:108-137, _hf_utils.py:58-77)

Run WITHOUT the overlay (the installed torch 2.6's own DCP package, its real dcp.save):
  --variant shardprops the torch 2.0-2.2 class paths: torch.distributed.checkpoint.metadata.TensorProperties
                       patched to torch.distributed._shard.sharded_tensor.metadata.TensorProperties
                       while saving, exactly as torch's own compatibility test emulates checkpoints of
                       those versions (test/distributed/checkpoint/test_compatibility.py
                       test_sharded_tensor_dependency, pytorch/pytorch 066dd9c8); 2.0-2.2's
                       checkpoint/metadata.py imports TensorProperties from there (upstream 03e266fa
                       metadata.py:6)
  --variant strides6   EMULATED, not torch's code: TensorProperties' state tuple lengthened to 6 items
                       (__getstate__; __setstate__ takes 5 or 6, as the test says the changed class does),
                       (dtype, layout, requires_grad, memory-format enum, pin_memory, strides), as a
                       2026 upstream test_compatibility.py describes the change (its
                       test_tensor_properties_backward_compat_without_strides /
                       ..._strides_survive_pickle_roundtrip: create_from_tensor sets strides =
                       tensor.stride(), __getstate__ returns 6 items); torch 2.14.1 still writes 5 and
                       no torch package with the change was at hand
"""
import argparse
import os
import sys

sys.path.insert(0, "/torch2lab")
import dcp214_shim  # noqa: F401,E402  (before torch.distributed.checkpoint is imported)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import dcp_save  # noqa: E402
from labdist import log, spawn  # noqa: E402


def _save(rank, world, o):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    m, mesh = dcp_save.shard_model(dcp_save.build_model(o), o, world)
    opt = dcp_save.optimizer_steps(m, o.steps) if o.optim else None
    if opt is not None:
        msd, osd = get_state_dict(m, opt)
        sd = {"model": msd, "optim": osd}
    else:
        sd = m.state_dict()
    if rank == 0:
        os.makedirs(o.out, exist_ok=True)
    dist.barrier()
    if o.variant == "zstd":
        from torch.distributed.checkpoint._extension import ZStandard
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(o.out, _extensions=[ZStandard()]))
    elif o.variant == "plain":
        dcp.save(sd, checkpoint_id=o.out)
    elif o.variant == "ranklocal":
        dcp.save(sd, checkpoint_id=o.out, use_collectives=False)
    elif o.variant == "shardprops":
        from unittest.mock import patch
        from torch.distributed._shard.sharded_tensor.metadata import TensorProperties as stp
        with patch("torch.distributed.checkpoint.metadata.TensorProperties", stp):
            dcp.save(sd, checkpoint_id=o.out)
    elif o.variant == "strides6":
        from torch.distributed.checkpoint.metadata import TensorProperties as TP
        orig_create, orig_get, orig_set = TP.create_from_tensor, TP.__getstate__, TP.__setstate__

        def create_from_tensor(tensor):
            p = orig_create(tensor)
            p.strides = tuple(tensor.stride())
            return p

        TP.create_from_tensor = staticmethod(create_from_tensor)
        def setstate(self, state):  # 5 items (older saves) or 6, as the changed class reads both
            orig_set(self, tuple(state[:5]))
            self.strides = state[5] if len(state) > 5 else None

        TP.__getstate__ = lambda self: orig_get(self) + (getattr(self, "strides", None),)
        TP.__setstate__ = setstate
        dcp.save(sd, checkpoint_id=o.out)
    elif o.variant in ("hf", "hfcons"):
        from torch.distributed.checkpoint import HuggingFaceStorageWriter
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(
            path=o.out, save_distributed=True, enable_consolidation=(o.variant == "hfcons")))
    elif o.variant == "hfmulti":
        from torch.distributed.checkpoint import HuggingFaceStorageWriter
        # layers.* to file 1, the rest to file 2: every rank writes two files
        mapping = {k: (1 if k.startswith("layers.") else 2) for k in sd}
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(path=o.out, save_distributed=True,
                                                             fqn_to_index_mapping=mapping))
    dist.barrier()
    opts = StateDictOptions(full_state_dict=True, cpu_offload=False)
    if opt is not None:
        fm, fo = get_state_dict(m, opt, options=opts)
        full = {"model": fm, "optim": fo}
    else:
        full = get_model_state_dict(m, options=opts)
    flat, _ = flatten_state_dict(full)
    if rank == 0:
        import torch.distributed.checkpoint.filesystem as fsmod
        dcp_save.write_truth(flat, o.out.rstrip("/") + ".truth", {
            "layout": o.layout, "world": world, "optim": bool(o.optim), "variant": o.variant,
            "torch": torch.__version__, "dcp_package": os.path.dirname(fsmod.__file__),
            "dcp_package_torch": "2.14.1 (Debian python3-torch 2.14.1+dfsg-1)" if "ov214" in fsmod.__file__
            else torch.__version__,
            "placements": {k: [str(p) for p in v.placements] for k, v in dcp_save._flat_dtensors(sd)},
        })
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--variant", choices=["zstd", "plain", "ranklocal", "hf", "hfcons", "hfmulti", "shardprops", "strides6"],
                   required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--layout", choices=["fsdp", "replicated"], default="fsdp")
    p.add_argument("--optim", action="store_true")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tp", type=int, default=2)
    o = p.parse_args()
    spawn(_save, o.world, o)


if __name__ == "__main__":
    main()
