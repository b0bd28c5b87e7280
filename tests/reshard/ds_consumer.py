"""An independent consumer of ucp-load's output: reads a target checkpoint the way DeepSpeed and
Megatron-DeepSpeed do when a training job resumes from it, re-implemented from their sources (never
imported; file:line below, deepspeedai/DeepSpeed v0.19.5-27 edaa722, deepspeedai/Megatron-DeepSpeed
4efb479), and checks every tensor it would load against the ground truth.

Usage: /usr/bin/python3 ds_consumer.py <target_ckpt> <universal_dir> <ref_ckpt> <source_truth_dir>
  <ref_ckpt>/truth/meta.json gives the target layout and the model configuration (dsgen); the
  expected tensors are the source truth's universal tensors, re-padded and TP-sliced.
Exit 0 when every check passes, 1 with the failures listed.

What it does, per target layout:
1. Storage tags: every file under <universal_dir>/zero is read by DeepSpeed's universal loader with a
   bare torch.load (checkpoint/universal_checkpoint.py:164), so every storage must be tagged "cpu"
   (ds_to_universal writes them from map_location='cpu' loads, ds_to_universal.py:177, :331, :873-883);
   every target file must load on this CPU-only host without map_location.
2. Model-states lookup: engine._load_checkpoint (runtime/engine.py:4425-4446) globs
   mp_rank_*_model_states.pt (engine.py:4259-4269, sorted); MegatronSDLoader.check_ckpt_list
   (runtime/state_dict_factory.py:166-175) asserts the count equals the first file's mp_world_size; the
   loader then takes file mp_rank * num_ckpt // mp_world_size (state_dict_factory.py:67) with the
   engine's mp_world_size: PP x TP under the PipelineEngine (pipe/topology.py:304-313, the grid's
   model group is every rank of one data index, mp rank = pp * tp + tp_rank), TP otherwise.
3. Module weights:
   * non-pipeline: Megatron's GPTModel.load_state_dict (megatron/model/gpt_model.py:285-301) takes
     state_dict['language_model'], TransformerLanguageModel.load_state_dict (language_model.py:650-
     726) its 'embedding' / 'encoder' / 'output_layer' entries, Embedding.load_state_dict
     (language_model.py:287-313) 'word_embeddings' / 'position_embeddings'; each is an nn.Module
     strict load: exactly the module's keys, the module's (target TP) shapes; the saved dtype must be
     the target's (what a bf16/fp16 module saves).
   * pipeline: PipelineModule._partition_layers with 'type:transformer' (pipe/module.py:412-417;
     GPTModelPipe passes it, gpt_model.py:463) -> ds_utils.partition_balanced (runtime/utils.py:627-667)
     gives each stage its spec range; load_state_dir (pipe/module.py:645-668) looks up every spec that
     has a state_dict with ckpt_layer_path_list: glob('layer_{idx:02d}-*model_states.pt'), sorted
     (module.py:598-605), then loads the TP rank's file (state_dict_factory.py:67, slice world size)
     with a strict load of the layer's module.
   The spec indices are GPTModelPipe's (dsgen/models.py PIPE_NUMBERING, both forks).
4. ZeRO partitions, positionally: DeepSpeed builds its flat groups from the optimizer's param groups,
   i.e. Megatron's get_param_groups (megatron/optimizer/__init__.py:18-66: module.named_parameters()
   order, no weight decay for '.bias' or 1-D, groups wd then no-wd, empty ones dropped), over the
   stage's module, whose named_parameters list `tied_modules` first (pipe/module.py:196 before
   :255/:277). Each group is flattened in that order and padded to a multiple of 2 * dp
   (nccl_start_alignment_factor, zero/stage_1_and_2.py:347, :439-447; bf16_optimizer.py:90, :155).
   _load_legacy_checkpoint (stage_1_and_2.py:2781-2866; bf16_optimizer.py:533-552) takes the file of
   its DP rank and copies single_partition_of_fp32_groups[i] (padded, _get_padded_tensor) and the base
   optimizer state (optimizer.load_state_dict) by position; param_slice_mappings are not used. So
   partition d of group i must equal the truth's flat buffer [d * P, (d + 1) * P) for fp32, exp_avg
   and exp_avg_sq.
ZeRO-3 targets and native MoE are left to compare_target.py (their DeepSpeed loaders use other paths).
"""
import glob
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "generator"))
import dsgen  # noqa: E402  (registers the DeepSpeed stand-in classes for unpickling)
from dsgen import models as dsmodels  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
STATES = ("fp32", "exp_avg", "exp_avg_sq")
FAIL = []


