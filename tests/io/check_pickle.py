"""Independent reader for tests/io/pickle/pickler_test.cpp: loads a pickle written by ucpkit's pickler with
Python's own pickle module (or, with --torch, a torch.save file with torch.load) as `x`, then
evaluates every line of <checks> (a Python expression that must be true, e.g. `x['a'] is x['b']`).
Exit 0: all true; 1: the false ones printed; 2: the file could not be loaded.

Usage: /usr/bin/python3 check_pickle.py <file> <checks> [--torch]"""
import pickle
import sys


def main():
    path, checks = sys.argv[1], sys.argv[2]
    try:
        if "--torch" in sys.argv[3:]:
            import torch
            x = torch.load(path, weights_only=False)
        else:
            with open(path, "rb") as f:
                x = pickle.load(f)
                if f.read():
                    print("bytes after the STOP opcode")
                    return 1
    except Exception as e:  # noqa: BLE001
        print(f"load failed: {type(e).__name__}: {e}")
        return 2
    # `raw` (the file's bytes) and `pickletools` let a check look at the opcodes written.
    import pickletools
    env = {"x": x, "raw": open(path, "rb").read(), "pickletools": pickletools}
    if "--torch" in sys.argv[3:]:
        env["torch"] = torch
    bad = 0
    lines = [ln for ln in open(checks).read().splitlines() if ln.strip()]
    for line in lines:
        try:
            ok = eval(line, env)  # noqa: S307 (the test's own expressions)
        except Exception as e:  # noqa: BLE001
            ok, line = False, f"{line}  ({type(e).__name__}: {e})"
        if ok is not True:
            bad += 1
            if bad <= 20:
                print(f"false: {line}")
    if bad:
        return 1
    print(f"check_pickle: {len(lines)} checks true")
    return 0


if __name__ == "__main__":
    sys.exit(main())
