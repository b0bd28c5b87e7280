"""Native DeepSpeed MoE (Megatron-DeepSpeed GPT-MoE, ZeRO-1/2) model-state files for each DeepSpeed
version line of shared/docs/deepspeed-moe-format.md section 8. Line numbers are deepspeedai/DeepSpeed
at the named tag and deepspeedai/Megatron-DeepSpeed 4efb479d. The same table lives in C++ in
lib/formats/deepspeed/version_line.cpp (written independently from the sources, not from this file)."""
import collections
import os

import torch

# name -> what _save_moe_checkpoint writes in that line
LINES = {
    # v0.16.5 deepspeed/runtime/engine.py:3346-3453 (v0.14.0 :3165-3269): state = {...} :3428-3451,
    # tensors saved as they are (module: views into the ZeRO flat lp buffer), expert files
    # experts_state_dict = defaultdict(dict) :3373 with .clone().detach() :3388, expp :3410-3416.
    "0.14": dict(metadata=True, compact=False, common=False, autoep=False, expp=True, version="0.16.5"),
    # v0.17.1 engine.py:3483,3505,3545: clone_tensors_for_torch_save (checkpoint/utils.py:41-65):
    # compact CPU copies, dicts rebuilt with type(d)({...}) so `_metadata` is gone.
    "0.17.1": dict(metadata=False, compact=True, common=False, autoep=False, expp=True, version="0.17.1"),
    # v0.19.2 engine.py:4377-4402: 'ds_autoep_layers': None after 'num_experts' (:4401).
    "0.19.2": dict(metadata=False, compact=True, common=False, autoep=True, expp=True, version="0.19.2"),
    # v0.19.3 engine.py:4988-4990: state = _common_checkpoint_state(...) (:4705-4726) then num_experts,
    # ds_autoep_layers; expp file still written under ZeRO (:4933-4949).
    "0.19.3": dict(metadata=False, compact=True, common=True, autoep=True, expp=True, version="0.19.3"),
    # v0.19.5 engine.py:5066-5087: the expp file only without ZeRO; mp_rank as 0.19.3 (:5124-5126) plus
    # checkpoint_parallel_dimensions {pp_degree, tp_degree} after mp_world_size (_common_checkpoint_state
    # :4840-4862 spreads _checkpoint_parallel_metadata(mpu), :238-246; keys checkpoint/constants.py:46-48).
    "0.19.5": dict(metadata=False, compact=True, common=True, autoep=True, expp=False, version="0.19.5",
                   parallel_dims=True),
}
DEFAULT_LINE = "0.14"  # v0.14.0 - v0.17.0: what Megatron-DeepSpeed GPT-MoE runs were trained with

# Megatron's transformer blocks (language_model.encoder.layers.N); rename_blocks gives other names.
MEGATRON_BLOCKS = "language_model.encoder.layers"


def rename_blocks(model, prefix):
    """The same model with its blocks named `{prefix}.N` (`blocks.N`, `h.N`, `transformer.layer.N`):
    a model of the DeepSpeed MoE tutorial's kind, whose MoE modules sit wherever the user put them
    (docs/_tutorials/mixture-of-experts.md:55-63 `self.fc3 = MoE(...)`, tests/unit/simple_model.py:80-104
    `moe_1`, `moe_2`; deepspeedai/DeepSpeed edaa7221, v0.19.6). Expert files keep DeepSpeed's
    moe_layer_id in their names (engine.py:4961-4965, :5009-5013), the order of the MoE modules in
    named_modules, whatever the names; the module is then that model's flat state_dict
    (module_state_dict, engine.py:3874-3875), see model_states."""
    old = MEGATRON_BLOCKS + "."
    for p in model.params:
        p.name = p.name.replace(old, prefix + ".", 1)
        p.expert_local_name = p.expert_local_name.replace(old, prefix + ".", 1)

    def rename(v):
        if isinstance(v, str):
            return v.replace(old, prefix + ".")
        if isinstance(v, list):
            return [rename(x) for x in v]
        if isinstance(v, dict):
            return {k: rename(x) for k, x in v.items()}
        return v
    model.uc_info = rename(model.uc_info)
    return model


