"""Independent safetensors reader for the ucp-load export test: parses the format by hand (8-byte
little-endian header length, JSON header, raw little-endian bytes) and compares every tensor with
the universal checkpoint's fp32 weights converted by torch to the requested dtype. <universal_dir> may
also be a dsgen ground truth's universal folder (<truth>/universal, names from <truth>/meta.json).
Usage: /usr/bin/python3 read_safetensors.py <export_dir> <universal_dir> <bf16|fp16|fp32>"""
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401

DT = {"bf16": (torch.bfloat16, "BF16", 2), "fp16": (torch.float16, "F16", 2), "fp32": (torch.float32, "F32", 4)}


def main():
    out, uni, dt = sys.argv[1:4]
    tdtype, tag, size = DT[dt]
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    listing = os.path.join(uni, "manifest.json")
    if not os.path.exists(listing):  # dsgen's ground truth
        listing = os.path.join(uni, "..", "meta.json")
    names = [p["name"] for p in json.load(open(listing))["params"]]
    errors = []
    if sorted(index["weight_map"]) != sorted(names):
        errors.append("index weight_map names differ from the manifest")
    total = 0
    for fn in sorted(set(index["weight_map"].values())):
        raw = open(os.path.join(out, fn), "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        base = 8 + n
        for name, e in header.items():
            if name == "__metadata__":
                continue
            if index["weight_map"].get(name) != fn:
                errors.append(f"{name}: index says {index['weight_map'].get(name)}, found in {fn}")
            a, b = e["data_offsets"]
            if e["dtype"] != tag:
                errors.append(f"{name}: dtype {e['dtype']}")
                continue
            t = torch.frombuffer(bytearray(raw[base + a:base + b]), dtype=tdtype).reshape(e["shape"])
            total += b - a
            ref = torch.load(os.path.join(uni, "zero", name, "fp32.pt"), weights_only=False)["param"].to(tdtype)
            if not torch.equal(t, ref):
                errors.append(f"{name}: values differ")
    if total != index["metadata"]["total_size"]:
        errors.append(f"total_size {index['metadata']['total_size']} vs {total}")
    if errors:
        print("\n".join(errors[:30]))
        sys.exit(1)
    print(f"read_safetensors: {len(names)} tensors equal")


if __name__ == "__main__":
    main()
