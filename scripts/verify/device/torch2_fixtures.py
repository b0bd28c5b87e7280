"""Writes a few small REAL torch 2.x checkpoints (run with a torch >= 2.0, e.g. the GPU machine's
torch 2.11) and, beside each, its ground truth made by tests/io/truth.py under that same torch, plus
what a reader must keep that truth.py does not encode (tensor attributes) and a pickletools listing.

    python3 scripts/verify/device/torch2_fixtures.py OUT_DIR

Each construct is the one torch 2.x itself emits (no opcode assembly here): tensors with Python
attributes (torch/_tensor.py __reduce_ex_internal -> _rebuild_from_type_v2), Parameters with state
(_rebuild_parameter_with_state), bf16, meta tensors (_rebuild_meta_tensor_no_storage), numpy RNG
state, TorchVersion, bytes, and a DeepSpeed ZeRO-3 optimizer file laid out as
../shared/docs/deepspeed-zero3-format.md section 3 describes (fp32_flat_groups carrying ds_id).
"""
import collections
import io
import json
import os
import pickletools
import random
import sys
import zipfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "io"))
import truth  # noqa: E402  (registers the DeepSpeed stand-ins under their real module paths)


def attrs_of(o, path="$", out=None):
    """Paths of tensors that carry Python attributes, with those attributes (truth.py drops them)."""
    out = {} if out is None else out
    if isinstance(o, torch.Tensor):
        d = {k: v for k, v in getattr(o, "__dict__", {}).items()}
        if d:
            out[path] = {k: repr(v) for k, v in d.items()}
    elif isinstance(o, dict):
        for i, (k, v) in enumerate(o.items()):
            attrs_of(v, f"{path}[{k!r}]", out)
    elif isinstance(o, (list, tuple)):
        for i, v in enumerate(o):
            attrs_of(v, f"{path}[{i}]", out)
    return out


class Encoder(truth.Encoder):
    """truth.Encoder, plus meta tensors (no storage: dtype, shape, strides only), with storages told
    apart by torch 2.x's untyped storage (TypedStorage has no `_storage` there)."""

    def storage_index(self, t):
        if not hasattr(t, "untyped_storage"):  # torch 1.x
            return super().storage_index(t)
        key = t.untyped_storage()._cdata
        if key not in self.storage_ids:
            self.storage_ids[key] = len(self.storages)
            self.storages.append({"dtype": truth.dtype_name(t.dtype), "numel": t.untyped_storage().nbytes() // t.element_size(),
                                  "hex": truth.storage_bytes(t).hex()})
        return self.storage_ids[key]

    def encode(self, o):
        if isinstance(o, torch.Tensor) and o.device.type == "meta":
            return {"t": "tensor", "device": "meta", "dtype": truth.dtype_name(o.dtype), "shape": list(o.shape),
                    "strides": list(o.stride()), "requires_grad": bool(o.requires_grad)}
        return super().encode(o)


def describe(obj):
    enc = Encoder()
    return {"value": enc(obj), "storages": enc.storages}


def zero3_optimizer_state(dp_rank=0, dp=2):
    """ZeRO-3 `[bf16_]zero_pp_rank_<d>_mp_rank_00_optim_states.pt` (deepspeed-zero3-format.md s.3)."""
    g = torch.Generator().manual_seed(7 + dp_rank)
    flats, state = [], collections.OrderedDict()
    for s, n in enumerate((37, 12)):
        flat = torch.randn(n, generator=g, dtype=torch.float32)
        flat.requires_grad = True                      # stage3.py:1124-1126
        flat.ds_id = f"{2 * s}_{2 * s + 1}"            # stage3.py:1061-1064
        flats.append(flat)
        state[s] = {"step": 5, "exp_avg": torch.randn(n, generator=g), "exp_avg_sq": torch.rand(n, generator=g)}
    osd = collections.OrderedDict()
    osd["zero_stage"] = truth.ZeroStageEnum.weights
    osd["loss_scaler"] = truth.LossScaler(1.0)
    osd["dynamic_loss_scale"] = False
    osd["overflow"] = False
    osd["partition_count"] = dp
    osd["optimizer_state_dict"] = {"state": state, "param_groups": [
        {"weight_decay": 0.01, "lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "step": 0, "params": [0, 1]}]}
    osd["fp32_flat_groups"] = flats
    return {"optimizer_state_dict": osd, "ds_config": {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}},
            "ds_version": "0.16.5"}


def values():
    g = torch.Generator().manual_seed(1)
    attr = torch.randn(6, generator=g)
    attr.ds_id = "0_29"
    attr_grad = torch.randn(5, generator=g).requires_grad_(True)
    attr_grad.ds_id = "3_4"
    attr_grad.ds_shape = torch.Size([5])
    p = torch.nn.Parameter(torch.randn(2, 3, generator=g))
    pst = torch.nn.Parameter(torch.randn(4, generator=g).to(torch.bfloat16))
    pst.allreduce = False                               # deepspeed/moe/experts.py:25-26
    pst.group_name = "ep_size_2"
    np.random.seed(3)
    random.seed(4)
    torch.manual_seed(5)
    return {
        "tensors_with_attributes": {"plain_attr": attr, "grad_attr": attr_grad,
                                    "view_of_attr": attr[2:5]},
        "parameters": collections.OrderedDict([("param", p), ("param_with_state", pst)]),
        "bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "meta": torch.empty(2, 3, device="meta"),
        "rng": {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                "torch_rng_state": torch.get_rng_state()},
        "torch_version": torch.__version__,
        "bytes": b"\x00\x01binary\xff",
        "empty_bytes": b"",
        "numpy_scalar": np.float64(2.5),
    }


def save(obj, path, **kw):
    torch.save(obj, path, **kw)
    with open(path + ".truth.json", "w") as f:
        json.dump({"torch": torch.__version__, "numpy": np.__version__, "truth": describe(obj),
                   "tensor_attrs": attrs_of(obj)}, f, indent=0)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            pkl = z.read([n for n in names if n.endswith("/data.pkl")][0])
        with open(path + ".records.txt", "w") as f:
            f.write("\n".join(names) + "\n")
    else:
        names, pkl = [], b""
    if pkl:
        s = io.StringIO()
        pickletools.dis(pkl, out=s)
        with open(path + ".pickletools.txt", "w") as f:
            f.write(s.getvalue())


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    v = values()
    meta = v.pop("meta")
    save(v, os.path.join(out, "torch2_values.pt"))
    save({"meta": meta, "real": torch.ones(2)}, os.path.join(out, "torch2_meta.pt"))
    save(v, os.path.join(out, "torch2_values_legacy.pt"), _use_new_zipfile_serialization=False)
    save(zero3_optimizer_state(0), os.path.join(out, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(f"Made by scripts/verify/device/torch2_fixtures.py with torch {torch.__version__}, numpy {np.__version__}, "
                f"Python {sys.version.split()[0]}.\n"
                "Each X.pt has X.pt.truth.json (tests/io/truth.py `describe` under that torch, plus tensor "
                "attributes), X.pt.records.txt (zip record names) and X.pt.pickletools.txt (data.pkl disassembly).\n")


if __name__ == "__main__":
    main()
