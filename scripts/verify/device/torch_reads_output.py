"""torch 2.x (the GPU machine's) reads what ucp-load wrote, with DeepSpeed's classes stood in under
their real module paths (tests/io/truth.py), and checks the fp32 / exp_avg / exp_avg_sq partitions of
each rank against the CRC-32s `ucp-load --device cuda --json` reported for the bytes it put on the GPU.

    python3 scripts/verify/device/torch_reads_output.py CPU_OUTPUT_DIR rank0.json [rank1.json ...]
Exit 0 when every file loads and every CRC matches."""
import glob
import json
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "io"))
import truth  # noqa: E402,F401  (DeepSpeed stand-ins)
import torch  # noqa: E402


def crc(t, nbytes):
    b = t.detach().contiguous().view(torch.uint8).numpy().tobytes()
    return zlib.crc32(b + bytes(max(0, nbytes - len(b)))) & 0xFFFFFFFF


def main():
    out, reports = sys.argv[1], sys.argv[2:]
    files = sorted(glob.glob(os.path.join(out, "**", "*.pt"), recursive=True))
    ntensors = 0
    for f in files:
        sd = torch.load(f, map_location="cpu", weights_only=False)
        stack = [sd]
        while stack:
            o = stack.pop()
            if isinstance(o, torch.Tensor):
                ntensors += 1
            elif isinstance(o, dict):
                stack.extend(o.values())
            elif isinstance(o, (list, tuple)):
                stack.extend(o)
    print(f"torch {torch.__version__} loaded {len(files)} files, {ntensors} tensors")
    bad = 0
    for r, rep in enumerate(reports):
        crcs = json.load(open(rep))["partition_crc32"]
        f = glob.glob(os.path.join(out, "**", f"*zero_pp_rank_{r}_mp_rank_00_optim_states.pt"), recursive=True)[0]
        osd = torch.load(f, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        flats = osd["single_partition_of_fp32_groups"]
        state = osd["base_optimizer_state"]["state"]
        mine = []
        for g, flat in enumerate(flats):
            n = state[g]["exp_avg"].numel() * 4
            mine += [crc(flat, n), crc(state[g]["exp_avg"], n), crc(state[g]["exp_avg_sq"], n)]
        ok = mine == crcs
        bad += not ok
        print(f"rank {r}: {len(crcs)} partition CRCs from the GPU {'equal' if ok else 'DIFFER from'} torch's read of {os.path.basename(f)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
