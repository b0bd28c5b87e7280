"""DeepSpeed 0.19.8's real engine (installed from PyPI into the pinned environment, scripts/frameworks/setup.sh)
trains, saves and resumes a tiny model on CPU gloo ranks: the judge of tests/frameworks/deepspeed_engine_test.sh
(docs/frameworks.md). Ideas from scripts/verify/ds_engine/train_engine.py (outside CI, source trees and stand-ins);
here nothing is stood in: the engine, its checkpoint code and its converter are the installed package's.

Cases (one model kind each; fp32 training, torch.optim.AdamW as the client optimizer):
  dense   embed, blocks.0-3 (LayerNorm + Linear), head; ZeRO-1
  zero3   the same model under ZeRO-3
  moe     the DeepSpeed MoE tutorial's model: deepspeed.moe.layer.MoE (4 experts, ep 2) in blocks 1 and 3, param
          groups from deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer; ZeRO-1
Sizes are odd (hidden 6, vocabulary 13: 385 dense elements) so that ZeRO pads its partitions.

Data: global step s has K = 4 micro-batches of 2 sequences; micro-batch k is torch.Generator seeded 1000 s + k, so
every layout (DP d, gradient accumulation K / d; rank r takes k = r K/d .. (r+1) K/d - 1) trains on the same
micro-batches, and a micro-batch's loss after a load depends only on the loaded weights.

Subcommands (each spawns --world gloo ranks with torch.multiprocessing, except universal and the checks):
  save --out D --world 2 --cases dense,zero3,moe
      per case: 3 steps, engine.save_checkpoint(D/<case>/ckpt), the state every rank holds to D/<case>/truth/
      (state_rank<R>.pt), then 2 more steps: their micro-batch losses and the state then to D/<case>/cont/
  universal --out D --cases ...
      DeepSpeed's own ds_to_universal (deepspeed/checkpoint/ds_to_universal.py main) of D/<case>/ckpt's step
      (copied to D/<case>/dsu/) into D/<case>/dsu/global_step3_universal (latest_universal beside it); prints
      one JSON line per case: ok, or the exception DeepSpeed raised
  resume --out D --world W --job NAME:CASE:CKPT:ZERO:EP:UNIVERSAL [--job ...]
      per job: the engine at DP W, ZeRO ZERO (EP EP for moe), load_checkpoint(CKPT) (UNIVERSAL 1: DeepSpeed's own
      universal path, "checkpoint": {"load_universal": true}, CKPT/latest_universal), the state it holds to
      D/NAME/loaded/, 2 more steps (losses to D/NAME/losses_rank<R>.json), the state then to D/NAME/after/
Checks: check 'LABEL|KIND|A|B[|STEPS]' ... (one process; one line each; exit 1 when one is not equal):
  same-universal OURS THEIRS      two universal folders: every zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt of
                                  either is in the other with the same keys, values bit for bit, dtypes, shapes
  union-state U STATE_DIR         a universal folder holds exactly the engine's params, fp32 / exp_avg /
                                  exp_avg_sq bit for bit (the flat ZeRO-3 form compared as its elements) and step
  same-state A B                  two state records: same names, weight / fp32 / exp_avg / exp_avg_sq, steps
  close-state A B                 the same within 1e-5 of each tensor's largest value (another layout trained on:
                                  the gradients were reduced in another order)
  same-losses A B [STEPS]         two loss records (losses_rank*.json) equal bit for bit (only steps S,.. if given)
  close-losses A B [STEPS]        the same within 1e-5 (relative)

The DeepSpeed code relied on (0.19.8, site-packages/deepspeed/; file:line):
  deepspeed.init_distributed(dist_backend="gloo")   comm/comm.py:844 (cdb = TorchBackend(dist_backend, ...) :910);
      the CPU accelerator's own backend is gloo when oneccl_bindings_for_pytorch is absent
      (accelerator/cpu_accelerator.py:30-34); TorchBackend.__init__ JIT-builds the shared-memory allreduce op
      (comm/torch.py:47-53, :207) with ninja (ops/op_builder/builder.py:573-577) and g++: skipped, see worker()
  deepspeed.initialize(model, optimizer, config)    __init__.py:433 (it calls init_distributed again :509-512)
  engine.save_checkpoint(save_dir)                  runtime/engine.py:4869 (tag global_step<N>, latest)
  engine.load_checkpoint(load_dir, load_optimizer_states=True, load_lr_scheduler_states=True)
                                                    runtime/engine.py:4395; tag from "latest", or from
                                                    "latest_universal" when load_universal (:4427-4431)
  "checkpoint": {"load_universal": true}            runtime/config.py:549, runtime/constants.py:356
  ds_to_universal main(args)                        checkpoint/ds_to_universal.py:1156 (arguments :71-98;
                                                    --inject_missing_state :1169, latest_universal :1371-1374)
  safe_get_full_fp32_param / safe_get_full_optimizer_state   utils/tensor_fragment.py:135, :170
  deepspeed.zero.GatheredParameters (ZeRO-3 weights), MoE(hidden_size, expert, num_experts, ep_size, k,
  capacity_factor) moe/layer.py:38, split_params_into_different_moe_groups_for_optimizer moe/utils.py:72,
  groups._get_expert_parallel_rank utils/groups.py:816
  ZeRO-1/2 links the Adam state into the hp fragments after the first param group's step only
      (runtime/zero/stage_1_and_2.py:2987 -> :852): a second (MoE) group then has no exp_avg fragment
      (safe_get_full_optimizer_state: "ValueError: exp_avg not found in optimizer state fragment",
      utils/tensor_fragment.py:40); before reading moments the link is made again with DeepSpeed's own
      _lazy_init_hp_params_optimizer_state.
What DeepSpeed refuses here (printed by the test, docs/frameworks.md):
  ds_to_universal of the native-MoE checkpoint: RuntimeError: shape '[6]' is invalid for input of size 12 (or
      '[6, 6]' / 72) in _merge_zero_shards (checkpoint/ds_to_universal.py:242, the reshape :279): both EP ranks'
      experts carry the same local names, so their fragments are joined as ZeRO shards of one tensor
  load_universal across ZeRO-3 and ZeRO-1/2: a bare AssertionError in check_ckpt_list
      (runtime/state_dict_factory.py:168): the engine globs its own stage's model files in the universal folder
      (zero_pp_rank_0_mp_rank_*_model_states.pt under ZeRO-3, mp_rank_*_model_states.pt else: runtime/engine.py
      :4383-4392, :4336-4360), and ds_to_universal copies the source stage's (checkpoint/ds_to_universal.py
      :1262-1274 ZeRO-1/2, :1355-1368 ZeRO-3)
"""
import argparse
import glob
import json
import os
import re
import sys

