#!/usr/bin/python3
"""Trains a tiny non-Megatron MoE model with DeepSpeed's real engine on CPU (gloo) and saves it: the
DeepSpeed MoE tutorial's model kind (blocks.N, deepspeed.moe.layer.MoE in blocks 1 and 3) and param
grouping (docs/_tutorials/mixture-of-experts.md: one group {'params': model.parameters(), 'name':
'parameters'} through deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer).
Outside CI. DeepSpeed is imported from a source tree (nothing installed): DS_SRC holds deepspeed/
(with accelerator/ and op_builder/ placed as setup.py places them: deepspeed/accelerator,
deepspeed/ops/op_builder) and version.txt (the ds_version the checkpoints record). Needs Debian's torch 1.13 and python3-pydantic (1.10), python3-packaging,
python3-cpuinfo, python3-tqdm; hjson is stood in by json (the config is a dict).
Usage: DS_SRC=... train_moe_tutorial.py OUT_DIR [--world 2] [--ep 2] [--zero 1] [--steps 3] [--resume CKPT]
Resume check (ucp-load's output in the engine): train_moe_tutorial.py OUT2 --world 4 --ep 4 --resume <ucp-load out>
then compare OUT2/loaded/weights_rank*.pt with the source's truth/ (compare_loaded.py), and ucp-union of
OUT2/resaved (the engine's own save of what it loaded, before training on) with the source's universal folder
(tests/reshard/same_universal.py): the whole engine state, optimizer moments included."""
import argparse
import json
import os
import sys
import types


def standins():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # cpu_accelerator.py falls back to gloo without oneccl
    sys.path.insert(0, os.environ["DS_SRC"])
    # deepspeed/git_version_info.py takes the version from setup.py's git_version_info_installed, else
    # from ./version.txt, else "0.0.0" -- which checkpoints record as ds_version and DeepSpeed's own
    # ZeRO load then refuses ("Old version: 0.0.0"). The source tree's version.txt stands in.
    version_txt = os.path.join(os.environ["DS_SRC"], "version.txt")
    if os.path.isfile(version_txt) and "deepspeed.git_version_info_installed" not in sys.modules:
        v = types.ModuleType("deepspeed.git_version_info_installed")
        v.version = open(version_txt).read().strip()
        v.git_hash, v.git_branch, v.installed_ops, v.accelerator_name = "[none]", "[none]", {}, ""
        v.torch_info = {"version": "0.0", "cuda_version": "0.0", "hip_version": "0.0"}
        sys.modules[v.__name__] = v
    if "hjson" not in sys.modules:
        h = types.ModuleType("hjson")
        h.load, h.loads, h.dumps = json.load, json.loads, json.dumps
        sys.modules["hjson"] = h


class _Done:
    def wait(self):
        return None


def gloo_collectives(torch, backend):
    """Gloo in torch 1.13 has no _allgather_base / _reduce_scatter_base: DeepSpeed's tensor forms
    (deepspeed/comm/torch.py TorchBackend.all_gather_into_tensor :212-218, reduce_scatter_tensor
    :262-274) done with the list forms, the same values."""
    dist = torch.distributed

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        dist.all_gather(list(output_tensor.chunk(dist.get_world_size(group))), input_tensor, group=group)
        return _Done()

    def reduce_scatter_tensor(self, output_tensor, input_tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        full = input_tensor.clone()
        dist.all_reduce(full, op=op, group=group)
        output_tensor.copy_(full.chunk(dist.get_world_size(group))[dist.get_rank(group)])
        return _Done()

    backend.all_gather_into_tensor = all_gather_into_tensor
    backend.reduce_scatter_tensor = reduce_scatter_tensor


def build_model(torch, MoE, vocab, hidden, experts, ep):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, moe):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.moe = moe
            self.mlp = MoE(hidden_size=hidden, expert=nn.Linear(hidden, hidden), num_experts=experts, ep_size=ep,
                           k=1) if moe else nn.Linear(hidden, hidden)

        def forward(self, x):
            h = self.ln1(x)
            y = self.mlp(h)[0] if self.moe else self.mlp(h)
            return x + y

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList([Block(experts > 0 and i % 2 == 1) for i in range(4)])
            self.head = nn.Linear(hidden, vocab)

        def forward(self, ids):
            x = self.embed(ids)
            for b in self.blocks:
                x = b(x)
            return torch.nn.functional.cross_entropy(self.head(x).view(-1, vocab), ids.view(-1))

    return Net()


