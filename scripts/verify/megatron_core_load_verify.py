"""Outside CI (issues 30, 48): torch2lab's mcore_ckpt.py (Megatron-LM's own argument parser, model build and
load_checkpoint, from a Megatron-LM source tree on PYTHONPATH) run with the pinned framework environment's
python (torch 2.15, Python 3.11; scripts/frameworks/setup.sh), for scripts/verify/torch_dist_verify.sh and
scripts/verify/megatron_core_load_verify.sh:

    python megatron_core_load_verify.py load  ...   # mcore_ckpt.py load, unchanged (Megatron's load_checkpoint)
    python megatron_core_load_verify.py truth --ckpt D --out T   # torch's DCP loader, see below
    python megatron_core_load_verify.py resume --ckpt D --steps N ...   # load_checkpoint, then N train steps

What it adds around mcore_ckpt.main(), all at module level so that the ranks mp.spawn starts (which import this
file as __mp_main__) have it too:
  * drop_flags.txt next to this file: mcore_ckpt.megatron_argv always passes --swiglu and
    --untie-embeddings-and-output-weights (store_true flags that a later argument cannot switch off); a GPT as
    Megatron-DeepSpeed's default GPT has neither, so the flags listed there, one a line, are dropped.
  * Megatron-LM on Python 3.11 (the chroot had 3.13): core_v0.19.0's megatron/training/models/hybrid.py
    imports typing.override (Python >= 3.12), given typing_extensions.override (the same decorator, pinned in
    the environment); core_v0.16.1's megatron.training imports six, yaml and regex at import time (tokenizers and
    --yaml-cfg, none used here: NullTokenizer, no YAML), which the pinned environment does not hold: Debian's
    python3-six / python3-yaml (pure Python) are loaded from /usr/lib/python3/dist-packages when present, else
    (regex) an import-only stand-in that raises if anything of it is used.
  * `truth`: Megatron's dist_checkpointing.load_plain_tensors (what mcore_ckpt.py truth runs) fails on torch
    2.15 before reading anything: load_tensors_metadata passes TensorProperties.__dict__ to torch.empty, and
    torch 2.15's TensorProperties has a `strides` field (TypeError: empty() got an unexpected keyword argument
    'strides', megatron/core/dist_checkpointing/strategies/torch.py:1022 at core_v0.19.0). The same full
    tensors are read with torch's own DCP loader (FileSystemReader metadata, dcp.load of every tensor entry
    whole, no process group) and written in mcore_ckpt.py truth's form: tensors.safetensors and manifest.json
    (shape, dtype, sha256 of every tensor). On the committed fixtures' outputs it gives exactly the manifests
    load_plain_tensors gave on torch 2.6 (tests/formats/megatron_core/data/*/fully_reshardable.truth).
The torch2lab folder: $TORCH2LAB, else /torch2lab (inside the chroot), else ../../../shared/tools/torch2lab (from this file)
next to the repository.
"""
import hashlib
import importlib.util
import json
import os
import sys
import types
import typing

_here = os.path.dirname(os.path.abspath(__file__))


def _torch2lab():
    for d in (os.environ.get("TORCH2LAB"), "/torch2lab",
              os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "tools", "torch2lab")):
        if d and os.path.exists(os.path.join(d, "mcore_ckpt.py")):
            return d
    sys.exit("megatron_core_load_verify.py: no torch2lab folder with mcore_ckpt.py (set TORCH2LAB)")


if not hasattr(typing, "override"):
    import typing_extensions

    typing.override = typing_extensions.override

_DEBIAN = "/usr/lib/python3/dist-packages"