VOCAB, HIDDEN, SEQ, MICRO, K, EXPERTS = 13, 6, 8, 2, 4, 4
CASES = {"dense": {"zero": 1, "ep": 0}, "zero3": {"zero": 3, "ep": 0}, "moe": {"zero": 1, "ep": 2}}
STATE_KEYS = ("weight", "fp32", "exp_avg", "exp_avg_sq")


def env_defaults():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("USE_LIBUV", "0")


def build_model(torch, MoE, experts, ep):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, moe):
            super().__init__()
            self.ln1 = nn.LayerNorm(HIDDEN)
            self.moe = moe
            # capacity_factor = experts: no token is dropped, so the gate's random token selection (use_rts)
            # cannot change an output
            self.mlp = MoE(hidden_size=HIDDEN, expert=nn.Linear(HIDDEN, HIDDEN), num_experts=experts, ep_size=ep,
                           k=1, capacity_factor=float(experts)) if moe else nn.Linear(HIDDEN, HIDDEN)

        def forward(self, x):
            h = self.ln1(x)
            return x + (self.mlp(h)[0] if self.moe else self.mlp(h))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.blocks = nn.ModuleList([Block(experts > 0 and i % 2 == 1) for i in range(4)])
            self.head = nn.Linear(HIDDEN, VOCAB)

        def forward(self, ids):
            x = self.embed(ids)
            for b in self.blocks:
                x = b(x)
            return torch.nn.functional.cross_entropy(self.head(x).view(-1, VOCAB), ids.view(-1))

    return Net()


