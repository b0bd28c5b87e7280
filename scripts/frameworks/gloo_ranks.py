"""Runs a check's worker on gloo CPU ranks (shared by scripts/frameworks/dcp_train_loop.py and
dcp_flavours.py): spawn(worker, args, world) calls worker(rank, args, port) in `world` processes, whose
rendezvous is a free local TCP port."""
import socket


def spawn(worker, args, world):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Forked, not spawned: each rank starts with torch imported (a spawned rank imports it again, 3 s of CPU each);
    # the parent has run no torch code yet, so no thread pool is forked.
    mp.start_processes(worker, args=(args, port), nprocs=world, start_method="fork")
