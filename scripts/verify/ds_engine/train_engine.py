#!/usr/bin/python3
"""Trains a tiny non-Megatron model with DeepSpeed's real engine on CPU (gloo), saves it, and records the
state the engine holds (weights, fp32 master, Adam moments, step), for three model kinds on either
DeepSpeed line (v0.14.x on Debian's torch 1.13 on the host, v0.19.x on torch 2.6 in the trixie chroot):

  --kind moe    the DeepSpeed MoE tutorial's model and grouping (train_moe_tutorial.py's build_model:
                embed, blocks.0-3 with deepspeed.moe.layer.MoE in blocks 1 and 3, head; one group
                through split_params_into_different_moe_groups_for_optimizer)
  --kind dense  the same GPT-like blocks.N model without MoE, one param group model.parameters()
  --kind pipe   a PipelineModule (deepspeed/runtime/pipe/module.py) of LayerSpecs Embed, Block x4, Head,
                --pp stages, DeepSpeed's pipe engine (train_batch); parameters named <layer index>.<name>

Outside CI. DeepSpeed is imported from a source tree, nothing installed: DS_SRC holds deepspeed/ (with
accelerator/ and op_builder/ placed as setup.py places them) and version.txt (registered as the installed
version: a bare tree records ds_version 0.0.0, which DeepSpeed's own ZeRO load refuses).
Usage:
  DS_SRC=... train_engine.py OUT --kind dense [--world 2] [--zero 1] [--steps 3]          (train, save OUT/)
  DS_SRC=... train_engine.py OUT2 --kind dense --world 4 --resume CKPT [--universal]      (load, record, train on)
--resume loads CKPT (native; with --universal DeepSpeed's own universal path: "checkpoint":
{"load_universal": true}, CKPT/latest_universal), writes OUT2/loaded/state_rank<R>.pt, trains --after steps (1)
and writes OUT2/after/state_rank<R>.pt; compare two such records with tests/reshard/engine_state.py same.
  DS_SRC=... train_engine.py OUT --kind pipe --pp P --world P --partition-method M --parts
                                  (DeepSpeed's own PipelineModule partition, one JSON line; nothing trained)
Every rank writes OUT/<truth|loaded|after>/state_rank<R>.pt: {"step": Adam's step, "global_steps": engine's,
"params": {global name: {"weight", "fp32", "exp_avg", "exp_avg_sq"}}}: moments through DeepSpeed's
deepspeed.utils.safe_get_full_optimizer_state (deepspeed/utils/tensor_fragment.py), the fp32 master from ZeRO's
own flat partition (full_master), experts under their global names (expert index ep_rank * experts/ep + local).
Run on both lines by make_fixtures.sh (the fixtures) and resume_compare.sh (engine resumes, issue 33)."""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_moe_tutorial import build_model, gloo_collectives, standins  # noqa: E402


def build_pipe(torch, PipelineModule, LayerSpec, vocab, hidden, pp, method):
    nn = torch.nn

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)

        def forward(self, ids):
            return self.embed(ids)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.mlp = nn.Linear(hidden, hidden)

        def forward(self, x):
            return x + self.mlp(self.ln1(x))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(hidden, vocab)

        def forward(self, x):
            return self.head(x)

    def loss_fn(logits, labels):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))

    layers = [LayerSpec(Embed)] + [LayerSpec(Block) for _ in range(4)] + [LayerSpec(Head)]
    # deepspeed/runtime/pipe/module.py PipelineModule(layers, num_stages, loss_fn, partition_method)
    return PipelineModule(layers=layers, num_stages=pp, loss_fn=loss_fn, partition_method=method)


