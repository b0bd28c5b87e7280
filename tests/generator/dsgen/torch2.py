#!/usr/bin/python3
"""Rewrites a checkpoint made by tests/generator/gen_ds_checkpoint.py into the byte form torch >= 2.0's
torch.save writes (run with Debian's /usr/bin/python3, torch 1.13, which cannot write it itself).

* Every .pt under the checkpoint becomes a torch 2.x zip: records data.pkl, .format_version ("1"),
  .storage_alignment ("64"), byteorder ("little"), data/<key> in key order, version ("3\\n"),
  .data/serialization_id (40 digits), each record's data 64-byte aligned through a 'FB' padding extra
  field (torch/serialization.py _save; caffe2/serialize/inline_container.cc writeRecord,
  writeEndOfFile, writeSerializationId).
* ZeRO-3 optimizer files (`*zero_pp_rank_*_optim_states.pt` with `zero_stage` 3): each
  `fp32_flat_groups` entry is pickled as torch >= 2.0 pickles a tensor carrying Python attributes
  (torch/_tensor.py Tensor.__reduce_ex__): torch._tensor._rebuild_from_type_v2(
  torch._utils._rebuild_tensor_v2, torch.Tensor, args, {'ds_id': '<first>_<last>'}) with
  requires_grad=True in args (DeepSpeed sets both: runtime/zero/stage3.py:1061-1064, :1124-1126;
  ../shared/docs/deepspeed-zero3-format.md section 3). The ds_id values are the sub-group's first and
  last parameter numbers counted over the file's sub-groups (2 parameters assumed per sub-group:
  they are labels, DeepSpeed never reads them back).
Storage sharing and every other value are kept (the file is loaded and saved by torch's own
pickler; only the flat groups' reduction changes).

Usage: torch2.py <checkpoint dir>   (rewrites in place)"""
import io
import os
import struct
import sys
import zipfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from dsgen import stubs  # noqa: E402,F401  (registers the DeepSpeed classes under their real paths)


class AttributedTensor:
    """Pickles as torch >= 2.0 pickles `tensor` with `tensor.__dict__ == state`."""

    def __init__(self, tensor, state):
        self.tensor, self.state = tensor, state

    def __reduce_ex__(self, proto):
        func, args = self.tensor._reduce_ex_internal(proto)  # _rebuild_tensor_v2, (storage, off, size, stride, rg, hooks)
        args = args[:4] + (True,) + args[5:]
        return (torch._tensor._rebuild_from_type_v2, (func, torch.Tensor, args, self.state))


def torch2_zip(pickled_zip, dst):
    """Re-lays the records of a torch 1.13 zip out as torch 2.x writes them."""
    with zipfile.ZipFile(io.BytesIO(pickled_zip)) as z:
        names = z.namelist()
        prefix = names[0].split("/")[0]
        keys = sorted((n[len(prefix) + 6:] for n in names if n.startswith(prefix + "/data/")), key=int)
        records = [("data.pkl", z.read(prefix + "/data.pkl")), (".format_version", b"1"),
                   (".storage_alignment", b"64"), ("byteorder", b"little")]
        records += [("data/" + k, z.read(prefix + "/data/" + k)) for k in keys]
        records.append(("version", b"3\n"))
    name_hash = 0
    for n, _ in records:
        name_hash = (name_hash * 1000003 ^ zlib.crc32(n.encode())) & (2**64 - 1)
    crc = 0
    for _, data in records:
        crc = zlib.crc32(data, crc)
    records.append((".data/serialization_id", f"{name_hash:020d}{crc:020d}".encode()))
    tmp = dst + ".torch2-tmp"
    with open(tmp, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as out:
        for n, data in records:
            info = zipfile.ZipInfo(prefix + "/" + n, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            pad = (-(f.tell() + 30 + len(info.filename) + 4)) % 64
            info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            out.writestr(info, data)
    os.replace(tmp, dst)


def rewrite(path):
    obj = torch.load(path, weights_only=False)
    osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
    if isinstance(osd, dict) and int(osd.get("zero_stage", 0)) == 3 and "fp32_flat_groups" in osd:
        osd["fp32_flat_groups"] = [AttributedTensor(t, {"ds_id": f"{2 * s}_{2 * s + 1}"})
                                   for s, t in enumerate(osd["fp32_flat_groups"])]
    buf = io.BytesIO()
    torch.save(obj, buf)
    torch2_zip(buf.getvalue(), path)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    n = 0
    for root, dirs, files in os.walk(sys.argv[1]):
        dirs[:] = [d for d in dirs if d != "truth"]  # the generator's ground truth stays as it is
        for f in sorted(files):
            if f.endswith(".pt"):
                rewrite(os.path.join(root, f))
                n += 1
    print(f"torch2: rewrote {n} files under {sys.argv[1]}")


if __name__ == "__main__":
    main()
