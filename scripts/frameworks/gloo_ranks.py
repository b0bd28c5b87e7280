"""Runs a check's worker on gloo CPU ranks (shared by scripts/frameworks/dcp_train_loop.py, dcp_flavours.py and
ds_train_loop.py): spawn(worker, args, world) calls worker(rank, args, port) in `world` processes, whose
rendezvous is `port` or else a free local TCP port."""
import socket


def spawn(worker, args, world, port=0):
    import torch.multiprocessing as mp

    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    # Forked, not spawned: each rank starts with torch imported (a spawned rank imports it again, 3 s of CPU each);
    # the parent has run no torch code yet, so no thread pool is forked.
    mp.start_processes(worker, args=(args, port), nprocs=world, start_method="fork")