def make_engine(torch, deepspeed, case, zero, ep, world, universal=False):
    from deepspeed.moe.layer import MoE
    torch.manual_seed(1234)
    moe = case == "moe"
    model = build_model(torch, MoE, EXPERTS if moe else 0, ep)
    if moe:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        groups = split_params_into_different_moe_groups_for_optimizer(
            {"params": list(model.parameters()), "name": "parameters"})
    else:
        groups = model.parameters()
    opt = torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.01)
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": K // world,
           "train_batch_size": MICRO * K, "zero_optimization": {"stage": zero},
           "zero_allow_untested_optimizer": True, "steps_per_print": 1000, "wall_clock_breakdown": False}
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return engine


def train(torch, engine, rank, world, steps, losses):
    gas = K // world
    for _ in range(steps):
        s = engine.global_steps + 1
        for m in range(gas):
            k = rank * gas + m
            ids = torch.randint(0, VOCAB, (MICRO, SEQ), generator=torch.Generator().manual_seed(1000 * s + k))
            torch.manual_seed(1000 * s + k)
            loss = engine(ids)
            engine.backward(loss)
            engine.step()
            losses[f"{s}.{k}"] = float(loss.detach()).hex()
        assert engine.global_steps == s, (engine.global_steps, s)


def record(torch, deepspeed, engine, case, ep, folder, rank):
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    from deepspeed.utils import groups
    zo = engine.optimizer
    if hasattr(zo, "_hp_optimizer_states_linked"):
        zo._hp_optimizer_states_linked = False
        zo._lazy_init_hp_params_optimizer_state()
    named = list(engine.module.named_parameters())
    if hasattr(named[0][1], "ds_id"):  # ZeRO-3: the weights are partitioned; gathered whole
        with deepspeed.zero.GatheredParameters([p for _, p in named]):
            weights = [p.detach().clone().float() for _, p in named]
    else:
        weights = [p.detach().clone().float() for _, p in named]
    per = EXPERTS // ep if case == "moe" else 0
    ep_rank = groups._get_expert_parallel_rank(f"ep_size_{ep}") if case == "moe" else 0
    params = {}
    for (n, p), w in zip(named, weights):
        m = re.search(r"deepspeed_experts\.(\d+)\.", n)
        if m:  # global expert index: ep_rank * experts / ep + local
            n = n[:m.start(1)] + str(ep_rank * per + int(m.group(1))) + n[m.end(1):]
        st = {"weight": w, "fp32": safe_get_full_fp32_param(p)}
        for key in ("exp_avg", "exp_avg_sq"):
            st[key] = safe_get_full_optimizer_state(p, key)
        params[n] = {k: None if v is None else v.detach().clone().float().reshape(p.ds_shape if hasattr(p, "ds_shape")
                                                                                    else p.shape)
                     for k, v in st.items()}
    steps = sorted({float(s["step"]) for s in zo.optimizer.state.values() if "step" in s})
    os.makedirs(folder, exist_ok=True)
    torch.save({"step": steps, "global_steps": engine.global_steps, "params": params},
               os.path.join(folder, f"state_rank{rank}.pt"))