def worker(rank, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port), RANK=str(rank), WORLD_SIZE=str(a.world),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(a.world))
    standins()
    import torch
    import deepspeed
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    import deepspeed.comm.torch  # noqa: F401 (deepspeed.comm's attribute `torch` is torch itself)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # the shared-memory allreduce op needs a C++ JIT build: plain gloo
    gloo_collectives(torch, sys.modules["deepspeed.comm.torch"].TorchBackend)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(1234)
    model = build_model(torch, MoE, a.vocab, a.hidden, a.experts, a.ep)
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": [p for p in model.parameters()], "name": "parameters"}) if a.experts else model.parameters()
    opt = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.01)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 2 * a.world,
           "zero_optimization": {"stage": a.zero}, "zero_allow_untested_optimizer": True, "steps_per_print": 1000}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    if a.resume:  # load a native checkpoint (ucp-load's output), record what each rank holds, train on
        path, _ = engine.load_checkpoint(a.resume, load_optimizer_states=True, load_lr_scheduler_states=True)
        assert path is not None, f"nothing loaded from {a.resume}"
        write_truth(torch, engine.module, a, rank, "loaded")
        engine.save_checkpoint(os.path.join(a.out, "resaved"))  # the loaded state as DeepSpeed saves it
        if rank == 0:
            print(f"train_moe_tutorial: loaded {path} at global step {engine.global_steps}")
    g = torch.Generator().manual_seed(100 + rank)
    for k in range(a.steps):
        ids = torch.randint(0, a.vocab, (2, 8), generator=g)
        loss = engine(ids)
        engine.backward(loss)
        engine.step()
        if a.save_every:  # a chain: OUT/step<global step>/ after every step
            engine.save_checkpoint(os.path.join(a.out, f"step{engine.global_steps}"))
    if a.save_every:
        return
    engine.save_checkpoint(a.out)
    write_truth(torch, engine.module, a, rank, "truth")
    if rank == 0:
        print(f"train_moe_tutorial: saved {a.out} after {a.steps} steps, loss {loss.item():.6f}")


def write_truth(torch, module, a, rank, folder):
    """<out>/<folder>/weights_rank<R>.pt: the weights this rank's module holds after the last step (fp32 training:
    ZeRO's all-gathered copies of the master weights), experts under their global names (expert index
    ep_rank * experts/ep + local; ep_rank = rank mod ep, deepspeed/utils/groups.py
    _create_expert_and_data_parallel's default order). An independent record to check ucp-union against."""
    import re
    per, ep_rank = a.experts // a.ep, rank % a.ep
    out = {}
    for n, p in module.named_parameters():
        m = re.search(r"deepspeed_experts\.(\d+)\.", n)
        if m:
            n = n[:m.start(1)] + str(ep_rank * per + int(m.group(1))) + n[m.end(1):]
        out[n] = p.detach().clone().float()
    os.makedirs(os.path.join(a.out, folder), exist_ok=True)
    torch.save(out, os.path.join(a.out, folder, f"weights_rank{rank}.pt"))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--zero", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--experts", type=int, default=4, help="0: no MoE (a dense blocks.N model)")
    ap.add_argument("--save-every", action="store_true", help="save OUT/step<N>/ after every step (a chain for pec-save)")
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--resume", help="a checkpoint folder (with latest) to load_checkpoint first; the weights each "
                    "rank then holds go to OUT_DIR/loaded/")
    a = ap.parse_args()
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(a,), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
