"""dsgen: writes real DeepSpeed / Megatron-DeepSpeed checkpoints from seeded ground truth (run with
Debian's /usr/bin/python3 and its torch). See docs/fixtures.md."""
from . import stubs  # noqa: F401  (registers the DeepSpeed stand-in classes first)
from . import dsmoe  # noqa: F401
from .models import ModelConfig, build  # noqa: F401
from .writer import Layout, write_checkpoint  # noqa: F401


def generate(out_dir, cfg: "ModelConfig", lay: "Layout", truth=True, log=lambda *_: None):
    """One call: model -> checkpoint in out_dir (latest + global_stepN/) and truth in out_dir/truth."""
    import os
    model = build(cfg, lay.tp, lay.pp, lay.ep)
    write_checkpoint(model, lay, out_dir, os.path.join(out_dir, "truth") if truth else None, log)
    return model