def worker(rank, a):
    env_defaults()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port), RANK=str(rank), WORLD_SIZE=str(a.world),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(a.world))
    import torch
    import deepspeed
    if os.environ.get("UCPKIT_DS_SHM") != "1":
        # The CPU accelerator's TorchBackend builds its shared-memory allreduce op at every init (comm/torch.py:207,
        # build_shm_op :47-53), a JIT C++ build of 1-2 minutes on 2 cores that needs ninja; it serves only
        # inference_all_reduce (:292-306), never training, which reduces through torch.distributed (gloo). Marked
        # not compatible, as on a platform without it (ops/op_builder/cpu/comm.py:68-72), in the dict DeepSpeed keeps
        # for such edits (ops/__init__.py:28-34). UCPKIT_DS_SHM=1 builds and loads it (docs/frameworks.md).
        import deepspeed.ops
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    if a.cmd == "save":
        for case in a.cases.split(","):
            c = CASES[case]
            engine = make_engine(torch, deepspeed, case, c["zero"], c["ep"], a.world)
            losses = {}
            train(torch, engine, rank, a.world, 3, losses)
            engine.save_checkpoint(os.path.join(a.out, case, "ckpt"))
            record(torch, deepspeed, engine, case, c["ep"], os.path.join(a.out, case, "truth"), rank)
            cont = {}
            train(torch, engine, rank, a.world, 2, cont)
            record(torch, deepspeed, engine, case, c["ep"], os.path.join(a.out, case, "cont"), rank)
            write_json(os.path.join(a.out, case, "truth", f"losses_rank{rank}.json"), losses)
            write_json(os.path.join(a.out, case, "cont", f"losses_rank{rank}.json"), cont)
            if rank == 0:
                print(f"ds_train_loop: {case} saved after 3 steps (ZeRO {c['zero']}, DP {a.world}"
                      f"{', EP %d' % c['ep'] if c['ep'] else ''})", flush=True)
            del engine
    else:
        for job in a.job:
            name, case, ckpt, zero, ep, universal = job.split(":")
            zero, ep, universal = int(zero), int(ep), universal == "1"
            engine = make_engine(torch, deepspeed, case, zero, ep, a.world, universal)
            out = os.path.join(a.out, name)
            try:
                path, _ = engine.load_checkpoint(ckpt, load_optimizer_states=True, load_lr_scheduler_states=True)
            except Exception as e:
                if not universal:
                    raise
                # DeepSpeed's own universal load refusing this layout: recorded (same on every rank), next job
                import traceback
                tb = traceback.extract_tb(e.__traceback__)[-1]
                where = f"{tb.filename[tb.filename.rfind('deepspeed/'):]}:{tb.lineno} ({tb.name})"
                # what it looked for: the model files of its own stage (runtime/engine.py:4383-4392, :4336-4360)
                tag = open(os.path.join(ckpt, "latest_universal")).read().strip()
                wanted = os.path.relpath(engine._get_ckpt_name(ckpt, tag, mp_placeholder="*", pp_placeholder="0"))
                if rank == 0:
                    write_json(os.path.join(out, "refused.json"),
                               {"error": f"{type(e).__name__}: {e}", "where": where, "looked_for": wanted,
                                "has": sorted(f for f in os.listdir(os.path.join(ckpt, tag)) if f.endswith(".pt"))})
                    print(f"ds_train_loop: {name}: load_checkpoint refused: {type(e).__name__}: {e} at {where}",
                          flush=True)
                del engine
                continue
            assert path is not None, f"{name}: nothing loaded from {ckpt}"
            record(torch, deepspeed, engine, case, ep, os.path.join(out, "loaded"), rank)
            losses = {}
            train(torch, engine, rank, a.world, 2, losses)
            record(torch, deepspeed, engine, case, ep, os.path.join(out, "after"), rank)
            write_json(os.path.join(out, f"losses_rank{rank}.json"), losses)
            if rank == 0:
                print(f"ds_train_loop: {name}: loaded {path} (DP {a.world}, ZeRO {zero}{', EP %d' % ep if ep else ''}"
                      f"{', load_universal' if universal else ''}), 2 more steps", flush=True)
            del engine


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, sort_keys=True)


