"""Compare DeepSpeed's universal folder (ds_to_universal of ucp-load's output) with ucp-union's."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dsgen  # noqa: E402,F401
import torch
a, b = sys.argv[1:3]
n = bad = 0
for name in sorted(os.listdir(os.path.join(b, "zero"))):
    d = os.path.join(b, "zero", name)
    if not os.path.isdir(d):
        continue
    for f in sorted(os.listdir(d)):
        x = torch.load(os.path.join(a, "zero", name, f), map_location="cpu")
        y = torch.load(os.path.join(d, f), map_location="cpu")
        px, py = (x["param"], y["param"]) if isinstance(x, dict) else (x, y)
        same = torch.equal(torch.as_tensor(px), torch.as_tensor(py)) if torch.is_tensor(px) or torch.is_tensor(py) else px == py
        if isinstance(x, dict):
            same = same and {k for k in x if k != "param"} == {k for k in y if k != "param"}
        n += 1
        if not same:
            bad += 1
            print("differs:", name, f)
print(f"{n} state files compared, {bad} differ")
sys.exit(1 if bad else 0)
