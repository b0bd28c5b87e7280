"""Reliability fixtures for "shards must agree" (issue 16 item 2): generated checkpoints (tests/generator/dsgen)
with one file changed in Python into a valid torch file that disagrees with the others. Each case is a
full checkpoint folder OUT/agree/<case>; OUT/agree/cases.json names the file that was changed and what
the tool must say about it. Called by tests/reliability/fixtures.py.

Facts the mutations follow (DeepSpeed, deepspeedai/DeepSpeed):
* ZeRO-1/2 optimizer state_dict, deepspeed/runtime/zero/stage_1_and_2.py:2594-2634: base_optimizer_state
  is the torch optimizer's state_dict ({'state': {group: {...}}, 'param_groups'}), group_paddings the
  padding at the end of this rank's partition (:472-483), param_slice_mappings per group name ->
  fragment_address(numel, start) (:720-730), covering the partition up to the padding.
* BF16_Optimizer keeps the padding inside single_partition_of_fp32_groups (deepspeed/runtime/
  bf16_optimizer.py:499-500): the room a hole needs to stay inside the file's tensors.
* Every file of one save repeats the step and the save's counters: DeepSpeed's common state
  (deepspeed/runtime/engine.py:4897-4919), Megatron's client state (megatron/checkpointing.py:255-258,
  deepspeedai/Megatron-DeepSpeed); a shard or model file of another step differs there."""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402  (registers DeepSpeed's class paths: torch.load/torch.save keep them)

GPT = dict(family="gpt", layers=2, hidden=32, heads=4, ffn=128, vocab=96, seq=16)


def gen(path, **layout):
    dsgen.generate(path, dsgen.ModelConfig(**GPT), dsgen.Layout(**layout), truth=False)
    return os.path.join(path, "global_step%d" % layout["step"])


def load(path):
    return torch.load(path, weights_only=False)


def save(obj, path):
    tmp = path + ".new"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def osd_of(path):
    sd = load(path)
    return sd, sd["optimizer_state_dict"]


def write(out):
    root = os.path.join(out, "agree")
    os.makedirs(root)
    src = os.path.join(root, "_src")
    # A: the checkpoint every case starts from; B: the same model and layout saved at another step by
    # another run (the file a job script could mix in from a neighbouring folder).
    a = gen(os.path.join(src, "a"), tp=2, pp=1, dp=3, zero=1, dtype="bf16", step=10, seed=3)
    b = gen(os.path.join(src, "b"), tp=2, pp=1, dp=3, zero=1, dtype="bf16", step=20, seed=5)
    bf = gen(os.path.join(src, "bf16opt"), tp=1, pp=1, dp=3, zero=1, dtype="bf16", bf16_optimizer=True, step=10, seed=3)
    z3a = gen(os.path.join(src, "z3a"), tp=1, pp=1, dp=2, zero=3, dtype="bf16", step=10, seed=3)
    z3b = gen(os.path.join(src, "z3b"), tp=1, pp=1, dp=2, zero=3, dtype="bf16", step=20, seed=5)
    cases = {}

    def case(name, base, changed, expect, mutate):
        """Copies checkpoint `base` to root/name, applies mutate(folder) to the file `changed`."""
        top = os.path.join(root, name)
        shutil.copytree(os.path.dirname(base), top)
        folder = os.path.join(top, os.path.basename(base))
        mutate(os.path.join(folder, changed))
        cases[name] = {"checkpoint": top, "file": changed, "expect": expect}

    opt = "bf16_zero_pp_rank_%d_mp_rank_%02d_optim_states.pt"

    # The clean checkpoint (control: converts with exit 0).
    case("clean", a, opt % (0, 0), "", lambda p: None)

    # DP rank 0 lost its optimizer state (every group): the planner took rank 0's (empty) state names
    # for the parameters it holds and the moments were dropped for them.
    def no_state(p):
        sd, osd = osd_of(p)
        osd["base_optimizer_state"]["state"] = {}
        save(sd, p)
    case("state_missing", a, opt % (0, 0), "optimizer state list of param group 0 is []", no_state)

    # DP rank 0's state of param group 1 filed under group id 2 (there are groups 0 and 1).
    def other_group(p):
        sd, osd = osd_of(p)
        st = osd["base_optimizer_state"]["state"]
        osd["base_optimizer_state"]["state"] = {0: st[0], 2: st[1]}
        save(sd, p)
    case("state_other_group", a, opt % (0, 0), "optimizer state is keyed under 2", other_group)

    # DP rank 0 lacks exp_avg in param group 0 (the planner took its state names for the group).
    def no_exp_avg(p):
        sd, osd = osd_of(p)
        del osd["base_optimizer_state"]["state"][0]["exp_avg"]
        save(sd, p)
    case("exp_avg_missing", a, opt % (0, 0), "optimizer state list of param group 0 is [exp_avg_sq, step]", no_exp_avg)

    # param_slice_mappings of DP rank 1: the second fragment of group 0 starts 2 elements early (it
    # overlaps the first; the fragments still add up to the parameters' sizes).
    def overlap(p):
        sd, osd = osd_of(p)
        m = osd["param_slice_mappings"][0]
        names = sorted(m, key=lambda n: m[n].start)
        assert len(names) >= 2 and m[names[1]].start >= 2
        m[names[1]] = dsgen.stubs.fragment_address(numel=m[names[1]].numel, start=m[names[1]].start - 2)
        save(sd, p)
    case("overlap", a, opt % (1, 0), "overlap", overlap)

    # BF16_Optimizer shard of the last DP rank: its last fragment moved by the group's padding, leaving
    # a hole before it (it still ends inside the fp32 partition, which keeps the padding).
    def hole(p):
        sd, osd = osd_of(p)
        for g, pad in enumerate(osd["group_paddings"]):
            m = osd["param_slice_mappings"][g]
            if pad > 0 and len(m) >= 2:
                last = max(m, key=lambda n: m[n].start)
                m[last] = dsgen.stubs.fragment_address(numel=m[last].numel, start=m[last].start + pad)
                assert m[last].start + m[last].numel <= osd["single_partition_of_fp32_groups"][g].numel()
                save(sd, p)
                return
        raise SystemExit("fixtures_shards: no group of %s has padding to move a fragment into" % p)
    case("hole", bf, "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt", "hole in param_slice_mappings", hole)

    # Files of another save (B, step 20, other values) mixed into A (step 10): the optimizer shards of
    # DP rank 1 (both TP ranks, so TP-replicated parameters still agree), a model file.
    def from_b(name):
        return lambda p: shutil.copyfile(os.path.join(b, name), p)

    def dp_rank_from_b(p):
        for t in (0, 1):
            shutil.copyfile(os.path.join(b, opt % (1, t)), os.path.join(os.path.dirname(p), opt % (1, t)))
    case("mixed_step_shard", a, opt % (1, 0), "optimizer step is 20", dp_rank_from_b)
    case("mixed_step_model", a, "mp_rank_01_model_states.pt", "iteration is 20", from_b("mp_rank_01_model_states.pt"))

    # One shard written by another DeepSpeed release (file root and optimizer_state_dict).
    def other_version(p):
        sd, osd = osd_of(p)
        sd["ds_version"] = osd["ds_version"] = "0.15.4"
        save(sd, p)
    case("ds_version", a, opt % (2, 0), "ds_version of the optimizer shards is '0.15.4'", other_version)

    # DP ranks 0 and 1 of TP rank 0 exchanged (the files of one save, each valid and complete): only
    # the flat order tells, a parameter cut at the partition boundary (mutation campaign `swap-files`).
    def exchange_dp01(p):
        folder = os.path.dirname(p)
        r0, r1 = os.path.join(folder, opt % (0, 0)), os.path.join(folder, opt % (1, 0))
        tmp = r0 + ".swap"
        os.rename(r0, tmp)
        os.rename(r1, r0)
        os.rename(tmp, r1)
    case("exchanged_ranks", a, opt % (1, 0), "rank files exchanged", exchange_dp01)

    # ZeRO-3: DP rank 1's optimizer shard and model file of another step.
    z3opt = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    case("zero3_mixed_step_shard", z3a, z3opt, "optimizer step is 20",
         lambda p: shutil.copyfile(os.path.join(z3b, z3opt), p))
    z3model = "zero_pp_rank_1_mp_rank_00_model_states.pt"
    case("zero3_mixed_step_model", z3a, z3model, "iteration is 20",
         lambda p: shutil.copyfile(os.path.join(z3b, z3model), p))

    # Issue 32 cause 3: a file of another run saved at the same step with the same layout and
    # configuration (seed 5 instead of 3: only tensor values differ; every identity field agrees). TP 1,
    # so no TP-replicated copy tells the runs apart; only the model file's module weights, which must
    # be the bf16 image of the fp32 masters, do.
    r1 = gen(os.path.join(src, "run1"), tp=1, pp=1, dp=2, zero=1, dtype="bf16", step=10, seed=3)
    r2 = gen(os.path.join(src, "run2"), tp=1, pp=1, dp=2, zero=1, dtype="bf16", step=10, seed=5)
    r1opt = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    case("other_run_clean", r1, r1opt, "", lambda p: None)
    case("other_run_shard", r1, r1opt, "but the fp32 master in",
         lambda p: shutil.copyfile(os.path.join(r2, r1opt), p))
    case("other_run_model", r1, "mp_rank_00_model_states.pt", "but the fp32 master in",
         lambda p: shutil.copyfile(os.path.join(r2, "mp_rank_00_model_states.pt"), p))

    # Issue 45, BAD 3: the same for a PipelineModule checkpoint (PP 2, layer files): its module weights
    # live in layer_XX-model_TT-model_states.pt, which the image check must index too. One layer file of
    # run 2 (the second one: a block) mixed into run 1, and one optimizer shard of run 2.
    p1 = gen(os.path.join(src, "prun1"), tp=1, pp=2, dp=2, zero=1, dtype="bf16", step=10, seed=3)
    p2 = gen(os.path.join(src, "prun2"), tp=1, pp=2, dp=2, zero=1, dtype="bf16", step=10, seed=5)
    layer = sorted(f for f in os.listdir(p1) if f.startswith("layer_"))[1]
    popt = "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt"
    case("pipe_other_run_clean", p1, layer, "", lambda p: None)
    case("pipe_other_run_layer", p1, layer, "but the fp32 master in",
         lambda p: shutil.copyfile(os.path.join(p2, layer), p))
    case("pipe_other_run_shard", p1, popt, "but the fp32 master in",
         lambda p: shutil.copyfile(os.path.join(p2, popt), p))

    shutil.rmtree(src)
    with open(os.path.join(root, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)


def write_pec_source(out):
    """A small native DeepSpeed MoE checkpoint (the input of pec-save in the store-manifest tests)."""
    cfg = dsgen.ModelConfig(family="dsmoe", layers=2, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=64, seq=16, experts=2)
    dsgen.generate(os.path.join(out, "moe"), cfg, dsgen.Layout(dp=2, ep=2, zero=1, dtype="bf16", step=10, seed=7),
                   truth=False)
