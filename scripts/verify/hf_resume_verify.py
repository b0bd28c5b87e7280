"""Outside CI (issue 49, training-ready import, Megatron half): the Python half of hf_resume_verify.sh.

    python hf_resume_verify.py make --out DIR --dtype bf16|fp32 [--family llama|mixtral]
        transformers' own save_pretrained (src/transformers/modeling_utils.py:3319 of the pinned 5.24.0; MoE
        experts written back per expert, :3540-3541) writes a small Llama (LlamaConfig / LlamaForCausalLM,
        weights drawn with a fixed seed as tests/frameworks/hf_models.py draws them) or Mixtral (MixtralConfig:
        4 experts of ffn 24 = mcore_ckpt's --moe-ffn default, top 2, models/mixtral/configuration_mixtral.py) whose
        config is the model mcore_ckpt.megatron_argv builds: hidden 16, 4 heads in 2 key-value groups, ffn 32,
        vocabulary 64, 2 layers, RMSNorm epsilon 1e-5 (Megatron's default --norm-epsilon,
        megatron/core/transformer/transformer_config.py:194-196 at core_v0.19.0), rope theta 10000 (Megatron's
        default --rotary-base, megatron/training/arguments.py:2335), 16 positions, untied, no biases.
    python hf_resume_verify.py reference --hf DIR --steps N <mcore_ckpt.py load options>
        the reference run: Megatron-LM's own GPTModel, optimizer and scheduler built fresh with the job's
        flags (mcore_ckpt.megatron_init + build: setup_model_and_optimizer, nothing loaded), the Hugging Face
        weights copied into it in memory by the mapping below (independent of ucpkit: q/k/v rows regrouped per
        query group, [gate; up], each TP rank its slice), the optimizer's fp32 main params refreshed from them
        with Megatron's own reload_model_params (what load_checkpoint does when it loads weights without an
        optimizer state, megatron/training/checkpointing.py:2611-2616 at core_v0.19.0), then N steps of
        Megatron's own train_step on the same seeded batches as `resume` (mcore_ckpt.real_train_steps).
        Prints the same lines as megatron_core_load_verify.py resume: "resumed iteration 0 (rank r), lr [...]"
        and each step's loss line.

    python hf_resume_verify.py resume --ckpt SAVE --steps N <mcore_ckpt.py load options>
        megatron_core_load_verify.py's `resume` (Megatron's own load_checkpoint with the job's flags as given,
        then the same N train steps) with two corrections of the CPU set-up, without which a resume can never
        equal a fresh run (the resume_ cases of torch_dist_verify.sh compare two loads, which share both):
        * Megatron-Core's DistributedOptimizer without Apex / Transformer Engine (torch.optim.AdamW, CPU)
          restores torch Adam's per-parameter `step` as ONE tensor shared by every parameter's state
          (megatron/core/optimizer/distrib_optimizer.py:1024-1032 at core_v0.19.0: `s["step"] = step` in a
          loop; torch's Optimizer.load_state_dict keeps a step tensor as it is, torch/optim/optimizer.py:831-835
          of torch 2.15), and AdamW increments each parameter's step in place: after one step every parameter's
          step is the number of parameters, not 1, and the bias correction is wrong from the first step with a
          non-zero learning rate. Each parameter gets its own copy after the load (megatron_core_load_verify.py
          unshare_adam_step, which the resume_ cases of torch_dist_verify.sh now get too; what a GPU run with Apex /
          TE FusedAdam, which keeps the step in the param group, computes).
        * mcore_ckpt's prime_torch_adam (a zero-gradient optimizer step that lets Megatron build the load-time
          sharded state dict of an empty torch Adam) is skipped when no optimizer state is loaded (--finetune,
          --no-load-optim, or a release checkpoint such as the import, whose optimizer state Megatron does not
          read: training/checkpointing.py:2555 at core_v0.19.0): its step would stay (step 1 before the first
          real step).

This file imports megatron_core_load_verify.py for its set-up of Megatron-LM on the pinned Python
(typing.override, six/yaml/regex, torch2lab's mcore_ckpt), so both files must sit together.
"""
import os
import re
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)

_REF = "HF_RESUME_VERIFY_REF"  # the Hugging Face folder, handed to the spawned ranks through the environment


def make(out, dtype, family="llama"):
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    kw = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=16, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False)
    if family == "mixtral":  # mcore_ckpt's MoE: 4 experts of ffn 24 (--moe-ffn), top 2, every layer MoE here
        config = MixtralConfig(intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, **kw)
        model = MixtralForCausalLM(config)
    else:
        config = LlamaConfig(intermediate_size=32, attention_bias=False, mlp_bias=False, **kw)
        model = LlamaForCausalLM(config)
    model = model.to(getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[dtype]))
    with torch.no_grad():
        for p in model.parameters():  # norms too: not the init's ones
            p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out)
    print("made %s: LlamaForCausalLM, %d tensors, %s" % (out, len(model.state_dict()), dtype), flush=True)