def fail(msg):
    if len(FAIL) < 60:
        FAIL.append(msg)


def locations(path):
    """Storage location tags of a torch.save file (map_location sees each storage's saved tag)."""
    tags = []

    def ml(storage, loc):
        tags.append(loc)
        return storage
    torch.load(path, map_location=ml, weights_only=False)
    return tags


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


# ------------------------------------------------------------------ expected tensors

class Truth:
    def __init__(self, truth_dir, model, tp):
        with open(os.path.join(truth_dir, "meta.json")) as f:
            self.meta = json.load(f)
        self.dir = truth_dir
        self.vocab = self.meta["model"]["vocab"]
        self.model = model  # dsgen Model for the target TP (padded vocab, kinds, sub-param sizes)
        self.tp = tp
        self.cache = {}

    def universal(self, name, state):
        key = (name, state)
        if key not in self.cache:
            t = load(os.path.join(self.dir, "universal", "zero", name, state + ".pt"))
            shape = next(p["shape"] for p in self.meta["params"] if p["name"] == name)
            if isinstance(t, dict):
                t = t["param"]
            else:  # ds_to_universal's ZeRO-3 TP = 1 form: flat, vocabulary padding kept
                t = t.reshape(-1, *shape[1:]) if shape else t.reshape(())
            self.cache[key] = t
        return self.cache[key]

    def slice(self, p, state, t):
        """Megatron's TP slice t of parameter p of the target (fp32), vocabulary re-padded with zeros."""
        full = self.universal(p.name, state).float()
        if p.vocab:
            full = full[:self.vocab]
            pad = torch.zeros((p.shape[0] - full.shape[0],) + tuple(full.shape[1:]))
            full = torch.cat([full, pad], 0)
        tp = self.tp
        if p.kind in ("replicate", "average"):
            return full
        if p.kind == "col":
            return full.chunk(tp, 0)[t]
        if p.kind == "row":
            return full.chunk(tp, 1)[t]
        if p.kind == "swiglu":
            a, b = full.chunk(2, 0)
            return torch.cat([a.chunk(tp, 0)[t], b.chunk(tp, 0)[t]], 0)
        if p.kind == "subparams":
            return torch.cat([x.chunk(tp, 0)[t] for x in torch.split(full, list(p.subs), 0)], 0)
        raise ValueError(p.kind)


def check_tensor(what, got, exp, dtype=None):
    if not torch.is_tensor(got):
        fail(f"{what}: not a tensor ({type(got).__name__})")
        return
    if tuple(got.shape) != tuple(exp.shape):
        fail(f"{what}: shape {tuple(got.shape)}, the module expects {tuple(exp.shape)}")
        return
    if dtype is not None and got.dtype != dtype:
        fail(f"{what}: dtype {got.dtype}, the target saves {dtype}")
        return
    if not torch.equal(got, exp.to(got.dtype)):
        d = (got.float() - exp.float()).abs().max().item()
        fail(f"{what}: values differ from the truth (max abs diff {d})")


# ------------------------------------------------------------------ DeepSpeed re-implementations

def partition_uniform(n, parts):
    """runtime/utils.py:606-624."""
    if n <= parts:
        return [min(p, n) for p in range(parts + 1)]
    chunk, residual = divmod(n, parts)
    out = [p * chunk for p in range(parts + 1)]
    for i in range(residual):
        for j in range(i + 1, parts + 1):
            out[j] += 1
    return out