def _fill(name):
    """`name` importable: the installed one, Debian's pure-Python one, or an import-only stand-in."""
    if importlib.util.find_spec(name) is not None:
        return
    pkg = os.path.join(_DEBIAN, name)
    path = os.path.join(pkg, "__init__.py") if os.path.isdir(pkg) else pkg + ".py"
    if os.path.exists(path):
        spec = importlib.util.spec_from_file_location(
            name, path, submodule_search_locations=[pkg] if os.path.isdir(pkg) else None)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return
    mod = types.ModuleType(name)

    def _getattr(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise RuntimeError("megatron_core_load_verify.py: import-only stand-in for %s: %s used" % (name, attr))

    mod.__getattr__ = _getattr
    sys.modules[name] = mod


for _name in ("six", "yaml", "regex"):
    _fill(_name)

sys.path.insert(0, _torch2lab())
import mcore_ckpt  # noqa: E402

_drop_file = os.path.join(_here, "drop_flags.txt")
DROP = set(open(_drop_file).read().split()) if os.path.exists(_drop_file) else set()
_orig = mcore_ckpt.megatron_argv


def _argv(o, save=None, load=None):
    return [a for a in _orig(o, save=save, load=load) if a not in DROP]


mcore_ckpt.megatron_argv = _argv


def unshare_adam_step():
    """One torch Adam `step` tensor per parameter after DistributedOptimizer.load_state_dict. Without Apex /
    Transformer Engine (torch.optim.AdamW, this CPU set-up) Megatron-Core restores the per-parameter `step`
    as ONE tensor shared by every parameter's state (megatron/core/optimizer/distrib_optimizer.py:1024-1032
    at core_v0.19.0; torch's Optimizer.load_state_dict keeps a step tensor as given), and AdamW increments
    each parameter's step in place: after one resumed step every step is the number of parameters, and the
    bias correction is wrong from the first step with a non-zero learning rate. A GPU run with Apex / TE
    FusedAdam keeps the step in the param group; this gives each parameter its own copy, what that computes.
    Found by hf_resume_verify.sh, whose reference is a fresh run; the resume_ cases of torch_dist_verify.sh
    compare two loads that shared the error."""
    from megatron.core.optimizer import distrib_optimizer as do

    if do.HAVE_APEX_OR_TE or getattr(do.DistributedOptimizer, "_unshared_adam_step", False):
        return
    orig = do.DistributedOptimizer.load_state_dict

    def load_state_dict(self, state_dict):
        orig(self, state_dict)
        for s in self.optimizer.state.values():
            if "step" in s and hasattr(s["step"], "clone"):
                s["step"] = s["step"].clone()

    do.DistributedOptimizer.load_state_dict = load_state_dict
    do.DistributedOptimizer._unshared_adam_step = True


def allow_sequence_parallel_torch_norm():
    """Sequence parallelism with the torch norm (CPU: no Apex / Transformer Engine). Megatron-LM requires it
    for MoE with TP > 1 (the forward refuses to run without it), and its torch norm refuses it
    (megatron/core/transformer/torch_norm.py:50 at core_v0.19.0). Under sequence parallelism a norm sees its
    rank's part of the sequence, and its weight's gradient must be summed over the TP group: Megatron's Apex
    norm marks its parameters `sequence_parallel` for that (fusions/fused_layer_norm.py:116-120) and
    finalize_model_grads sums the gradients of the parameters so marked (distributed/finalize_model_grads.py:452).
    This builds the same torch norm WrappedTorchNorm builds and marks its parameters as the Apex norm does; with
    sequence parallelism off the attribute is False and nothing changes. It changes how the job trains, not
    what a checkpoint holds, and every run of a comparison (ours, Megatron's own) runs with it."""
    from megatron.core.transformer import torch_norm

    if getattr(torch_norm.WrappedTorchNorm, "_sp_marked", False):
        return

    def __new__(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                normalization="LayerNorm"):
        sp = config.sequence_parallel
        config.sequence_parallel = False  # only for the refusal at torch_norm.py:50; restored below
        try:
            norm = orig(cls, config, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization)
        finally:
            config.sequence_parallel = sp
        for p in norm.parameters():
            setattr(p, "sequence_parallel", sp)
        return norm

    orig = torch_norm.WrappedTorchNorm.__new__
    torch_norm.WrappedTorchNorm.__new__ = __new__
    torch_norm.WrappedTorchNorm._sp_marked = True


if sys.argv[1:2] != ["truth"]:  # module level: the ranks mp.spawn starts import this file as __mp_main__
    allow_sequence_parallel_torch_norm()


def _resume(rank, world, o):
    """`resume` (issue 47, resume equivalence): Megatron's own load_checkpoint of --ckpt with the run's
    flags as given (no --no-load-rng unless --no-rng), then --steps of Megatron's own train_step
    (mcore_ckpt.real_train_steps: the same seeded batches in every run); prints the iteration and learning
    rate it resumed at and each step's loss line."""
    from megatron.training.checkpointing import load_checkpoint

    args = mcore_ckpt.megatron_init(o, load=o.ckpt)
    args.load = None  # setup_model_and_optimizer would load; loaded below after mcore_ckpt's Adam priming
    model, optimizer, sched = mcore_ckpt.build(args)
    args.load = o.ckpt
    mcore_ckpt.prime_torch_adam(optimizer)
    mcore_ckpt.patch_torch_adam_fully_reshardable_load()
    unshare_adam_step()
    args.iteration, args.num_floating_point_operations_so_far = load_checkpoint(model, optimizer, sched)
    lrs = sorted({g["lr"] for g in optimizer.param_groups})
    print("resumed iteration %d (rank %d), lr %s" % (args.iteration, rank, lrs), flush=True)
    mcore_ckpt.real_train_steps(args, model, optimizer, sched, o.steps)


def truth(ckpt, out):
    """mcore_ckpt.py truth's files, read with torch's own DCP loader (see the docstring)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    d = mcore_ckpt.iter_dir(ckpt)
    os.makedirs(out, exist_ok=True)
    md = dcp.FileSystemReader(d).read_metadata()
    sd = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.state_dict_metadata.items()
          if isinstance(m, TensorStorageMetadata)}
    dcp.load(sd, checkpoint_id=d)
    manifest = {"checkpoint": os.path.relpath(d, out), "tensors": {}, "objects": [],
                "reader": "torch %s dcp.load" % torch.__version__}
    for k in sorted(sd):
        t = sd[k]
        manifest["tensors"][k] = {
            "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "sha256": hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest(),
        }
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(out, "tensors.safetensors"))
    json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"), indent=1, sort_keys=True)
    print("truth: %d tensors (torch %s DCP loader) -> %s" % (len(sd), torch.__version__, out), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["truth"]:
        import argparse

        p = argparse.ArgumentParser()
        p.add_argument("cmd")
        p.add_argument("--ckpt", required=True)
        p.add_argument("--out", required=True)
        a = p.parse_args()
        truth(a.ckpt, a.out)
    else:
        if sys.argv[1:2] == ["resume"]:  # mcore_ckpt's load arguments, _resume instead of its _load
            sys.argv[1] = "load"
            mcore_ckpt._load = _resume
        mcore_ckpt.main()