def universal(a):
    env_defaults()
    import shutil
    import traceback
    from deepspeed.checkpoint import ds_to_universal
    for case in a.cases.split(","):
        src = os.path.join(a.out, case, "ckpt")
        tag = open(os.path.join(src, "latest")).read().strip()
        dsu = os.path.join(a.out, case, "dsu")
        shutil.rmtree(dsu, ignore_errors=True)
        os.makedirs(dsu)
        shutil.copy(os.path.join(src, "latest"), dsu)
        shutil.copytree(os.path.join(src, tag), os.path.join(dsu, tag))
        sys.argv = ["ds_to_universal.py", "--input_folder", os.path.join(dsu, tag), "--output_folder",
                    os.path.join(dsu, tag + "_universal"), "--inject_missing_state", "--num_extract_workers", "1",
                    "--num_merge_workers", "1"]
        res = {"case": case}
        try:
            ds_to_universal.main(ds_to_universal.parse_arguments())
            res["ok"] = True
        except Exception as e:  # DeepSpeed's refusal, recorded with where it was raised
            tb = traceback.extract_tb(e.__traceback__)[-1]
            package = os.path.dirname(os.path.dirname(ds_to_universal.__file__))
            res.update(ok=False, error=f"{type(e).__name__}: {e}",
                       where=f"{os.path.relpath(tb.filename, package)}:{tb.lineno} ({tb.name})")
        print("ds_to_universal: " + json.dumps(res), flush=True)


# ---- checks -------------------------------------------------------------------------------------------------------

def load(torch, path):
    return torch.load(path, map_location="cpu", weights_only=False)