def full_master(torch, zo, p):
    """The fp32 master of p as ZeRO-1/2 steps on it: its fragment of single_partition_of_fp32_groups[group]
    (stage_1_and_2.py), all-reduced over the param's data-parallel group as tensor_fragment.py's
    get_full_hp_param does. Not through p._hp_mapping.hp_fragment: after a universal load
    map_to_flat_opt_states (tensor_fragment.py v0.14.5:71, v0.19.5:82) repoints that view at the last
    optimizer-state buffer it built, so safe_get_full_fp32_param then returns a moment, not the master."""
    hm = getattr(p, "_hp_mapping", None)
    if hm is None or not hasattr(zo, "single_partition_of_fp32_groups"):
        return None
    import deepspeed.comm as dist
    flat = zo.single_partition_of_fp32_groups[hm.param_group_index]
    buf = torch.zeros(p.numel(), dtype=torch.float32)
    lp, hp = hm.lp_fragment_address, hm.hp_fragment_address
    buf.narrow(0, lp.start, lp.numel).copy_(flat.detach().narrow(0, hp.start, hp.numel))
    dist.all_reduce(buf, group=p._dp_group)
    return buf.view(p.shape)


def record(torch, engine, a, rank, folder):
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    module = engine.module
    zo = engine.optimizer
    if hasattr(zo, "_hp_optimizer_states_linked"):
        # stage_1_and_2.py _optimizer_step (v0.19.5:2251) links the hp fragments to the optimizer state after
        # the first param group's step, before later groups have state: a second group (moe's) has no
        # exp_avg fragment. DeepSpeed's own linking again, now that every group has its state.
        zo._hp_optimizer_states_linked = False
        zo._lazy_init_hp_params_optimizer_state()
    per = a.experts // a.ep if a.kind == "moe" else 0
    ep_rank = rank % a.ep if a.kind == "moe" else 0
    params = {}
    for n, p in module.named_parameters():
        m = re.search(r"deepspeed_experts\.(\d+)\.", n)
        if m:
            n = n[:m.start(1)] + str(ep_rank * per + int(m.group(1))) + n[m.end(1):]
        # collectives over the param's data-parallel group: every rank walks its params in the same order
        fp32 = full_master(torch, zo, p)
        if fp32 is None:
            fp32 = safe_get_full_fp32_param(p)
        try:
            e1 = safe_get_full_optimizer_state(p, "exp_avg")
        except ValueError as e:
            raise ValueError(f"{n}: {e}")
        e2 = safe_get_full_optimizer_state(p, "exp_avg_sq")
        params[n] = {"weight": p.detach().clone().float(), "fp32": None if fp32 is None else fp32.clone(),
                     "exp_avg": None if e1 is None else e1.clone(), "exp_avg_sq": None if e2 is None else e2.clone()}
    steps = set()
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    for st in base.state.values():
        if "step" in st:
            steps.add(float(st["step"]))
    out = {"step": sorted(steps), "global_steps": engine.global_steps, "params": params}
    os.makedirs(os.path.join(a.out, folder), exist_ok=True)
    torch.save(out, os.path.join(a.out, folder, f"state_rank{rank}.pt"))