def _with_metadata(od, keys=None):
    """torch Module.state_dict (torch/nn/modules/module.py, state_dict): the top-level OrderedDict gets
    _metadata[prefix[:-1]] = {'version': module._version} for every module in pre-order. Modelled from
    the modules that own parameters (Megatron's parameter-less modules such as core_attention are not
    listed); `keys`: the state_dict's keys in module order, including those popped after it ran."""
    meta = collections.OrderedDict()
    meta[""] = {"version": 1}
    for k in (od.keys() if keys is None else keys):
        parts = k.split(".")
        for i in range(1, len(parts)):
            meta.setdefault(".".join(parts[:i]), {"version": 1})
    od._metadata = meta
    return od


def nested_module(flat, all_names, metadata):
    """Megatron's GPTModel.state_dict_for_save_checkpoint (gpt_model.py:266-283) ->
    TransformerLanguageModel (language_model.py:603-645) -> Embedding (:269-285): plain dicts for
    language_model and embedding, torch state_dicts (OrderedDict) for word/position embeddings,
    encoder (ParallelTransformer.state_dict) and output_layer. Expert keys were popped from the
    encoder (language_model.py:628-631) and dropped by DeepSpeed's _get_non_moe_state_dict
    (engine.py v0.16.5 :3336-3344); the gate stays. all_names: every parameter name of DP rank 0's
    module in module order (experts with local indices), for the encoder's _metadata."""
    lm = {}
    emb = {}
    enc = collections.OrderedDict()
    out = collections.OrderedDict()
    for name, t in flat.items():
        rest = name[len("language_model."):]
        if rest.startswith("embedding."):
            sub, key = rest[len("embedding."):].split(".", 1)
            emb.setdefault(sub, collections.OrderedDict())[key] = t
        elif rest.startswith("encoder."):
            enc[rest[len("encoder."):]] = t
        elif rest.startswith("output_layer."):
            out[rest[len("output_layer."):]] = t
        else:
            raise ValueError(name)
    if metadata:
        for od in emb.values():
            _with_metadata(od)
        _with_metadata(enc, [k[len("language_model.encoder."):] for k in all_names if k.startswith("language_model.encoder.")])
        if out:
            _with_metadata(out)
    lm["embedding"] = emb
    lm["encoder"] = enc
    if out:
        lm["output_layer"] = out
    return {"language_model": lm}


def model_states(line, module_flat, all_names, param_shapes, base, client, ds_config, zero_stage):
    """mp_rank_XX_model_states.pt of `line`. module_flat: name -> lp tensor (views into the flat
    buffer); param_shapes: every bit16 group's OrderedDict(local name -> Size) (engine.py v0.19.3
    :5102-5135 _get_zero_param_shapes); base: DeepSpeed's scalar keys; client: Megatron's
    client_state (checkpointing.py:254-281), merged last by state.update(client_state)."""
    L = LINES[line]
    if L["compact"]:
        module_flat = collections.OrderedDict((k, v.clone()) for k, v in module_flat.items())
    if all(k.startswith("language_model.") for k in module_flat):
        module = nested_module(module_flat, all_names, L["metadata"])
    else:  # rename_blocks: not Megatron's model, self.module.state_dict() as it is (engine.py:3874-3875)
        module = _with_metadata(collections.OrderedDict(module_flat), all_names) if L["metadata"] else \
            collections.OrderedDict(module_flat)
    sd = {}  # DeepSpeed builds a plain dict (engine.py v0.16.5 :3428, v0.19.3 :4706 dict(...))
    sd["module"] = module
    if L["common"]:
        frozen = collections.OrderedDict() if zero_stage >= 2 else None  # save_frozen_param (:4983)
        sd["buffer_names"] = []
        sd["optimizer"] = None
        sd["param_shapes"] = param_shapes
        sd["frozen_param_shapes"] = frozen
        sd["shared_params"] = {}
        sd["frozen_param_fragments"] = frozen
    for k in ("lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names", "skipped_steps",
              "global_steps", "global_samples", "dp_world_size", "mp_world_size"):
        sd[k] = base[k]
    if L.get("parallel_dims"):  # bwc_pipeline/tensor_model_parallel_world_size(mpu): 1 and 1 here (TP = PP = 1)
        sd["checkpoint_parallel_dimensions"] = {"pp_degree": 1, "tp_degree": 1}
    if L["common"]:
        sd["ds_config"] = ds_config
        sd["ds_version"] = L["version"]
    sd["num_experts"] = base["num_experts"]
    if L["autoep"]:
        sd["ds_autoep_layers"] = None
    sd.update(client)
    return sd


