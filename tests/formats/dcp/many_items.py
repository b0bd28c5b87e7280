"""A DCP checkpoint with more items than one pickle SETITEMS batch holds (pickle batches 1000), written
at test time by the real torch 1.13 prototype DCP (Debian 12's python3-torch; no process group:
save_state_dict(no_dist=True)), with its truth (tensors.safetensors) written by this script.

    /usr/bin/python3 tests/formats/dcp/many_items.py OUT_DIR N
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts", "fixtures"))

from dcp_fixtures_torch113 import write_safetensors  # noqa: E402  (also makes torch 1.13's DCP importable)

import torch  # noqa: E402
from torch.distributed._shard.checkpoint import FileSystemWriter, save_state_dict  # noqa: E402


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    g = torch.Generator().manual_seed(1000)
    sd = {"t%04d" % i: torch.randn(2, generator=g) for i in range(n)}
    save_state_dict(sd, storage_writer=FileSystemWriter(os.path.join(out, "ckpt"), single_file_per_rank=True),
                    no_dist=True)
    os.makedirs(os.path.join(out, "truth"), exist_ok=True)
    write_safetensors(os.path.join(out, "truth", "tensors.safetensors"), sd)


if __name__ == "__main__":
    main()
