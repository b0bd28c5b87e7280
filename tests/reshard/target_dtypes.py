"""Prints the dtypes of the weights a DeepSpeed checkpoint folder holds, read with torch.load (not our
reader): every floating tensor of every *model_states.pt under `module` (mp_rank files), or at the top
level (expert and layer files). Output: one line, the sorted dtype names ("torch.float16").
Usage: target_dtypes.py <tag folder>"""
import glob
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import torch  # noqa: E402
from dsgen import stubs  # noqa: E402,F401  (classes the pickles name)
from dsgen.writer import _tensors as tensors  # noqa: E402  (every tensor of a nested dict / list)


def main(folder):
    seen = set()
    for path in sorted(glob.glob(os.path.join(folder, "*model_states.pt"))):
        sd = torch.load(path, map_location="cpu")
        root = sd.get("module", sd) if os.path.basename(path).startswith("mp_rank_") else sd
        for t in tensors(root):
            if t.is_floating_point() and t.numel() > 0:
                seen.add(str(t.dtype))
    print(" ".join(sorted(seen)))


if __name__ == "__main__":
    main(sys.argv[1])
