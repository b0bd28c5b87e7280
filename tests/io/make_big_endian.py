"""Writes a torch file as a big-endian host's torch >= 2.1 would, to test ucpkit's byte-order handling
(issue 32, cause 2). torch on this machine is 1.13 (no "byteorder" record, little-endian only), so the
file is assembled from a real torch.save file: each storage record byte-swapped element by element, and
a "byteorder" record b"big" added, which torch/serialization.py `_load` reads and answers with
`storage.byteswap(dtype)` for every storage. Usage: make_big_endian.py OUT_DIR
Writes OUT_DIR/little.pt (the real torch.save file) and OUT_DIR/big.pt (the same tensors, big-endian),
and OUT_DIR/odd.pt (byteorder b"middle", which torch refuses: "Unknown endianness type")."""
import os
import sys
import zipfile

import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
g = torch.Generator().manual_seed(32)
# One storage per tensor, pickled in this order: torch.save gives them keys "0", "1", ... in order.
tensors = {
    "f32": torch.randn(5, 3, generator=g),
    "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
    "f16": torch.randn(4, 2, generator=g).to(torch.float16),
    "i64": torch.arange(-3, 6, dtype=torch.int64) * 1234567891011,
    "i32": torch.arange(10, dtype=torch.int32) * -77777,
    "u8": torch.arange(9, dtype=torch.uint8),
    "b": torch.tensor([True, False, True]),
}
little = os.path.join(out, "little.pt")
torch.save(tensors, little)
width = [t.element_size() for t in tensors.values()]


def rewrite(dst, order):
    with zipfile.ZipFile(little) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        prefix = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            data = zin.read(info.filename)
            rel = info.filename[len(prefix) + 1:]
            if rel.startswith("data/") and order == b"big":
                w = width[int(rel[len("data/"):])]
                data = b"".join(data[i:i + w][::-1] for i in range(0, len(data), w))
            zout.writestr(info.filename, data)
            if rel == "data.pkl":
                zout.writestr(prefix + "/byteorder", order)


rewrite(os.path.join(out, "big.pt"), b"big")
rewrite(os.path.join(out, "odd.pt"), b"middle")
print(",".join(tensors))
