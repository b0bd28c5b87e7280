#!/usr/bin/python3
"""The universal checkpoint of an AutoEP ZeRO-3 source against the one of a ZeRO-1/2 source with the
same weights (both written by ucp-union), with Python torch.load only. Expert weights: the same
state files ({param: [E, ...], cat_dim: 0, is_expert_param: True, ep_num_experts: E},
autoep_universal.py:333-338 and ds_to_universal.py:597-608 write the same dict) bit for bit with the
same keys; dense parameters: the same values, as ds_to_universal writes each stage (ZeRO-1/2
{cat_dim: 0, param}, ds_to_universal.py:345-366; ZeRO-3 the bare 1-D tensor, :375-382); step.pt
equal; the same parameter folders. Usage: same_universal.py <zero3_universal> <zero12_universal>"""
import os
import sys

import torch

STATES = ("fp32", "exp_avg", "exp_avg_sq")


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8)


def main():
    z3, z12 = sys.argv[1], sys.argv[2]
    errors = []
    names3 = sorted(os.listdir(os.path.join(z3, "zero")))
    names12 = sorted(os.listdir(os.path.join(z12, "zero")))
    names3 = [n for n in names3 if os.path.isdir(os.path.join(z3, "zero", n))]
    names12 = [n for n in names12 if os.path.isdir(os.path.join(z12, "zero", n))]
    if names3 != names12:
        errors.append(f"parameter folders differ: {sorted(set(names3) ^ set(names12))}")
    experts = 0
    for n in sorted(set(names3) & set(names12)):
        for s in STATES:
            a = torch.load(os.path.join(z3, "zero", n, f"{s}.pt"), weights_only=False)
            b = torch.load(os.path.join(z12, "zero", n, f"{s}.pt"), weights_only=False)
            if isinstance(b, dict) and b.get("is_expert_param"):
                experts += s == "fp32"
                if not isinstance(a, dict) or list(a) != list(b):
                    errors.append(f"{n}/{s}: keys {list(a) if isinstance(a, dict) else type(a)}, expected {list(b)}")
                    continue
                for k in b:
                    same = (torch.is_tensor(a[k]) and a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                            and torch.equal(bits(a[k]), bits(b[k]))) if torch.is_tensor(b[k]) else a[k] == b[k]
                    if not same:
                        errors.append(f"{n}/{s}: {k} differs")
            else:
                if not torch.is_tensor(a) or a.dim() != 1:
                    errors.append(f"{n}/{s}: expected ds_to_universal's stage-3 1-D tensor, got {type(a)}")
                    continue
                if not (a.dtype == b["param"].dtype and torch.equal(bits(a), bits(b["param"]))):
                    errors.append(f"{n}/{s}: values differ")
        sa = torch.load(os.path.join(z3, "zero", n, "step.pt"), weights_only=False)
        sb = torch.load(os.path.join(z12, "zero", n, "step.pt"), weights_only=False)
        if sa != sb:
            errors.append(f"{n}/step.pt: {sa!r} != {sb!r}")
    if experts == 0:
        errors.append("no expert weights compared")
    for e in errors[:20]:
        print("MISMATCH", e)
    if errors:
        sys.exit(1)
    print(f"ok: {len(names3)} parameters, {experts} expert weights")


if __name__ == "__main__":
    main()