def same_value(torch, x, y):
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                and x.shape == y.shape and torch.equal(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return list(x.keys()) == list(y.keys()) and all(same_value(torch, x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(same_value(torch, p, q) for p, q in zip(x, y))
    return type(x) is type(y) and (x == y or repr(x) == repr(y))


def same_universal(ours, theirs):
    import torch
    files = {}
    for u in (ours, theirs):
        for f in glob.glob(os.path.join(u, "zero", "*", "*.pt")):
            files.setdefault(os.path.relpath(f, u), set()).add(u)
    bad, identical, notes = [], 0, []
    # ds_to_universal's ZeRO-3 form has no step.pt (the step stays in zero/optimizer_state.pt,
    # checkpoint/ds_to_universal.py:1016 _save_optimizer_state_stage3); ucp-union writes one per parameter
    # (docs/ucp.md): it must hold that step.
    ours_only_steps = sorted(r for r in files if files[r] == {ours} and os.path.basename(r) == "step.pt")
    if ours_only_steps and not any(os.path.basename(r) == "step.pt" and theirs in files[r] for r in files):
        st = load(torch, os.path.join(theirs, "zero", "optimizer_state.pt"))["optimizer_state_dict"]["state"]
        theirs_steps = {float(v["step"]) for v in st.values()}
        ours_steps = {float(load(torch, os.path.join(ours, r))) for r in ours_only_steps}
        if len(theirs_steps) != 1 or ours_steps != theirs_steps:
            bad.append(f"step.pt {sorted(ours_steps)} vs the ZeRO-3 optimizer state's {sorted(theirs_steps)}")
        notes.append(f"{len(ours_only_steps)} step.pt ours only, equal to the step in its zero/optimizer_state.pt")
        for r in ours_only_steps:
            del files[r]
    for rel in ("zero/optimizer_state.pt",):
        if os.path.exists(os.path.join(ours, rel)) and os.path.exists(os.path.join(theirs, rel)):
            files[rel] = {ours, theirs}
    for rel in sorted(files):
        if len(files[rel]) != 2:
            bad.append(f"{rel} only in {''.join(files[rel])}")
            continue
        a, b = os.path.join(ours, rel), os.path.join(theirs, rel)
        if open(a, "rb").read() == open(b, "rb").read():
            identical += 1
        elif not same_value(torch, load(torch, a), load(torch, b)):
            bad.append(f"{rel} differs")
    params = {os.path.dirname(r) for r in files} - {"zero"}
    print(f"{len(params)} params, {len(files)} files ({', '.join(sorted({os.path.basename(r) for r in files}))}): "
          f"{len(bad)} differ, {identical} byte-identical" + "".join(f"; {n}" for n in notes) +
          (": " + "; ".join(bad[:6]) if bad else ""))
    return not bad and len(files) > 0


def merged(torch, folder):
    params, steps, gsteps = {}, set(), set()
    files = sorted(glob.glob(os.path.join(folder, "state_rank*.pt")))
    if not files:
        sys.exit(f"{folder}: no state_rank*.pt")
    for f in files:
        s = torch.load(f)
        steps.add(tuple(s["step"]))
        gsteps.add(s["global_steps"])
        for n, st in s["params"].items():
            missing = [k for k in STATE_KEYS if st[k] is None]
            if missing:
                sys.exit(f"{f}: {n} has no {missing}")
            if n in params and any(not torch.equal(params[n][k], st[k]) for k in STATE_KEYS):
                sys.exit(f"{f}: {n} differs between ranks")
            params[n] = st
    return params, sorted(steps), sorted(gsteps)


def union_state(u, state_dir):
    import torch
    params, steps, _ = merged(torch, state_dir)
    names = sorted(os.path.basename(d) for d in glob.glob(os.path.join(u, "zero", "*")) if os.path.isdir(d))
    if names != sorted(params):
        print(f"names differ from the engine's: {sorted(set(names) ^ set(params))[:6]}")
        return False
    bad = []
    for n in names:
        for k in ("fp32", "exp_avg", "exp_avg_sq"):
            x = load(torch, os.path.join(u, "zero", n, k + ".pt"))
            x = x["param"] if isinstance(x, dict) else x
            t = params[n][k]
            if x.dim() == 1 and t.dim() != 1:  # ZeRO-3's flat form (ds_to_universal's): the elements
                t = t.reshape(-1)
            if x.dtype != t.dtype or x.shape != t.shape or not torch.equal(x, t):
                bad.append(f"{n}/{k}")
        if not torch.equal(params[n]["weight"], params[n]["fp32"]):
            bad.append(f"{n}/weight")
        st = load(torch, os.path.join(u, "zero", n, "step.pt"))
        if steps != [(float(st),)]:
            bad.append(f"{n}/step {float(st)} vs {steps}")
    print(f"{len(names)} params x (fp32, exp_avg, exp_avg_sq, step): {len(bad)} differ, step {steps[0]}" +
          (": " + ", ".join(bad[:8]) if bad else ""))
    return not bad


def same_state(a, b):
    import torch
    pa, sa, ga = merged(torch, a)
    pb, sb, gb = merged(torch, b)
    bad = [f"{n} in one only" for n in sorted(set(pa) ^ set(pb))]
    bad += [f"{n}/{k}" for n in sorted(set(pa) & set(pb)) for k in STATE_KEYS if not torch.equal(pa[n][k], pb[n][k])]
    if sa != sb or ga != gb:
        bad.append(f"step {sa}/{ga} vs {sb}/{gb}")
    print(f"{len(pa)} params x (weight, fp32, exp_avg, exp_avg_sq), Adam step {sa[0] if len(sa) == 1 else sa}, "
          f"global step {ga}: {len(bad)} differ" + (": " + ", ".join(bad[:8]) if bad else ""))
    return not bad and len(pa) > 0


def close_state(a, b):
    """Two state records of different layouts after training on (the same micro-batches, gradients reduced in
    another order: DP 4 x 1 micro-batch against DP 2 x 2): same names and steps, every tensor within 1e-5 of the
    other's largest magnitude (a wrong moment or weight would be off by far more)."""
    import torch
    pa, sa, ga = merged(torch, a)
    pb, sb, gb = merged(torch, b)
    bad = [f"{n} in one only" for n in sorted(set(pa) ^ set(pb))]
    worst, exact, total = 0.0, 0, 0
    for n in sorted(set(pa) & set(pb)):
        for k in STATE_KEYS:
            x, y = pa[n][k], pb[n][k]
            total += 1
            if x.shape != y.shape:
                bad.append(f"{n}/{k} shape")
                continue
            exact += bool(torch.equal(x, y))
            rel = float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)) if x.numel() else 0.0
            worst = max(worst, rel)
            if rel > 1e-5:
                bad.append(f"{n}/{k} {rel:.2e}")
    if sa != sb or ga != gb:
        bad.append(f"step {sa}/{ga} vs {sb}/{gb}")
    print(f"{len(pa)} params x (weight, fp32, exp_avg, exp_avg_sq), Adam step {sa[0] if len(sa) == 1 else sa}: "
          f"{exact} of {total} tensors bit-equal, the largest difference {worst:.1e} of the tensor's largest value "
          f"(bound 1e-5): {len(bad)} beyond" + (": " + ", ".join(bad[:8]) if bad else ""))
    return not bad and total > 0


def losses(folder):
    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "losses_rank*.json"))):
        out.update(json.load(open(f)))
    return out


