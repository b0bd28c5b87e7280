"""dsgen: writes real DeepSpeed / Megatron-DeepSpeed checkpoints from seeded ground truth (run with
Debian's /usr/bin/python3 and its torch). See docs/fixtures.md."""
from . import stubs  # noqa: F401  (registers the DeepSpeed stand-in classes first)
from . import dsmoe  # noqa: F401
from .models import ModelConfig, build  # noqa: F401
from .writer import Layout, write_checkpoint  # noqa: F401


def generate(out_dir, cfg: "ModelConfig", lay: "Layout", truth=True, log=lambda *_: None, block_prefix=None):
    """One call: model -> checkpoint in out_dir (latest + global_stepN/) and truth in out_dir/truth.
    block_prefix (dsmoe): blocks named `{block_prefix}.N` instead of Megatron's (dsmoe.rename_blocks)."""
    import os
    model = build(cfg, lay.tp, lay.pp, lay.ep)
    if block_prefix:
        dsmoe.rename_blocks(model, block_prefix)
    write_checkpoint(model, lay, out_dir, os.path.join(out_dir, "truth") if truth else None, log)
    return model
