"""The DCP flavours ucpkit reads, written by torch 2.15's own save code (issue 48; docs/frameworks.md).

Run with the pinned framework environment's python (scripts/frameworks/setup.sh: torch 2.15.0 and
zstandard 0.25.0 from PyPI); tests/frameworks/dcp_flavours_test.sh runs it and judges what ucpkit makes
of every folder:

    "$(scripts/frameworks/setup.sh)/bin/python" scripts/frameworks/dcp_flavours.py --out OUT [--flavours a,b]

Two gloo CPU ranks (torch.multiprocessing spawn, USE_LIBUV=0) build one small model (an embedding, a
linear layer with bias, a LayerNorm, a head without bias: 6 parameters, 206 elements, odd sizes, so
FSDP2's Shard(0) splits rows unevenly), shard it with FSDP2 `fully_shard` (every parameter a DTensor on
a 1-D mesh of 2), train 2 AdamW steps, and save the state in every flavour (OUT/<flavour>):

  plain      dcp.save(sd, storage_writer=FileSystemWriter(out)), sd = {"model", "optim"} from
             get_state_dict(model, optimizer): AdamW state (exp_avg, exp_avg_sq, step), param_groups as
             bytes items
  zstd       the same through FileSystemWriter(out, _extensions=[ZStandard()]): every item a zstd
             stream, _StorageInfo.transform_descriptors ["stream.zstd/1"]
  hf         HuggingFaceStorageWriter(out, save_distributed=True) of get_model_state_dict(model) (the
             writer is for model tensors): shard-0000{r+1}-model-00001-of-00001.safetensors per rank
             with DCP_SHARDING_INFO, no metadata file
  hfcons     the same with enable_consolidation=True: out/sharded/ (the DCP flavour) plus the
             consolidated plain Hugging Face model-00001-of-00001.safetensors and
             model.safetensors.index.json in out/
  ranklocal  dcp.save(sd, checkpoint_id=out, use_collectives=False): each rank plans and writes alone,
             `__{rank}_0.distcp` and `__{rank}.metadata` (its own chunks), no `.metadata`
  rankdirs   dcp.save(sd, checkpoint_id=out/rank_<r>, no_dist=True): each rank alone into its own
             folder with its own `.metadata` holding its Shard(0) chunks only (torch 2.6 refused this
             for DTensor state, "Failed to validate global plan"; 2.15 checks that the chunks fill the
             tensor only when the global plan has more than one rank's plan)
  plain_int64, hf_int64, ranklocal_int64
             plain / hf / ranklocal with an int64 tensor `position_ids` beside the parameters (as a
             model's persistent integer buffer: a plain tensor, the same on both ranks, no optimizer state)

hfcons is first tried with the int64 tensor; torch 2.15's consolidation refuses it (its
_consolidate_hf_safetensors.py:137 sizes every dtype with torch.finfo: "TypeError: torch.finfo()
requires a floating point input type. Use torch.iinfo to handle 'torch.finfo'"), which is reported and
the folder saved again without it. A form torch refuses is reported on stdout
(`REFUSED <what> (rank r): <exception>`, every rank's; `NOTE` says what was saved instead), not written
if nothing else is; the others are written. The truth of each flavour is written beside it,
OUT/<flavour>.truth/tensors.safetensors: the full tensors torch itself gathers (get_state_dict /
get_model_state_dict with StateDictOptions(full_state_dict=True)), flattened with DCP's own
flatten_state_dict into the keys DCP stores, not read back through DCP; OUT/<flavour>.truth/info.json:
torch version, the saved DTensors' placements, every tensor's dtype and shape, the non-tensor values'
reprs (param_groups).

The torch 2.15.0 code each option is (PyPI wheel, torch/distributed/checkpoint/; line numbers of the
installed files):
  dcp.save                          state_dict_saver.py:89 (no_dist :96, use_collectives :97; without an
                                    initialised process group no_dist is forced, :184)
  FileSystemWriter(path, _extensions=[...])
                                    filesystem.py:973 (__init__ :988, `_extensions` :997; given to
                                    _StorageWriterTransforms :628, class :233; descriptors kept per item
                                    in _StorageInfo.transform_descriptors :75-84)
  ZStandard()                       _extension.py:91 (registry_name "stream.zstd" :107-109, descriptor
                                    "stream.zstd/1" :118-119, zstandard.ZstdCompressor().stream_writer
                                    :121-124; `zstandard` imported with try_import :19-20)
  use_collectives=False             state_dict_saver.py:486-491 (the rank's own plan as the global plan),
                                    :512-517 (write, finish, barrier); the writer prefixes the rank's
                                    files `__{rank}_` (filesystem.py:668-670) and writes
                                    `__{rank}.metadata` (finish :762-801, :803-805)
  no_dist=True                      state_dict_saver.py:426 (_DistWrapper without collectives); the
                                    global plan's volume check needs > 1 plan (default_planner.py:709)
  HuggingFaceStorageWriter(path, save_distributed=True, enable_consolidation=...)
                                    hf_storage.py:49 (__init__ :54-93: SAFETENSORS serialization :83,
                                    consolidation moves the shards to `sharded/` :90-92), shard_index per
                                    rank :95-106, write_data :108-137 (file names _hf_utils.py:58-69),
                                    finish :139-160 (no metadata file when distributed and not
                                    consolidating; consolidate_safetensors_files :154)
  get_state_dict, get_model_state_dict, StateDictOptions(full_state_dict=True)
                                    state_dict.py:1271, :1189, :94 (full_state_dict :131)
  flatten_state_dict                _nested_dict.py:27
  CheckpointException               api.py:30 (a BaseException: how a rank's failure reaches every rank)
"""
import argparse
import json
import os
import shutil
import sys
import traceback
import warnings