def step_losses(a, b, steps):
    la, lb = losses(a), losses(b)
    if steps:
        keep = set(steps.split(","))
        la = {k: v for k, v in la.items() if k.split(".")[0] in keep}
        lb = {k: v for k, v in lb.items() if k.split(".")[0] in keep}
    return la, lb


def same_losses(a, b, steps):
    la, lb = step_losses(a, b, steps)
    bad = sorted(k for k in set(la) | set(lb) if la.get(k) != lb.get(k))
    shown = ", ".join(f"{k} {float.fromhex(la[k]):.6f}" for k in sorted(la)[:2]) if la else ""
    print(f"{len(la)} micro-batch losses: {len(bad)} differ ({shown} ...)" +
          (": " + ", ".join(f"{k} {la.get(k)} vs {lb.get(k)}" for k in bad[:4]) if bad else ""))
    return not bad and len(la) > 0


def close_losses(a, b, steps):
    """Within 1e-5 of each other: losses after a step whose gradients were reduced in another order (another DP)."""
    la, lb = step_losses(a, b, steps)
    worst, bad, exact = 0.0, [], 0
    for k in sorted(set(la) | set(lb)):
        if k not in la or k not in lb:
            bad.append(k)
            continue
        x, y = float.fromhex(la[k]), float.fromhex(lb[k])
        exact += la[k] == lb[k]
        d = abs(x - y) / max(abs(y), 1e-30)
        worst = max(worst, d)
        if d > 1e-5:
            bad.append(k)
    print(f"{len(la)} micro-batch losses: {exact} bit-equal, the largest relative difference {worst:.1e} (bound 1e-5): "
          f"{len(bad)} beyond" + (": " + ", ".join(bad[:4]) if bad else ""))
    return not bad and len(la) > 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("--cases", default="dense,zero3,moe")
    r = sub.add_parser("resume")
    r.add_argument("--job", action="append", required=True)
    for p in (s, r):
        p.add_argument("--out", required=True)
        p.add_argument("--world", type=int, default=2)
        p.add_argument("--port", type=int, default=0, help="the rendezvous port (default: a free one)")
    u = sub.add_parser("universal")
    u.add_argument("--out", required=True)
    u.add_argument("--cases", default="dense,zero3,moe")
    c = sub.add_parser("check")
    c.add_argument("checks", nargs="+", metavar="LABEL|KIND|A|B[|STEPS]",
                   help="KIND: same-universal, union-state, same-state, close-state, same-losses or close-losses "
                        "(STEPS: 4,5)")
    a = ap.parse_args()
    env_defaults()
    if a.cmd in ("save", "resume"):
        if K % a.world:
            sys.exit(f"--world must divide {K}")
        # The ranks are forked (gloo_ranks): DeepSpeed imported here first, each starts with it (about 5 s of CPU a
        # rank when each imported it again).
        import deepspeed  # noqa: F401
        import gloo_ranks
        gloo_ranks.spawn(lambda rank, args, port: worker(rank, argparse.Namespace(**{**vars(args), "port": port})),
                         a, a.world, port=a.port)
    elif a.cmd == "universal":
        universal(a)
    else:
        fns = {"same-universal": same_universal, "union-state": union_state, "same-state": same_state,
               "close-state": close_state, "same-losses": same_losses, "close-losses": close_losses}
        failed = []
        for spec in a.checks:
            label, kind, *paths = spec.split("|")
            print(f"{label}: ", end="", flush=True)
            if kind in ("same-losses", "close-losses") and len(paths) == 2:
                paths.append(None)
            if not fns[kind](*paths):
                failed.append(label)
        if failed:
            print(f"not equal: {', '.join(failed)}")
        sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