def partition_balanced(weights, parts):
    """runtime/utils.py:627-667: the linear partition minimizing max - min part weight; on ties the
    last split point examined wins (`>=`)."""
    n, m = len(weights), parts
    if n <= m:
        return partition_uniform(n, m)
    inf = float("inf")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    dmax = [[inf] * (m + 1) for _ in range(n + 1)]
    dmin = [[inf] * (m + 1) for _ in range(n + 1)]
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    pos = [[0] * (m + 1) for _ in range(n + 1)]
    dmax[0][0] = 0
    cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                s = prefix[i] - prefix[k]
                hi, lo = max(dmax[k][j - 1], s), min(dmin[k][j - 1], s)
                if cost[i][j] >= hi - lo:
                    cost[i][j], dmax[i][j], dmin[i][j], pos[i][j] = hi - lo, hi, lo, k
    out = [n]
    for i in reversed(range(1, m + 1)):
        out.append(pos[out[-1]][i])
    return list(reversed(out))


def gpt_pipe_specs(cfg, dtype):
    """GPTModelPipe's spec list: (kind, layer index) with kind fn | embed | block | norm | head."""
    first, gap = dsmodels.PIPE_NUMBERING[cfg["pipe_numbering"]]
    specs = [("fn", 0), ("embed", 1)]
    specs += [("fn", i) for i in range(2, first)]
    specs += [("block", first + i) for i in range(cfg["layers"])]
    after = first + cfg["layers"]
    specs += [("fn", after + i) for i in range(gap)]
    specs += [("norm", after + gap), ("head", after + gap + 1)]
    if dtype in ("fp16", "bf16"):  # float16_to_fp32 (gpt_model.py:438-439)
        specs.append(("fn", after + gap + 2))
    return specs


def megatron_groups(named):
    """megatron/optimizer/__init__.py:18-66 (no scale-lr condition): wd, then no-wd, empty dropped."""
    wd = [(n, p) for n, p in named if not (n.endswith(".bias") or len(p.shape) == 1)]
    no = [(n, p) for n, p in named if (n.endswith(".bias") or len(p.shape) == 1)]
    return [g for g in (wd, no) if g]


# ------------------------------------------------------------------ the checks

def check_tags(universal, target_tag_dir):
    """One line per folder: how many files carry non-cpu tags, and the first of them."""
    bad_u = []
    for f in sorted(glob.glob(os.path.join(universal, "zero", "**", "*.pt"), recursive=True)):
        bad = sorted({t for t in locations(f) if t != "cpu"})
        if bad:
            bad_u.append(f"{os.path.relpath(f, universal)} {bad}")
    if bad_u:
        fail(f"universal: {len(bad_u)} files with non-cpu storage tags (first: {bad_u[0]}); DeepSpeed's universal "
             f"loader calls torch.load without map_location (universal_checkpoint.py:164)")
    bad_t = []
    for f in sorted(os.listdir(target_tag_dir)):
        bad = sorted({t for t in locations(os.path.join(target_tag_dir, f)) if t != "cpu"})
        if bad:
            bad_t.append(f"{f} {bad}")
    if bad_t:
        fail(f"target: {len(bad_t)} files with non-cpu storage tags (first: {bad_t[0]}), not loadable without that GPU")


