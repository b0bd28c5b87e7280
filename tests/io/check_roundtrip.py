"""Loads a file written by ucpkit with Python torch.load and compares it with a JSON truth (truth.py's
encoding). Exit code 0: same objects; 1: differences (printed); 2: could not load.

Usage: /usr/bin/python3 check_roundtrip.py <written.pt> <truth.json> [--prefix NAME]"""
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import json  # noqa: E402

import torch  # noqa: E402

import truth  # noqa: E402  (registers the DeepSpeed stand-ins the file may reference)


def main():
    path, truth_path = sys.argv[1], sys.argv[2]
    prefix = sys.argv[sys.argv.index("--prefix") + 1] if "--prefix" in sys.argv else None
    expected = json.load(open(truth_path))
    problems = []
    if not zipfile.is_zipfile(path):
        problems.append("not a zip file")
    else:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            prefixes = {n.split("/")[0] for n in names}
            if prefix is not None and prefixes != {prefix}:
                problems.append(f"archive prefixes {sorted(prefixes)} != ['{prefix}']")
            storages = [n for n in names if n.split("/")[1:2] == ["data"]]
            if len(storages) != len(expected["storages"]):
                problems.append(f"{len(storages)} storage records, expected {len(expected['storages'])} "
                                "(one per distinct storage)")
            for info in z.infolist():
                if info.compress_type != zipfile.ZIP_STORED:
                    problems.append(f"{info.filename} is compressed")
            bad = z.testzip()
            if bad:
                problems.append(f"CRC mismatch in {bad}")
    try:
        obj = torch.load(path, weights_only=False)
    except Exception as e:  # noqa: BLE001
        print(f"torch.load failed: {type(e).__name__}: {e}")
        return 2
    actual = truth.describe(obj)
    problems += truth.diff(expected["value"], actual["value"], "$")
    problems += truth.diff(expected["storages"], actual["storages"], "storages")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
