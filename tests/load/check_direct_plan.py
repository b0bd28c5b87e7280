"""Checks `ucp-load --plan` on a native input (issue 18) against a universal checkpoint of the same
source: every source run [file, byte offset, bytes, first element] of every atomic tensor must hold,
read straight from the source file, exactly those elements of the universal tensor (torch.load of
zero/<param>/<state>.pt); the runs of a non-joined tensor must cover it exactly once; the totals
must add up. Usage: check_direct_plan.py plan.json universal_dir"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import dsgen  # noqa: E402,F401  (registers the DeepSpeed stand-in classes)
import torch  # noqa: E402


def main(plan_path, universal):
    plan = json.load(open(plan_path))["direct"]
    files = plan["source_files"]
    total = 0
    for t in plan["tensors"]:
        total += sum(r[2] for r in t["runs"])
        if t["joined"]:
            continue
        folder = t["param"].replace("/", "_")  # ucp::param_folder for the names used here
        st = torch.load(os.path.join(universal, "zero", folder, t["state"] + ".pt"))
        ten = st["param"] if isinstance(st, dict) else st
        flat = ten.reshape(-1).float().numpy()
        covered = np.zeros(t["elements"], dtype=np.int32)
        for f, off, nbytes, u in t["runs"]:
            with open(files[f], "rb") as fh:
                fh.seek(off)
                got = np.frombuffer(fh.read(nbytes), dtype=np.float32)
            n = nbytes // 4
            assert np.array_equal(got.view(np.uint32), flat[u:u + n].view(np.uint32)), (t["param"], t["state"], u)
            covered[u:u + n] += 1
        assert (covered == 1).all(), (t["param"], t["state"], "not covered exactly once")
    assert total == plan["totals"]["source_bytes_read"], (total, plan["totals"])
    assert plan["totals"]["target_files"] == len(plan["targets"]) > 0
    print(f"check_direct_plan: {len(plan['tensors'])} tensors, {plan['totals']['source_runs']} runs OK")


if __name__ == "__main__":
    main(*sys.argv[1:])
