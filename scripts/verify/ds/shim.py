"""Import shim for running DeepSpeed's checkpoint code from its sources on a CPU host with torch 1.13:
deepspeed/__init__.py is skipped (package object pointing at DS_SRC), and the classes checkpoints
pickle whose modules need pydantic/accelerators come from dsgen's stand-ins."""
import os, sys, types
DS_SRC = os.environ["DS_SRC"]  # a DeepSpeed source tree (the folder holding deepspeed/), not installed
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "generator"))
from dsgen import stubs  # noqa: E402
classes = {"deepspeed.runtime.fp16.loss_scaler": ["LossScaler", "DynamicLossScaler", "LossScalerBase"],
           "deepspeed.runtime.zero.config": ["ZeroStageEnum"],
           "deepspeed.utils.tensor_fragment": ["fragment_address"]}
saved = {m: {c: getattr(sys.modules[m], c) for c in cs if hasattr(sys.modules[m], c)} for m, cs in classes.items()}
for k in [k for k in sys.modules if k == "deepspeed" or k.startswith("deepspeed.")]:
    del sys.modules[k]
pkg = types.ModuleType("deepspeed"); pkg.__path__ = [os.path.join(DS_SRC, "deepspeed")]
sys.modules["deepspeed"] = pkg
for m, cs in saved.items():
    mod = types.ModuleType(m)
    for c, v in cs.items():
        setattr(mod, c, v)
    sys.modules[m] = mod
try:
    import tqdm  # noqa: F401
except ImportError:
    t = types.ModuleType("tqdm")
    t.tqdm = lambda it=None, *a, **k: it
    sys.modules["tqdm"] = t
# deepspeed.utils/__init__ pulls accelerator and comm code; the checkpoint code needs only `logger`.
import logging
_u = types.ModuleType("deepspeed.utils")
_u.__path__ = [os.path.join(DS_SRC, "deepspeed", "utils")]
_u.logger = logging.getLogger("deepspeed")
_u.log_dist = lambda msg, ranks=None, level=logging.INFO: _u.logger.log(level, msg)
sys.modules["deepspeed.utils"] = _u
pkg.utils = _u


def light_package(name):
    """A package whose __init__.py is skipped (its submodules import as usual)."""
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(DS_SRC, *name.split("."))]
    sys.modules[name] = m
    return m


light_package("deepspeed.runtime.checkpoint_engine")
_mc = light_package("deepspeed.runtime.model_checkpointing")
from deepspeed.runtime.model_checkpointing import constants as _mcc  # noqa: E402
for _k in dir(_mcc):
    if not _k.startswith("_"):
        setattr(_mc, _k, getattr(_mcc, _k))
_wq = types.ModuleType("deepspeed.runtime.weight_quantizer")  # only for quantize=True loads
_wq.WeightQuantization = None
sys.modules["deepspeed.runtime.weight_quantizer"] = _wq