import gloo_ranks

FLAVOURS = ("plain", "zstd", "hf", "hfcons", "ranklocal", "rankdirs", "plain_int64", "hf_int64", "ranklocal_int64")
VOCAB, DIM, HIDDEN = 11, 6, 7


def build_model():
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, DIM)
            self.up = nn.Linear(DIM, HIDDEN)
            self.norm = nn.LayerNorm(HIDDEN)
            self.out = nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, tokens):
            return self.out(self.norm(self.up(self.emb(tokens)).relu()))

    torch.manual_seed(0)
    return Net()


def worker(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0")
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter, HuggingFaceStorageWriter
    from torch.distributed.checkpoint._extension import ZStandard
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException (api.py:30)
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    mesh = init_device_mesh("cpu", (args.world,))
    model = build_model()
    for m in (model.emb, model.up, model.out):
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(2):
        g = torch.Generator().manual_seed(100 + step)
        tokens = torch.randint(0, VOCAB, (4, 6), generator=g)
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()

    msd, osd = get_state_dict(model, opt)
    full_opts = StateDictOptions(full_state_dict=True, cpu_offload=False)
    fm, fo = get_state_dict(model, opt, options=full_opts)
    flat_full, _ = flatten_state_dict({"model": fm, "optim": fo})
    flat_model_full, _ = flatten_state_dict(get_model_state_dict(model, options=full_opts))
    # An integer tensor beside the parameters, as a model's persistent position_ids buffer is: a plain
    # tensor, the same on every rank (FSDP2 leaves buffers unsharded), without optimizer state.
    pos = torch.arange(5, dtype=torch.int64) * 3 + 1

    def placements_of(saved):
        flat, _ = flatten_state_dict(saved)
        return {k: [str(p) for p in v.placements] for k, v in flat.items() if isinstance(v, DTensor)}

    def hf_writer(out, consolidate):
        return HuggingFaceStorageWriter(out, save_distributed=True, enable_consolidation=consolidate)

    # flavour -> (the state saved, its truth, how it is saved)
    full_sd, model_sd = {"model": msd, "optim": osd}, get_model_state_dict(model)
    plans = {
        "plain": (full_sd, flat_full, lambda out, sd: dcp.save(sd, storage_writer=FileSystemWriter(out))),
        "zstd": (full_sd, flat_full, lambda out, sd: dcp.save(
            sd, storage_writer=FileSystemWriter(out, _extensions=[ZStandard()]))),
        "hf": (model_sd, flat_model_full, lambda out, sd: dcp.save(sd, storage_writer=hf_writer(out, False))),
        "hfcons": (model_sd, flat_model_full, lambda out, sd: dcp.save(sd, storage_writer=hf_writer(out, True))),
        "ranklocal": (full_sd, flat_full, lambda out, sd: dcp.save(sd, checkpoint_id=out, use_collectives=False)),
        "rankdirs": (full_sd, flat_full, lambda out, sd: dcp.save(
            sd, checkpoint_id=os.path.join(out, f"rank_{rank}"), no_dist=True)),
        "plain_int64": ({"model": {**msd, "position_ids": pos}, "optim": osd},
                        {**flat_full, "model.position_ids": pos},
                        lambda out, sd: dcp.save(sd, storage_writer=FileSystemWriter(out))),
        "hf_int64": ({**model_sd, "position_ids": pos}, {**flat_model_full, "position_ids": pos},
                     lambda out, sd: dcp.save(sd, storage_writer=hf_writer(out, False))),
        "ranklocal_int64": ({"model": {**msd, "position_ids": pos}, "optim": osd},
                            {**flat_full, "model.position_ids": pos},
                            lambda out, sd: dcp.save(sd, checkpoint_id=out, use_collectives=False)),
    }
    # torch 2.15's consolidation sizes every dtype with torch.finfo (_consolidate_hf_safetensors.py:137):
    # a state with an integer tensor is refused ("TypeError: torch.finfo() requires a floating point input
    # type"). hfcons first tries the state with the int64 tensor, reports the refusal, then saves the
    # floating-point state (the form torch allows) into a clean folder.
    tries = {"hfcons": [({**model_sd, "position_ids": pos}, "hfcons with an int64 tensor")]}

    refused, notes = {}, {}

    def attempt(name, save, out, sd):
        try:
            save(out, sd)
            ok = True
        except (Exception, CheckpointException) as e:  # torch refused this form: report it, go on
            refused[name] = describe(e)
            traceback.print_exc(file=sys.stderr)
            ok = False
        dist.barrier()
        return ok

    for flavour in args.flavours.split(","):
        if flavour not in plans:
            raise SystemExit(f"unknown flavour {flavour}")
        out = os.path.join(args.out, flavour)
        sd, truth, save = plans[flavour]
        for first_sd, name in tries.get(flavour, []):
            if not attempt(name, save, out, first_sd):
                notes[flavour] = f"{name}: refused; saved without it"
                if rank == 0:
                    shutil.rmtree(out, ignore_errors=True)
                dist.barrier()
        if attempt(flavour, save, out, sd) and rank == 0:
            write_truth(truth, out + ".truth", {
                "flavour": flavour, "torch": torch.__version__, "world": args.world,
                "dcp_package": os.path.dirname(dcp.__file__), "placements": placements_of(sd)})
    # every rank's refusals, printed by rank 0
    gathered = [None] * args.world
    dist.all_gather_object(gathered, refused)
    if rank == 0:
        for r, ref in enumerate(gathered):
            for flavour, msg in ref.items():
                print(f"REFUSED {flavour} (rank {r}): {' '.join(msg.split())}", flush=True)
        for flavour, note in notes.items():
            print(f"NOTE {flavour}: {note}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def describe(e):
    """The exception as one line; a CheckpointException by the exception each failing rank raised."""
    from torch.distributed.checkpoint.api import CheckpointException
    if isinstance(e, CheckpointException):
        return "; ".join(f"CheckpointException from rank {r}: {type(x).__name__}: {x}" for r, (x, _) in e.failures.items())
    return f"{type(e).__name__}: {e}"


def write_truth(flat, folder, info):
    import torch
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    tensors = {k: v.detach().contiguous().clone() for k, v in flat.items() if isinstance(v, torch.Tensor)}
    save_file(tensors, os.path.join(folder, "tensors.safetensors"))
    info["nontensor"] = {k: repr(v) for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    info["tensors"] = {k: [str(v.dtype), list(v.shape)] for k, v in tensors.items()}
    with open(os.path.join(folder, "info.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--flavours", default=",".join(FLAVOURS), help="comma-separated: " + ", ".join(FLAVOURS))
    args = p.parse_args()
    os.environ["USE_LIBUV"] = "0"
    os.makedirs(args.out, exist_ok=True)
    gloo_ranks.spawn(worker, args, args.world)


if __name__ == "__main__":
    sys.exit(main())
