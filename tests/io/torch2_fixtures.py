"""torch >= 2.0 constructs that Debian's torch 1.13 cannot write, assembled for the lib/io tests
(called by fixtures.py). The pickles are written by torch 1.13's own torch.save (so persistent ids,
memo and protocol are what torch writes: protocol 2, ('storage', storage_type, key, location, numel)),
with objects whose __reduce_ex__ returns exactly the reduction torch 2.x returns; functions torch 1.13
lacks are stand-ins registered under the real module paths, so the GLOBAL opcodes name the real ones.
Ground truth comes from the torch 1.13 tensors the records were made from (truth.py).

* torch2_v3.pt: torch._utils._rebuild_tensor_v3(untyped storage, offset, size, stride, requires_grad,
  OrderedDict(), dtype) -- torch/_tensor.py _reduce_ex_internal (v3 path: UntypedStorage, dtype
  appended), torch/_utils.py _rebuild_tensor_v3. torch emits it for the dtypes TypedStorage cannot
  name; here with bfloat16 (a dtype ucpkit knows) to check the reading.
* torch2_v3_float8.pt: the same with dtype torch.float8_e4m3fn (refused by name).
* torch2_layout.pt: torch.strided as torch pickles layouts, torch.serialization._get_layout('torch.strided')
  (torch/serialization.py registers it with copyreg).
* torch2_qtensor.pt / torch2_nested.pt / torch2_wrapper.pt / torch2_sparse.pt: tensors ucpkit cannot
  represent: _rebuild_qtensor (a real torch 1.13 quantized tensor), _rebuild_nested_tensor,
  _rebuild_wrapper_subclass and _rebuild_sparse_tensor (a real sparse COO tensor), each must be refused
  with an error naming the construct."""
import collections
import json
import os
import shutil
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import truth  # noqa: E402


def stand_in(module, name):
    """A function pickled as GLOBAL '<module> <name>' (for torch functions 1.13 does not have)."""
    mod = sys.modules[module]
    if hasattr(mod, name):
        return getattr(mod, name)
    f = types.FunctionType((lambda *a: None).__code__, {}, name)
    f.__module__, f.__qualname__ = module, name
    setattr(mod, name, f)
    return f


class Reduced:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce_ex__(self, proto):
        return (self.func, self.args)


def v3(t, dtype):
    """t pickled as torch >= 2.1 pickles a tensor of a 'new' dtype (untyped storage + dtype)."""
    untyped = t.storage().untyped()
    return Reduced(stand_in("torch._utils", "_rebuild_tensor_v3"),
                   (untyped, t.storage_offset(), tuple(t.size()), t.stride(), t.requires_grad,
                    collections.OrderedDict(), dtype))


def main(out):
    def path(n):
        return os.path.join(out, n + ".pt")

    bf = torch.tensor([1.5, -2.0, 3.25, 0.5, 7.0, -0.125], dtype=torch.bfloat16)
    view = bf[1:5].view(2, 2)
    truth_obj = {"v3": view, "plain": torch.arange(3, dtype=torch.float32)}
    torch.save({"v3": v3(view, torch.bfloat16), "plain": truth_obj["plain"]}, path("torch2_v3"))
    d = truth.describe(truth_obj)
    d.update(container="zip", prefix="torch2_v3", file="torch2_v3.pt")
    json.dump(d, open(os.path.join(out, "torch2_v3.json"), "w"))

    torch.save({"f8": v3(bf, stand_in("torch", "float8_e4m3fn"))}, path("torch2_v3_float8"))
    torch.save({"layout": torch.strided, "t": torch.ones(2)}, path("torch2_layout"))
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.5, 0, torch.quint8)
    torch.save({"q": q}, path("torch2_qtensor"))
    torch.save({"s": torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))}, path("torch2_sparse"))
    vals = torch.arange(4, dtype=torch.float32)
    torch.save({"n": Reduced(stand_in("torch._utils", "_rebuild_nested_tensor"),
                             (vals, torch.tensor([[2], [2]]), torch.tensor([[1], [1]]), [0, 2]))},
               path("torch2_nested"))
    torch.save({"w": Reduced(torch._utils._rebuild_wrapper_subclass,
                             (torch.Tensor, torch.float32, (2,), (1,), 0, torch.strided, torch.device("cpu"), False))},
               path("torch2_wrapper"))
    # the real torch 2.11 files, for the truncation and mutation tests of torch_bad_input_test.cpp
    real = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch2_real")
    shutil.copy(os.path.join(real, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"), path("torch2_real_zero3"))
    shutil.copy(os.path.join(real, "torch2_values.pt"), path("torch2_real_values"))


if __name__ == "__main__":
    main(sys.argv[1])
