# Shims for running torch 2.14.1's torch/distributed/checkpoint (pure Python) on torch 2.6.0
# (scripts/dcp_fixtures_newer.sh). Two kinds, both taken verbatim from torch 2.14.1 (Debian
# python3-torch 2.14.1+dfsg-1, unpacked at /lab/h30d/x214):
#  * a module that 2.14's checkpoint package imports and 2.6 does not have at all is loaded from
#    2.14's file (meta-path finder below; each one is printed to stderr when used);
#  * a function that 2.14's package imports from a 2.6 module that lacks it is copied here from
#    2.14 (file:line named).
# Nothing of DCP's own save path (torch/distributed/checkpoint/*) is replaced or patched.
import importlib, importlib.abc, importlib.util, os, sys
X214 = os.environ.get("X214", "/lab/h30d/x214/usr/lib/python3/dist-packages")

class _From214(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if not name.startswith("torch.") or name.startswith("torch.distributed.checkpoint"):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            if finder.find_spec(name, path, target) is not None:
                return None  # torch 2.6 has it
        rel = name.replace(".", "/")
        for cand in (rel + ".py", rel + "/__init__.py"):
            f = os.path.join(X214, cand)
            if os.path.exists(f):
                sys.stderr.write(f"dcp214_shim: module {name} from torch 2.14.1 {cand}\n")
                return importlib.util.spec_from_file_location(name, f)
        return None

sys.meta_path.append(_From214())

import torch._utils

def try_import(module_name):  # torch/_utils.py:1098-1115@2.14.1
    if (module := sys.modules.get(module_name, None)) is not None:
        return module
    if (spec := importlib.util.find_spec(module_name)) is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        if spec.loader is None:
            raise AssertionError("The loader attribute should always be set")
        spec.loader.exec_module(module)
        return module
    return None

if not hasattr(torch._utils, "try_import"):
    sys.stderr.write("dcp214_shim: torch._utils.try_import from torch 2.14.1 torch/_utils.py:1098\n")
    torch._utils.try_import = try_import
