"""Runs a check's worker on gloo CPU ranks (shared by scripts/frameworks/dcp_train_loop.py and
dcp_flavours.py): spawn(worker, args, world) calls worker(rank, args, port) in `world` processes, whose
rendezvous is a free local TCP port."""
import socket


def spawn(worker, args, world):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args, port), nprocs=world)