def write_expert_files(line, ck, mp, by_file):
    """layer_{moe_layer_id}_expert_{global}_mp_rank_XX_model_states.pt (engine.py v0.16.5 :3373-3396):
    a plain dict (an entry of defaultdict(dict)) of compact clones; clone_tensors_for_torch_save
    keeps it a dict in later lines."""
    for (ml, e), esd in by_file.items():
        torch.save(dict(esd), os.path.join(ck, f"layer_{ml}_expert_{e}_mp_rank_{mp:02d}_model_states.pt"))


def write_expp_files(line, ck, mp, ep):
    """expp_rank_R_mp_rank_XX_optim_states.pt = {'optimizer': None} under ZeRO (v0.16.5 :3410-3416);
    not written from v0.19.5 on."""
    if not LINES[line]["expp"]:
        return
    for r in range(ep):
        torch.save({"optimizer": None}, os.path.join(ck, f"expp_rank_{r}_mp_rank_{mp:02d}_optim_states.pt"))


# ---------------------------------------------------------------- DeepSpeed's MoE tutorial param groups
# docs/_tutorials/mixture-of-experts.md (v0.14.5 :113-121, same text at v0.19.6 edaa7221):
#   parameters = {'params': [p for p in model.parameters()], 'name': 'parameters'}
#   return split_params_into_different_moe_groups_for_optimizer(parameters)
# (the engine does the same with name 'dense-params' when given bare parameters and a MoE model,
# engine.py v0.19.6 :2027-2029 -> moe/utils.py :155-172). split_params_into_different_moe_groups_for_optimizer
# (moe/utils.py v0.14.5 and v0.19.6 :72-148): expert parameters (is_moe_param :27-30: allreduce False,
# set with group_name = "ep_size_<ep>" by moe/experts.py :21-26 and moe/layer.py :61) leave the group
# (:111-119) for a new group {**param_group, 'name': group_name, 'moe': True} (:101-108) appended after
# it (:122-142; one group while the experts hold at most max_group_size = 178956971 elements, true here).
# Both keep module order (model.parameters()). So: group 0 = every non-expert parameter (norms and
# biases included, the same weight decay), group 1 = this EP rank's experts.
TUTORIAL_WEIGHT_DECAY = 0.01  # the ds_config optimizer's weight_decay, the same in both groups


def tutorial_groups(stage_params, num_experts, ep_rank, ep, dp):
    """writer.groups_for of the tutorial grouping: (params, names in the flat buffer, partition count,
    moe) per group; the expert group is partitioned over the expert-data-parallel group (dp / ep)."""
    dense = [p for p in stage_params if p.expert is None]
    experts = [p for p in stage_params if p.expert is not None
               and p.expert // (num_experts[p.moe_layer] // ep) == ep_rank]
    return [(dense, [p.name for p in dense], dp, False),
            (experts, [p.expert_local_name for p in experts], dp // ep, True)]


def tutorial_hyper(moe, ep, index):
    """The saved param_groups entry: torch's Optimizer.state_dict keeps the group's keys in insertion
    order with 'params' (indices) last (torch 1.13 optim/optimizer.py:167-170); the tutorial's dict
    holds params and name, the expert group params, name and moe (moe/utils.py :103-107), and
    add_param_group appends the optimizer's defaults (:300-333)."""
    d = {"name": f"ep_size_{ep}", "moe": True} if moe else {"name": "parameters"}
    d.update({"lr": 1e-4, "bias_correction": True, "betas": (0.9, 0.95), "eps": 1e-8,
              "weight_decay": TUTORIAL_WEIGHT_DECAY, "amsgrad": False, "params": [index]})
    return d
