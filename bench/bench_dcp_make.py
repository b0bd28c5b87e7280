"""Writes a DCP checkpoint for bench/bench_dcp.sh with the real torch.distributed.checkpoint.save.

Runs inside the trixie chroot (torch 2.6, gloo CPU ranks): a Llama-like state dict laid out as
get_state_dict(model, optimizer) gives it for FSDP2 ({"model": {fqn: DTensor Shard(0)}, "optim":
{"state": {fqn: {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [...]}}), every tensor a DTensor
row-sharded over --world ranks (DTensor.from_local), filled with seeded random values; no optimizer is
run (the bench measures conversion, not training).

    python3 bench_dcp_make.py OUT --world 2 --dim 2048 --hidden 5632 --layers 6 --vocab 32000
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard


def shapes(o):
    s = {"tok_embeddings.weight": (o.vocab, o.dim)}
    for layer in range(o.layers):
        p = f"layers.{layer}."
        s[p + "attention.wq.weight"] = (o.dim, o.dim)
        s[p + "attention.wk.weight"] = (o.dim // 4, o.dim)
        s[p + "attention.wv.weight"] = (o.dim // 4, o.dim)
        s[p + "attention.wo.weight"] = (o.dim, o.dim)
        s[p + "feed_forward.w1.weight"] = (o.hidden, o.dim)
        s[p + "feed_forward.w2.weight"] = (o.dim, o.hidden)
        s[p + "feed_forward.w3.weight"] = (o.hidden, o.dim)
        s[p + "attention_norm.weight"] = (o.dim,)
        s[p + "ffn_norm.weight"] = (o.dim,)
    s["norm.weight"] = (o.dim,)
    s["output.weight"] = (o.vocab, o.dim)
    return s


def run(rank, world, port, o):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1000 + rank)

    def sharded(shape):
        rows = shape[0] // world  # sizes are multiples of world
        local = torch.randn((rows,) + tuple(shape[1:]), generator=g)
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                  stride=torch.empty(shape, device="meta").stride())

    def over(t):  # another DTensor over the same local shard
        return DTensor.from_local(t.to_local(), mesh, [Shard(0)], run_check=False, shape=t.shape, stride=t.stride())

    model, state = {}, {}
    for name, shape in shapes(o).items():
        model[name] = sharded(shape)
        if o.share:
            state[name] = {"step": torch.tensor(1.0), "exp_avg": over(model[name]), "exp_avg_sq": over(model[name])}
        else:
            state[name] = {"step": torch.tensor(1.0), "exp_avg": sharded(shape), "exp_avg_sq": sharded(shape).abs()}
    groups = [{"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "params": list(model)}]
    dcp.save({"model": model, "optim": {"state": state, "param_groups": groups}}, checkpoint_id=o.out)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=5632)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--port", type=int, default=29531)
    p.add_argument("--share", action="store_true")
    o = p.parse_args()
    mp.spawn(run, args=(o.world, o.port, o), nprocs=o.world, join=True)


if __name__ == "__main__":
    main()