def main():
    target, universal, ref, truth_dir = sys.argv[1:5]
    with open(os.path.join(ref, "truth", "meta.json")) as f:
        meta = json.load(f)
    lay, cfg = meta["layout"], meta["model"]
    tp, pp, dp = lay["tp"], lay["pp"], lay["dp"]
    dtype = DTYPES[lay["dtype"]]
    model = dsmodels.build(dsmodels.ModelConfig(**cfg), tp, pp)
    truth = Truth(truth_dir, model, tp)
    tag = open(os.path.join(target, "latest")).read().strip()
    ck = os.path.join(target, tag)
    check_tags(universal, ck)
    if lay["zero"] == 3 or cfg["family"] == "dsmoe":
        report(0)
        return

    # 2. model-states lookup
    ckpt_list = sorted(glob.glob(os.path.join(ck, "mp_rank_*_model_states.pt")))
    first = load(ckpt_list[0])
    if len(ckpt_list) != first.get("mp_world_size"):
        fail(f"check_ckpt_list: checkpoint count {len(ckpt_list)} is different from saved mp_world_size "
             f"{first.get('mp_world_size')} (state_dict_factory.py:174)")
    engine_mp = tp * pp if model.pipe else tp
    if len(ckpt_list) != engine_mp:
        fail(f"{len(ckpt_list)} mp_rank files but the engine's mp_world_size is {engine_mp}")

    by_name = {p.name: p for p in model.params}
    pipe_order = None
    if model.pipe:
        specs = gpt_pipe_specs(cfg, lay["dtype"])
        parts = partition_balanced([1 if k == "block" else 0 for k, _ in specs], pp)
        tied = [p for p in model.params if p.name.startswith("tied_modules.") and p.stage == 0]
        pipe_order = []
        for s in range(pp):
            mine = specs[parts[s]:parts[s + 1]]
            names = []
            if any(k == "embed" or (k == "head" and cfg["tied"]) for k, _ in mine):
                names += [p.name for p in tied]  # tied_modules registered first (pipe/module.py:196)
            for k, idx in mine:
                if k in ("block", "norm") or (k == "head" and not cfg["tied"]) or (k == "embed" and not tied):
                    names += [p.name for p in model.params if p.layer == idx and not p.name.startswith("tied_modules.")]
            pipe_order.append((mine, names))

    for s in range(pp):
        for t in range(tp):
            mp = s * tp + t
            # state_dict_factory.py:67: idx = mp_rank * num_ckpt // mp_world_size
            path = ckpt_list[mp * len(ckpt_list) // engine_mp] if ckpt_list else None
            if path is None or os.path.basename(path) != f"mp_rank_{mp:02d}_model_states.pt":
                fail(f"mp rank {mp}: the loader picks {path}")
                continue
            sd = load(path)
            if model.pipe:
                if sd.get("module") is not None:
                    fail(f"{os.path.basename(path)}: module should be None under the PipelineEngine")
                mine, names = pipe_order[s]
                check_layer_files(ck, mine, t, tp, truth, by_name, dtype, cfg)
            else:
                names = [p.name for p in model.params]
                check_megatron_module(os.path.basename(path), sd["module"], t, truth, by_name, dtype, cfg)
            named = [(n, by_name[n]) for n in names]
            check_partitions(ck, mp, t, dp, lay, truth, megatron_groups(named), sd)
    report(len(ckpt_list))


def check_layer_files(ck, mine, t, tp, truth, by_name, dtype, cfg):
    for kind, idx in mine:
        if kind == "fn":
            continue
        files = sorted(glob.glob(os.path.join(ck, f"layer_{idx:02d}-*model_states.pt")))  # module.py:598-605
        if len(files) != tp:
            fail(f"layer {idx} ({kind}): ckpt_layer_path_list finds {len(files)} files, {tp} TP ranks expect one each")
            continue
        f = files[t * len(files) // tp]
        sd = load(f)
        if kind in ("embed", "head") and (cfg["tied"] or kind == "embed") and any(
                n.startswith("tied_modules.") for n in by_name):
            exp = {p.local: p for p in by_name.values() if p.name.startswith("tied_modules.")}
        else:
            exp = {p.local: p for p in by_name.values() if p.layer == idx and not p.name.startswith("tied_modules.")}
        strict_load(os.path.basename(f), sd, exp, t, truth, dtype)


def strict_load(what, sd, exp, t, truth, dtype):
    """nn.Module.load_state_dict(strict=True): the same keys, the module's shapes."""
    keys = list(sd.keys()) if isinstance(sd, dict) else []
    if set(keys) != set(exp):
        fail(f"{what}: strict load: missing {sorted(set(exp) - set(keys))}, unexpected {sorted(set(keys) - set(exp))}")
    for k, p in exp.items():
        if k in sd:
            check_tensor(f"{what}[{k}]", sd[k], truth.slice(p, "fp32", t).to(dtype), dtype)


def check_megatron_module(what, module, t, truth, by_name, dtype, cfg):
    """GPTModel -> TransformerLanguageModel -> Embedding / ParallelTransformer load paths."""
    if not isinstance(module, dict):
        fail(f"{what}: module is {type(module).__name__}")
        return
    lm = module["language_model"] if "language_model" in module else module  # gpt_model.py:297-298
    extra = [k for k in module if k != "language_model"]
    if extra:
        fail(f"{what}: module has entries Megatron never reads beside language_model: {extra[:4]}")
    emb = lm.get("embedding")
    if emb is None:  # language_model.py:660-663 backward compatibility: keys with '_embeddings'
        emb = {k: v for k, v in lm.items() if "_embeddings" in k}
    for sub in ("word_embeddings", "position_embeddings"):
        name = f"language_model.embedding.{sub}.weight"
        if name not in by_name:
            continue
        if sub in emb:
            sd = emb[sub]
        else:  # language_model.py:293-299
            sd = {k.split(sub + ".")[1]: v for k, v in emb.items() if sub in k}
        strict_load(f"{what}:language_model.embedding.{sub}", sd, {"weight": by_name[name]}, t, truth, dtype)
    enc = lm.get("encoder")
    if enc is None:
        enc = lm.get("transformer", {k.split("transformer.")[1]: v for k, v in lm.items() if "transformer." in k})
    exp = {p.name[len("language_model.encoder."):]: p for p in by_name.values()
           if p.name.startswith("language_model.encoder.")}
    strict_load(f"{what}:language_model.encoder", enc, exp, t, truth, dtype)
    if not cfg["tied"]:
        if "output_layer" not in lm:
            fail(f"{what}: could not find data for output_layer in the checkpoint (language_model.py:718-720)")
        else:
            strict_load(f"{what}:language_model.output_layer", lm["output_layer"],
                        {"weight": by_name["language_model.output_layer.weight"]}, t, truth, dtype)


def check_partitions(ck, mp, t, dp, lay, truth, groups, model_sd):
    prefix = "bf16_" if lay["dtype"] == "bf16" else ""
    flats = []
    for g in groups:
        per_state = {}
        for state in STATES:
            flat = torch.cat([truth.slice(p, state, t).reshape(-1) for _, p in g])
            align = 2 * dp
            padded = (flat.numel() + align - 1) // align * align
            per_state[state] = torch.cat([flat, torch.zeros(padded - flat.numel())])
        flats.append(per_state)
    # param_shapes is what DeepSpeed checks against its own module when loading universal checkpoints
    ps = [[k for k in grp] for grp in model_sd.get("param_shapes", [])]
    if ps and ps != [[n for n, _ in g] for g in groups]:
        fail(f"mp {mp}: param_shapes order {ps} differs from the module's parameter order "
             f"{[[n for n, _ in g] for g in groups]}")
    for d in range(dp):
        f = os.path.join(ck, f"{prefix}zero_pp_rank_{d}_mp_rank_{mp:02d}_optim_states.pt")
        if not os.path.exists(f):
            fail(f"{os.path.basename(f)}: missing")
            continue
        osd = load(f)["optimizer_state_dict"]
        base = osd["base_optimizer_state"]
        if not isinstance(base, dict):
            fail(f"{os.path.basename(f)}: base_optimizer_state is not a rigid state dict")
            continue
        if len(osd["single_partition_of_fp32_groups"]) != len(groups) or len(base["param_groups"]) != len(groups):
            fail(f"{os.path.basename(f)}: {len(osd['single_partition_of_fp32_groups'])} groups, the module has "
                 f"{len(groups)}")
            continue
        for i in range(len(groups)):
            P = flats[i]["fp32"].numel() // dp
            lo, hi = d * P, (d + 1) * P
            saved = osd["single_partition_of_fp32_groups"][i]
            if saved.numel() > P:
                fail(f"{os.path.basename(f)} group {i}: fp32 partition {saved.numel()} > {P}")
                continue
            padded = torch.cat([saved.float(), torch.zeros(P - saved.numel())])  # _get_padded_tensor
            check_tensor(f"{os.path.basename(f)} group {i} fp32 (positional)", padded, flats[i]["fp32"][lo:hi])
            st = base["state"].get(i, {})
            for state in ("exp_avg", "exp_avg_sq"):
                if state not in st:
                    fail(f"{os.path.basename(f)} group {i}: no {state}")
                    continue
                check_tensor(f"{os.path.basename(f)} group {i} {state} (positional)", st[state], flats[i][state][lo:hi])


def report(n):
    if FAIL:
        print("\n".join(FAIL))
        sys.exit(1)
    print(f"ds_consumer: {n} model-parallel files load as DeepSpeed/Megatron would read them")


if __name__ == "__main__":
    main()
