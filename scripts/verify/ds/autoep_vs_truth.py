"""Outside CI: DeepSpeed's universal folder (run_ds_to_universal.py on an AutoEP fixture of
tests/generator/dsgen/autoep.py) against the generator's ground truth, state file by state file: the same
dict keys in the same order and equal tensors (expert weights {param, cat_dim, is_expert_param,
ep_num_experts}; dense {cat_dim, param} for ZeRO-1/2 and the bare 1-D tensor for ZeRO-3).
Usage: autoep_vs_truth.py <ds_universal_step_dir> <generated_fixture_dir>"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "generator"))
import dsgen  # noqa: E402,F401
import torch  # noqa: E402

dsu, gen = sys.argv[1:3]
meta = json.load(open(os.path.join(gen, "truth", "meta.json")))
bad = n = 0
for p in meta["params"]:
    for s in ("fp32", "exp_avg", "exp_avg_sq"):
        a = torch.load(os.path.join(dsu, "zero", p["name"], f"{s}.pt"), weights_only=False)
        b = torch.load(os.path.join(gen, "truth", "universal", "zero", p["name"], f"{s}.pt"), weights_only=False)
        if isinstance(b, dict):
            ok = isinstance(a, dict) and list(a) == list(b) and all(
                (torch.is_tensor(a[k]) and a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])) if torch.is_tensor(b[k])
                else a[k] == b[k] for k in b)
        else:
            ok = torch.is_tensor(a) and a.dtype == b.dtype and torch.equal(a, b)
        n += 1
        if not ok:
            bad += 1
            print("MISMATCH", p["name"], s)
print(f"{os.path.basename(os.path.normpath(gen))}: {n} state files, {bad} differ")
sys.exit(1 if bad else 0)
