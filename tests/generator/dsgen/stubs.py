"""Stand-ins for the DeepSpeed classes that real checkpoints pickle, registered under their real
module paths so that torch.save writes the same class references DeepSpeed does and torch.load of
a real checkpoint (or of ours) needs no DeepSpeed install."""
import enum
import sys
import types
from dataclasses import dataclass
from typing import List, Tuple, Union


def _module(path):
    """Creates (or returns) a module object for `path` and all its parents in sys.modules."""
    parts = path.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            mod = types.ModuleType(name)
            sys.modules[name] = mod
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], mod)
    return sys.modules[path]


@dataclass
class fragment_address:  # noqa: N801 (DeepSpeed's spelling)
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
    def __init__(self, init_scale=2**16, scale_factor=2.0, scale_window=1000, min_scale=1,
                 delayed_shift=1, consecutive_hysteresis=False, raise_error_at_min_scale=True, dtype=None):
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


def _register(cls, path):
    mod = _module(path)
    cls.__module__ = path
    cls.__qualname__ = cls.__name__
    setattr(mod, cls.__name__, cls)


_register(fragment_address, "deepspeed.utils.tensor_fragment")
_register(ZeroStageEnum, "deepspeed.runtime.zero.config")
_register(LossScalerBase, "deepspeed.runtime.fp16.loss_scaler")
_register(LossScaler, "deepspeed.runtime.fp16.loss_scaler")
_register(DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler")
_register(SubparamShape, "deepspeed.checkpoint.universal_checkpoint")