def megatron_shards(hf, args, tp_rank, tp, ep_rank=0, ep=1):
    """The Megatron-Core local-spec parameters of TP rank tp_rank, from the Hugging Face tensors `hf`.
    linear_qkv: per query group g, its heads/groups query heads, one key head, one value head
    (megatron/core/transformer/attention.py get_query_key_value_tensors splits each group's rows so);
    linear_fc1 with --swiglu: [gate; up] of this rank's ffn slice (megatron/core/transformer/mlp.py, the
    swiglu sharded factory of its sharded_state_dict: each TP rank holds its slice of both halves);
    column-parallel (qkv, fc1, embedding and output rows) split by rows, row-parallel (proj, fc2) by columns.
    MoE (Mixtral, every layer; the local spec's SequentialMLP, TP 1): the router is the block's `gate`, local
    expert i of EP rank r is expert r * E / ep + i (megatron/core/transformer/moe/experts.py SequentialMLP,
    local_expert_indices), its linear_fc1 [w1; w3] and linear_fc2 w2."""
    import torch

    heads, groups, hidden = args.num_attention_heads, args.num_query_groups, args.hidden_size
    hd = args.kv_channels
    per = heads // groups
    g0, g1 = tp_rank * groups // tp, (tp_rank + 1) * groups // tp

    def rows(t, r):
        n = t.shape[0] // tp
        return t[r * n:(r + 1) * n]

    def cols(t, r):
        n = t.shape[1] // tp
        return t[:, r * n:(r + 1) * n]

    out = {"embedding.word_embeddings.weight": rows(hf["model.embed_tokens.weight"], tp_rank),
           "output_layer.weight": rows(hf["lm_head.weight"], tp_rank),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    for L in range(args.num_layers):
        h = "model.layers.%d." % L
        m = "decoder.layers.%d." % L
        q = hf[h + "self_attn.q_proj.weight"].reshape(heads, hd, hidden)
        k = hf[h + "self_attn.k_proj.weight"].reshape(groups, hd, hidden)
        v = hf[h + "self_attn.v_proj.weight"].reshape(groups, hd, hidden)
        qkv = [torch.cat([q[g * per:(g + 1) * per], k[g:g + 1], v[g:g + 1]]) for g in range(g0, g1)]
        out[m + "self_attention.linear_qkv.weight"] = torch.cat(qkv).reshape(-1, hidden)
        out[m + "self_attention.linear_proj.weight"] = cols(hf[h + "self_attn.o_proj.weight"], tp_rank)
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        if args.num_experts:
            b = h + "block_sparse_moe."
            out[m + "mlp.router.weight"] = hf[b + "gate.weight"]
            per_rank = args.num_experts // ep
            for i in range(per_rank):
                e = ep_rank * per_rank + i
                x = m + "mlp.experts.local_experts.%d." % i
                out[x + "linear_fc1.weight"] = torch.cat([hf[b + "experts.%d.w1.weight" % e], hf[b + "experts.%d.w3.weight" % e]])
                out[x + "linear_fc2.weight"] = hf[b + "experts.%d.w2.weight" % e]
            continue
        out[m + "mlp.linear_fc1.weight"] = torch.cat([rows(hf[h + "mlp.gate_proj.weight"], tp_rank),
                                                      rows(hf[h + "mlp.up_proj.weight"], tp_rank)])
        out[m + "mlp.linear_fc2.weight"] = cols(hf[h + "mlp.down_proj.weight"], tp_rank)
    return out


def _reference(rank, world, o):
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.utils import unwrap_model
    from safetensors.torch import load_file

    mcore_ckpt = mv.mcore_ckpt
    args = mcore_ckpt.megatron_init(o)  # no --load: setup_model_and_optimizer loads nothing
    model, optimizer, sched = mcore_ckpt.build(args)
    args.iteration = 0
    hf = load_file(os.path.join(os.environ[_REF], "model.safetensors"))
    shards = megatron_shards(hf, args, ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(),
                             ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size())
    # A pipeline stage holds its layers under local numbers (the first of stage s is s * layers / PP with
    # Megatron's even split, transformer_layer.py get_transformer_layer_offset), the embedding on the first
    # stage, the final norm and output layer on the last (untied).
    pp_rank, pp = ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size()
    per_stage = args.num_layers // pp
    first = pp_rank * per_stage

    def layer_of(name):  # (layer number, the rest of the name), or None outside the layer stack
        m = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
        return (int(m.group(1)), m.group(2)) if m else None

    def stage_name(name):
        lr = layer_of(name)
        return "decoder.layers.%d.%s" % (lr[0] + first, lr[1]) if lr else name

    def on_stage(name):
        lr = layer_of(name)
        if lr:
            return first <= lr[0] < first + per_stage
        return pp_rank == 0 if name.startswith("embedding.") else pp_rank == pp - 1

    shards = {n: t for n, t in shards.items() if on_stage(n)}
    done = set()
    with torch.no_grad():
        for chunk in unwrap_model(model):
            for local, p in chunk.named_parameters():
                name = stage_name(local)
                if name not in shards:
                    raise SystemExit("reference: no Hugging Face tensor for Megatron's %s" % name)
                t = shards[name]
                if tuple(t.shape) != tuple(p.shape):
                    raise SystemExit("reference: %s is %s here, %s from Hugging Face" % (name, tuple(p.shape), tuple(t.shape)))
                p.data.copy_(t.to(p.dtype))
                done.add(name)
    left = sorted(set(shards) - done)
    if left:
        raise SystemExit("reference: Hugging Face tensors Megatron has no parameter for: %s" % left)
    # The main (fp32) params were made from the init's weights when the optimizer was built: refresh them
    # from the copied weights, as load_checkpoint does after loading weights alone (checkpointing.py:2611-2616).
    optimizer.reload_model_params()
    lrs = sorted({g["lr"] for g in optimizer.param_groups})
    print("resumed iteration %d (rank %d), lr %s" % (args.iteration, rank, lrs), flush=True)
    print("reference: %d Megatron parameters set from the Hugging Face weights (rank %d)" % (len(done), rank), flush=True)
    if rank == 0:
        print("transformers' own loss of the first batch: %.9g (fp32)" % hf_loss(args), flush=True)
    mcore_ckpt.real_train_steps(args, model, optimizer, sched, o.steps)


def hf_loss(args):
    """The loss transformers' own model (AutoModelForCausalLM: Llama or Mixtral; from_pretrained of the folder, fp32) computes on the first
    step's micro-batches, drawn as mcore_ckpt.real_train_steps draws them: a check of the reference mapping
    that does not go through it (Megatron computes in the model dtype, so close, not equal)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.environ[_REF], dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(args.seed)
    losses = []
    with torch.no_grad():
        # Each data-parallel rank draws the same batches from the same seed (mcore_ckpt.real_train_steps), so
        # a step's loss is that of its first global_batch_size / (micro_batch_size x DP) micro-batches.
        for _ in range(args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)):
            tok = torch.randint(0, args.padded_vocab_size, (args.micro_batch_size, args.seq_length + 1), generator=g)
            logits = model(tok[:, :-1]).logits.float()
            losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tok[:, 1:].reshape(-1),
                                                            reduction="none"))
    return float(torch.cat(losses).mean())


def _reads_optimizer(o):
    """Whether Megatron's load_checkpoint reads the save's optimizer state: not with --finetune or
    --no-load-optim, nor from a release checkpoint (training/checkpointing.py:2555 at core_v0.19.0)."""
    tracker = os.path.join(o.ckpt, "latest_checkpointed_iteration.txt")
    release = os.path.exists(tracker) and open(tracker).read().strip() == "release"
    return not (o.no_load_optim or "--finetune" in (o.extra or []) or release)


def _te_spec_keys():
    """The job asks for the Transformer Engine GPT layer spec's keys (UCPKIT_TE_KEYS=1): an MoE layer keeps its
    pre-MLP norm as the module pre_mlp_layernorm, which the local spec's sharded_state_dict_keys_map stores as
    mlp.linear_fc1.layer_norm_* (models/gpt/gpt_layer_specs.py at core_v0.19.0). Transformer Engine needs a GPU, so
    the local spec's layers drop that one map entry; the other keys of the two specs agree for this model."""
    from megatron.core.transformer import transformer_layer

    init = transformer_layer.TransformerLayer.__init__

    def te_keys_init(self, *a, **k):
        init(self, *a, **k)
        if type(self.mlp).__name__ == "MoELayer":
            m = self.submodules_config.sharded_state_dict_keys_map
            self.submodules_config.sharded_state_dict_keys_map = {x: y for x, y in m.items() if x != "pre_mlp_layernorm."}

    transformer_layer.TransformerLayer.__init__ = te_keys_init


def _resume(rank, world, o):
    if os.environ.get("UCPKIT_TE_KEYS") == "1":
        _te_spec_keys()
    if not _reads_optimizer(o):
        mv.mcore_ckpt.prime_torch_adam = lambda optimizer: None
    mv._resume(rank, world, o)  # with its unshare_adam_step


if __name__ == "__main__" or __name__ == "__mp_main__":
    if sys.argv[1:2] == ["make"]:
        import argparse

        p = argparse.ArgumentParser()
        p.add_argument("cmd")
        p.add_argument("--out", required=True)
        p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
        p.add_argument("--family", choices=["llama", "mixtral"], default="llama")
        a = p.parse_args()
        make(a.out, a.dtype, a.family)
    else:
        import megatron_core_load_verify as mv  # noqa: E402  (Megatron-LM on the pinned Python, mcore_ckpt)

        if __name__ == "__main__" and sys.argv[1:2] == ["reference"]:
            i = sys.argv.index("--hf")
            os.environ[_REF] = os.path.abspath(sys.argv[i + 1])
            del sys.argv[i:i + 2]
            sys.argv[1] = "load"  # mcore_ckpt's load arguments, _reference instead of its _load
            mv.mcore_ckpt._load = _reference
            mv.mcore_ckpt.main()
        elif __name__ == "__main__" and sys.argv[1:2] == ["resume"]:
            sys.argv[1] = "load"
            mv.mcore_ckpt._load = _resume
            mv.mcore_ckpt.main()
