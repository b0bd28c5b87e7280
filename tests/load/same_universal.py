"""Checks that two universal checkpoints hold the same atomic tensors: every zero/<param>/<state>.pt
of the first must be byte-identical in the second, except where the second is DeepSpeed's ZeRO-3
TP = 1 form (a bare flat fp32 tensor, vocabulary padding kept): then its first numel elements must
equal the first's `param` bit for bit and the rest (padding rows) must be zero.

Usage: /usr/bin/python3 same_universal.py <u1> <u2>   (exit 0 = same)"""
import filecmp
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import dsgen  # noqa: E402,F401  (registers the DeepSpeed stand-in classes)
import torch  # noqa: E402


def main():
    a, b = sys.argv[1], sys.argv[2]
    errors, same_bytes, same_values = [], 0, 0
    for root, _, files in os.walk(os.path.join(a, "zero")):
        for f in sorted(files):
            if f == "optimizer_state.pt":
                continue
            rel = os.path.relpath(os.path.join(root, f), a)
            pb = os.path.join(b, rel)
            if not os.path.exists(pb):
                errors.append(f"{rel}: missing in {b}")
                continue
            if filecmp.cmp(os.path.join(a, rel), pb, shallow=False):
                same_bytes += 1
                continue
            x, y = torch.load(os.path.join(a, rel)), torch.load(pb)
            if f == "step.pt" or not isinstance(x, dict) or not torch.is_tensor(y):
                errors.append(f"{rel}: differs")
                continue
            p = x["param"].reshape(-1)
            if y.dim() != 1 or y.numel() < p.numel() or not torch.equal(
                    y[:p.numel()].view(torch.int32), p.view(torch.int32)) or torch.count_nonzero(y[p.numel():]):
                errors.append(f"{rel}: flat tensor differs from the atomic tensor")
                continue
            same_values += 1
    if errors or same_bytes + same_values == 0:
        print("\n".join(errors[:50]) or "no atomic files")
        sys.exit(1)
    print(f"same_universal: {same_bytes} files byte-identical, {same_values} equal as ZeRO-3 flat tensors")


if __name__ == "__main__":
    main()
