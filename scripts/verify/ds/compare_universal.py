"""Compare DeepSpeed's universal folder (ds_to_universal of ucp-load's output) with ucp-union's."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "generator"))
import dsgen  # noqa: E402,F401
import torch
a, b = sys.argv[1:3]
n = bad = no_step = 0
for name in sorted(os.listdir(os.path.join(b, "zero"))):
    d = os.path.join(b, "zero", name)
    if not os.path.isdir(d):
        continue
    for f in sorted(os.listdir(d)):
        if f == "step.pt" and not os.path.exists(os.path.join(a, "zero", name, f)):
            no_step += 1  # ds_to_universal writes no step.pt for ZeRO-3 (formats.md section 2)
            continue
        x = torch.load(os.path.join(a, "zero", name, f), map_location="cpu", weights_only=False)
        y = torch.load(os.path.join(d, f), map_location="cpu", weights_only=False)
        px = x["param"] if isinstance(x, dict) else x
        py = y["param"] if isinstance(y, dict) else y
        if isinstance(x, dict) and isinstance(y, dict):
            same = {k for k in x if k != "param"} == {k for k in y if k != "param"}
        else:
            same = True
        if torch.is_tensor(px) and torch.is_tensor(py) and (isinstance(x, dict) != isinstance(y, dict)):
            # ds_to_universal's ZeRO-3 TP = 1 form: a bare flat tensor, vocabulary padding rows kept
            # (zeros written by ucp-load) after the rows the dict form keeps.
            fx, fy = px.reshape(-1), py.reshape(-1)
            long, short = (fx, fy) if fx.numel() >= fy.numel() else (fy, fx)
            same = torch.equal(long[:short.numel()], short) and not torch.count_nonzero(long[short.numel():])
        elif torch.is_tensor(px) or torch.is_tensor(py):
            same = same and torch.equal(torch.as_tensor(px), torch.as_tensor(py))
        else:
            same = same and px == py
        n += 1
        if not same:
            bad += 1
            print("differs:", name, f)
print(f"{n} state files compared, {bad} differ" + (f" ({no_step} step.pt not written by DeepSpeed)" if no_step else ""))
sys.exit(1 if bad else 0)