def worker(rank, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port), RANK=str(rank), WORLD_SIZE=str(a.world),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(a.world), USE_LIBUV="0")
    # torch 2's torch.compile (v0.19 sharded_moe.py top1gating's compiled helpers) needs a C++ compiler for
    # inductor; none in the chroot: eager, the same code uncompiled
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    standins()
    import torch
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # a C++ JIT build: plain gloo
    gloo_collectives(torch, sys.modules["deepspeed.comm.torch"].TorchBackend)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(1234)
    if a.kind == "pipe":
        from deepspeed.pipe import LayerSpec, PipelineModule
        model = build_pipe(torch, PipelineModule, LayerSpec, a.vocab, a.hidden, a.pp, a.partition_method)
        groups = model.parameters()
        dp = a.world // a.pp
    else:
        from deepspeed.moe.layer import MoE
        model = build_model(torch, MoE, a.vocab, a.hidden, a.experts if a.kind == "moe" else 0, a.ep)
        if a.kind == "moe":
            from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
            groups = split_params_into_different_moe_groups_for_optimizer(
                {"params": [p for p in model.parameters()], "name": "parameters"})
        else:
            groups = model.parameters()
        dp = a.world
    opt = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.01)
    gas = 2 if a.kind == "pipe" else 1
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas, "train_batch_size": 2 * gas * dp,
           "zero_optimization": {"stage": a.zero}, "zero_allow_untested_optimizer": True, "steps_per_print": 1000}
    if a.universal:
        cfg["checkpoint"] = {"load_universal": True}
    if a.parts:  # DeepSpeed's own partition of the layer list (PipelineModule._partition_layers), no engine
        if rank == 0:
            import json
            from deepspeed.pipe import LayerSpec
            # the names _find_layer_type matches (module.py v0.19.5 :322-337): what --layer-types takes
            names = [s.typename.__name__ if isinstance(s, LayerSpec) else type(s).__name__
                     if isinstance(s, torch.nn.Module) else s.__name__ for s in model._layer_specs]
            print("train_engine parts: " + json.dumps({"method": a.partition_method, "pp": a.pp,
                                                        "parts": [int(x) for x in model.parts], "layer_types": names}))
        return
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    if a.resume:
        path, _ = engine.load_checkpoint(a.resume, load_optimizer_states=True, load_lr_scheduler_states=True)
        assert path is not None, f"nothing loaded from {a.resume}"
        record(torch, engine, a, rank, "loaded")
        if rank == 0:
            print(f"train_engine: loaded {path} at global step {engine.global_steps}")
    dp_rank = rank // a.pp if a.kind == "pipe" else rank  # PipeDataParallelTopology: axes (pipe, data)
    if a.kind == "pipe":
        dp_rank = engine.grid.get_data_parallel_rank()
    g = torch.Generator().manual_seed(100 + dp_rank)
    loss = None
    for k in range(a.steps):
        if a.kind == "pipe":
            batches = [torch.randint(0, a.vocab, (2, 8), generator=g) for _ in range(gas)]
            loss = engine.train_batch(data_iter=iter([(b, b) for b in batches]))
        else:
            ids = torch.randint(0, a.vocab, (2, 8), generator=g)
            loss = engine(ids)
            engine.backward(loss)
            engine.step()
        if a.save_every:
            engine.save_checkpoint(os.path.join(a.out, f"step{engine.global_steps}"))
    if a.resume:
        if a.steps:
            record(torch, engine, a, rank, "after")
            if rank == 0:
                print(f"train_engine: {a.steps} more steps, loss {float(loss):.6f}")
        return
    if a.save_every:
        return
    engine.save_checkpoint(a.out)
    record(torch, engine, a, rank, "truth")
    if rank == 0:
        print(f"train_engine: saved {a.out} after {a.steps} steps, loss {float(loss):.6f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--kind", choices=["moe", "dense", "pipe"], required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--ep", type=int, default=2, help="moe: expert parallel size")
    ap.add_argument("--pp", type=int, default=2, help="pipe: pipeline stages (DP = world / pp)")
    ap.add_argument("--partition-method", default="parameters", help="pipe: PipelineModule's partition_method")
    ap.add_argument("--zero", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--save-every", action="store_true", help="save OUT/step<N>/ after every step (a chain)")
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--resume", help="a checkpoint folder to load_checkpoint; the state each rank then holds goes "
                    "to OUT/loaded/ (then --after steps; no save)")
    ap.add_argument("--after", type=int, default=1, help="with --resume: train this many steps after loading and "
                    "record the state then in OUT/after/ (the same data as any other resume at this world size)")
    ap.add_argument("--parts", action="store_true", help="pipe: print DeepSpeed's partition of the layer list "
                    "(PipelineModule.parts) and the layer class names, as one JSON line, and stop (world = pp)")
    ap.add_argument("--universal", action="store_true", help="with --resume: DeepSpeed's load_universal path")
    a = ap.parse_args()
    if a.resume:
        a.steps = a.after
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(a,), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
