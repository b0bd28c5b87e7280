"""Outside CI (issue 30): torch2lab's mcore_ckpt.py (Megatron-LM core_v0.19.0's own argument parser, model
build and load_checkpoint) for a model whose settings mcore_ckpt.py's fixed command line cannot express.
mcore_ckpt.megatron_argv always passes --swiglu and --untie-embeddings-and-output-weights (store_true flags
that a later argument cannot switch off); a GPT as Megatron-DeepSpeed's default GPT has neither. This
wrapper drops the flags listed, one a line, in drop_flags.txt next to it, then runs mcore_ckpt.main()
unchanged. The patch is at module level so that the ranks mp.spawn starts (which import this file as
__mp_main__) have it too. Run by scripts/megatron_core_load_verify.sh through lab.sh."""
import os
import sys

sys.path.insert(0, "/torch2lab")
import mcore_ckpt  # noqa: E402

_here = os.path.dirname(os.path.abspath(__file__))
_drop_file = os.path.join(_here, "drop_flags.txt")
DROP = set(open(_drop_file).read().split()) if os.path.exists(_drop_file) else set()
_orig = mcore_ckpt.megatron_argv


def _argv(o, save=None, load=None):
    return [a for a in _orig(o, save=save, load=load) if a not in DROP]


mcore_ckpt.megatron_argv = _argv

if __name__ == "__main__":
    mcore_ckpt.main()
