"""Outside CI: DeepSpeed's SDLoaderFactory / MegatronSDLoader (engine._load_checkpoint's first step)
and PipelineModule.ckpt_layer_path_list on a ucp-load output."""
import glob, os, sys, types
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shim  # noqa: F401
ck, tp, pp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from deepspeed.runtime.state_dict_factory import SDLoaderFactory
ckpt_list = sorted(glob.glob(os.path.join(ck, "mp_rank_*_model_states.pt")))  # engine._get_all_ckpt_names
for mp in range(tp * pp):
    loader = SDLoaderFactory.get_sd_loader(ckpt_list, checkpoint_engine=None)  # check_ckpt_list inside
    path, sd, _ = loader.load(tp * pp, mp, is_pipe_parallel=pp > 1)
    print("mp rank", mp, "->", os.path.basename(path), "mp_world_size", sd["mp_world_size"])
