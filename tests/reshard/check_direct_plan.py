"""Checks `ucp-load --plan` on a native input (issue 18) against a universal checkpoint of the same
source: every source run [file, byte offset, bytes, first element] of every atomic tensor must hold,
read straight from the source file, exactly those elements of the universal tensor (torch.load of
zero/<param>/<state>.pt); the runs of a non-joined tensor must cover it exactly once; the totals
must add up. With a target folder written from the same source and options, every `copies` entry
[source file, source offset, source bytes, record, record offset, record bytes] of every target file
is checked against the bytes actually written: the record is read with zipfile from the target
file, the source range straight from the source file, converted fp32 -> the record's dtype with
torch (round to nearest even, as torch.Tensor.to), and the two must be equal byte for byte; the
copies of a record must not overlap and the totals must add up.
Usage: check_direct_plan.py plan.json universal_dir [target_dir]"""
import zipfile
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401  (registers the DeepSpeed stand-in classes)
import torch  # noqa: E402


def check_targets(plan, target):
    files = plan["source_files"]
    checked = copied_src = copied_dst = joined = zero = 0
    for t in plan["targets"]:
        with zipfile.ZipFile(os.path.join(target, t["file"])) as z:
            data = {name: z.read(name) for name in t["records"]}
        covered = {name: np.zeros(r["bytes"], dtype=np.int8) for name, r in t["records"].items()}
        for f, soff, sbytes, rec, toff, tbytes in t["copies"]:
            assert 0 <= toff and toff + tbytes <= len(data[rec]), (t["file"], rec, toff, tbytes)
            covered[rec][toff:toff + tbytes] += 1
            if f < 0:
                joined += tbytes
                continue
            copied_src += sbytes
            copied_dst += tbytes
            with open(files[f], "rb") as fh:
                fh.seek(soff)
                raw = fh.read(sbytes)
            dtype = getattr(torch, t["records"][rec]["dtype"])
            want = torch.frombuffer(bytearray(raw), dtype=torch.float32).to(dtype)
            want = want.view(torch.uint8).numpy().tobytes()
            assert want == data[rec][toff:toff + tbytes], (t["file"], rec, toff, files[f], soff)
            checked += 1
        for rec, c in covered.items():
            assert c.max(initial=0) <= 1, (t["file"], rec, "copies overlap")
            # Bytes no copy names are zeros (padding, gaps between parameters) or joined parameters.
            body = np.frombuffer(data[rec], dtype=np.uint8)
            assert not body[c == 0].any(), (t["file"], rec, "a byte outside every copy is not zero")
            zero += int((c == 0).sum())
    tot = plan["totals"]
    assert (copied_src, copied_dst, joined, zero) == (tot["copied_source_bytes"], tot["copied_target_bytes"],
                                                      tot["joined_target_bytes"], tot["zero_target_bytes"]), tot
    assert checked == tot["copies"] - sum(1 for t in plan["targets"] for c in t["copies"] if c[0] < 0)
    assert checked > 0
    return checked


def main(plan_path, universal, target=None):
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
    msg = f"check_direct_plan: {len(plan['tensors'])} tensors, {plan['totals']['source_runs']} runs OK"
    if target:
        msg += f"; {check_targets(plan, target)} copies equal the written target bytes"
    print(msg)


if __name__ == "__main__":
    main(*sys.argv[1:])
