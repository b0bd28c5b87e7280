"""Shared by fixtures.py and check_roundtrip.py: DeepSpeed stand-in classes registered under their
real module paths, and `encode`, which describes a Python object as JSON (the ground truth the C++
tests compare the reader's value tree with, and that check_roundtrip.py compares reloaded files
with). Written only against Python/torch; nothing here knows about ucpkit."""
import collections
import copyreg
import enum
import json
import struct
import sys
import types
from dataclasses import dataclass
from typing import List, Tuple, Union

import numpy as np

sys.setrecursionlimit(20000)
import torch


# ---------------- DeepSpeed stand-ins (same class paths and fields as DeepSpeed 0.16) ----------------

def _module(path):
    parts = path.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[name])
    return sys.modules[path]


@dataclass
class fragment_address:  # noqa: N801
    numel: int
    start: int


class ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


class LossScalerBase:
    def __init__(self, cur_scale):
        self.cur_scale = cur_scale
        self.dynamic = False


class LossScaler(LossScalerBase):
    def __init__(self, scale=1):
        super().__init__(scale)


class DynamicLossScaler(LossScalerBase):
    def __init__(self, init_scale=2**16, scale_factor=2.0, scale_window=1000, min_scale=1, delayed_shift=1,
                 consecutive_hysteresis=False, raise_error_at_min_scale=True, dtype=torch.half):
        super().__init__(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.dynamic = True
        self.dtype = dtype


@dataclass
class SubparamShape:
    patterns: List[str]
    shape: Tuple[Union[Tuple[int], int]]
    partition_dim: int


for _cls, _path in [(fragment_address, "deepspeed.utils.tensor_fragment"),
                    (ZeroStageEnum, "deepspeed.runtime.zero.config"),
                    (LossScalerBase, "deepspeed.runtime.fp16.loss_scaler"),
                    (LossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                    (DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                    (SubparamShape, "deepspeed.checkpoint.universal_checkpoint")]:
    _cls.__module__ = _path
    _cls.__qualname__ = _cls.__name__
    setattr(_module(_path), _cls.__name__, _cls)


class Py310Pickler:
    """A pickle module for torch.save whose Pickler writes int enums as `cls(value)`, as Python <= 3.10
    does (3.11 writes `getattr(cls, name)`); real DeepSpeed checkpoints contain both forms."""
    import pickle as _pickle

    class Pickler(_pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, enum.Enum):
                return type(obj), (obj._value_,)
            return NotImplemented

    Unpickler = _pickle.Unpickler
    load = _pickle.load
    dump = _pickle.dump


# ---------------- encoding ----------------

def encode_long(x):
    """Python pickle's little-endian two's complement encoding (LONG1 payload)."""
    if x == 0:
        return b""
    nbytes = (x.bit_length() >> 3) + 1
    result = x.to_bytes(nbytes, byteorder="little", signed=True)
    if x < 0 and nbytes > 1 and result[-1] == 0xFF and (result[-2] & 0x80) != 0:
        result = result[:-1]
    return result


def qualname(obj):
    return f"{obj.__module__}.{obj.__qualname__}"


def dtype_name(dt):
    return str(dt).replace("torch.", "")


def tensor_bytes(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def storage_bytes(t):
    st = t.storage()
    full = torch.empty(0, dtype=t.dtype).set_(st, 0, (st.size(),), (1,))
    return tensor_bytes(full)


class Encoder:
    """Encodes one object tree; storages are numbered in first-encounter order of a depth-first walk
    that visits containers in pickling order, so two trees with the same sharing get the same numbers."""

    def __init__(self):
        self.storage_ids = {}
        self.storages = []
        self.active = set()

    def storage_index(self, t):
        key = t.storage()._storage._cdata
        if key not in self.storage_ids:
            self.storage_ids[key] = len(self.storages)
            self.storages.append({"dtype": dtype_name(t.dtype), "numel": t.storage().size(),
                                  "hex": storage_bytes(t).hex()})
        return self.storage_ids[key]

    def __call__(self, o):
        if id(o) in self.active:
            raise ValueError("cycle")
        if isinstance(o, (list, tuple, dict, set, frozenset)) or hasattr(o, "__dict__"):
            self.active.add(id(o))
            try:
                return self.encode(o)
            finally:
                self.active.discard(id(o))
        return self.encode(o)

    def encode(self, o):
        if o is None:
            return {"t": "none"}
        if isinstance(o, bool):
            return {"t": "bool", "v": o}
        if isinstance(o, enum.Enum) and isinstance(o, int):
            return {"t": "enum", "class": qualname(type(o)), "int": int(o._value_), "name": o._name_}
        if isinstance(o, int):
            r = {"t": "int", "v": str(o), "le": encode_long(o).hex()}
            if -2**63 <= o < 2**63:
                r["i"] = o
            return r
        if isinstance(o, float):
            return {"t": "float", "hex": struct.pack("<d", o).hex(), "repr": repr(o)}
        if isinstance(o, str):
            return {"t": "str", "v": o}
        if isinstance(o, bytes):
            return {"t": "bytes", "hex": o.hex()}
        if isinstance(o, torch.Size):
            return {"t": "shape", "v": list(o)}
        if isinstance(o, torch.dtype):
            return {"t": "dtype", "v": dtype_name(o)}
        if isinstance(o, torch.Tensor):
            return {"t": "tensor", "dtype": dtype_name(o.dtype), "shape": list(o.shape),
                    "strides": list(o.stride()), "offset": o.storage_offset(),
                    "requires_grad": bool(o.requires_grad), "parameter": isinstance(o, torch.nn.Parameter),
                    "storage": self.storage_index(o), "hex": tensor_bytes(o).hex()}
        if isinstance(o, dict):
            r = {"t": "dict", "ordered": isinstance(o, collections.OrderedDict),
                 "entries": [[self(k), self(v)] for k, v in o.items()]}
            attrs = getattr(o, "__dict__", None)
            if attrs:
                r["attrs"] = self(dict(attrs))
            return r
        if isinstance(o, list):
            return {"t": "list", "items": [self(x) for x in o]}
        if isinstance(o, tuple) and type(o) is tuple:
            return {"t": "tuple", "items": [self(x) for x in o]}
        if isinstance(o, (set, frozenset)):
            # iteration order of str sets changes between processes (hash seed): sort canonically
            items = sorted((self(x) for x in o), key=lambda e: json.dumps(e, sort_keys=True))
            return {"t": "set" if isinstance(o, set) else "frozenset", "items": items}
        if isinstance(o, (type, types.FunctionType, types.BuiltinFunctionType)):
            return {"t": "global", "v": qualname(o)}
        return self.encode_object(o)

    def encode_object(self, o):
        r = o.__reduce_ex__(2)
        if isinstance(r, str):
            raise ValueError(f"cannot encode {o!r}")
        func, args = r[0], r[1]
        state = r[2] if len(r) > 2 else None
        out = {"t": "object"}
        if func is copyreg.__newobj__:
            out["class"] = qualname(args[0])
            out["newobj"] = True
            out["args"] = [self(a) for a in args[1:]]
        else:
            out["class"] = qualname(func)
            out["newobj"] = False
            out["args"] = [self(a) for a in args]
        if state is not None:
            out["state"] = self(state)
        if isinstance(o, np.ndarray):  # convenient for the C++ side and for messages
            out["ndarray"] = {"dtype": str(o.dtype), "shape": list(o.shape), "hex": o.tobytes().hex()}
        return out


def describe(obj):
    enc = Encoder()
    value = enc(obj)
    return {"value": value, "storages": enc.storages}


# ---------------- comparison (Python side of the round trip) ----------------

def diff(a, b, path="$", out=None, limit=50):
    """Differences between two encodings (lists of messages)."""
    if out is None:
        out = []
    if len(out) >= limit:
        return out
    if type(a) != type(b):
        out.append(f"{path}: {a!r:.200} != {b!r:.200}")
    elif isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k == "repr":  # informative only
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'expected' if k in a else 'actual'}")
            else:
                diff(a[k], b[k], f"{path}.{k}", out, limit)
    elif isinstance(a, list):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out, limit)
    elif a != b:
        out.append(f"{path}: {a!r:.200} != {b!r:.200}")
    return out
