#!/usr/bin/python3
"""Checks that a native-MoE checkpoint folder (global_stepN/ under <dir>) is laid out as DeepSpeed
version line <line> writes it, reading it the way DeepSpeed and Megatron-DeepSpeed load it rather
than with ucpkit's reader:
  * mp_rank_00_model_states.pt: DeepSpeed's keys in the save order of the line (deepspeedai/DeepSpeed
    v0.16.5 engine.py:3428-3453, v0.19.2 :4377-4410, v0.19.3 :4705-4726 + :4988-5008), then Megatron's
    client state; `module` Megatron's nested dict without expert keys; _metadata only in 0.14 - 0.17.0;
    views into one flat buffer (0.14) or compact copies (clone_tensors_for_torch_save, later lines).
  * expert files merged into the module state dict as DeepSpeedEngine.load_moe_state_dict does for
    every EP rank (v0.16.5 engine.py:2742-2795: global -> local ids), then routed into the encoder as
    GPTModel.load_state_dict / TransformerLanguageModel.load_state_dict do (Megatron-DeepSpeed
    gpt_model.py:285-301, language_model.py:693-705): every parameter of the model is found with its shape.
  * expp_rank_R files ({'optimizer': None}) present iff the line writes them (absent from v0.19.5 on).
Usage: check_moe_line.py <checkpoint_dir> <line> <ep> <truth_meta.json> [<checkpoint_dir> <line> <ep> <meta> ...]
(exit 0 = every folder laid out as its line; several share one Python start)"""
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401  (DeepSpeed stand-in classes)
import torch  # noqa: E402

BEFORE_0_19_3 = ["module", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names", "skipped_steps",
                 "global_steps", "global_samples", "dp_world_size", "mp_world_size", "num_experts"]
COMMON = ["module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
          "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
          "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config",
          "ds_version", "num_experts", "ds_autoep_layers"]
# v0.19.5 engine.py:238-246, :4840-4862: checkpoint_parallel_dimensions after mp_world_size
COMMON_0_19_5 = COMMON[:COMMON.index("mp_world_size") + 1] + ["checkpoint_parallel_dimensions"] + \
    COMMON[COMMON.index("mp_world_size") + 1:]
KEYS = {"0.14": BEFORE_0_19_3, "0.17.1": BEFORE_0_19_3, "0.19.2": BEFORE_0_19_3 + ["ds_autoep_layers"],
        "0.19.3": COMMON, "0.19.5": COMMON_0_19_5}
CLIENT = ["args", "checkpoint_version", "iteration", "tokens", "universal_checkpoint_info", "rng_state"]
errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)


def main(ck_dir, line, ep, meta_path):
    del errors[:]
    tag = open(os.path.join(ck_dir, "latest")).read().strip()
    d = os.path.join(ck_dir, tag)
    sd = torch.load(os.path.join(d, "mp_rank_00_model_states.pt"), map_location="cpu", weights_only=False)
    check(type(sd) is dict, f"state is a {type(sd).__name__}, DeepSpeed saves a dict")
    want = KEYS[line] + [k for k in CLIENT if k in sd]
    check(list(sd.keys()) == want, f"keys {list(sd.keys())} != {want}")
    if line in ("0.19.2", "0.19.3", "0.19.5"):
        check(sd.get("ds_autoep_layers", "absent") is None, "ds_autoep_layers is not None")
    if line == "0.19.5":
        cpd = sd.get("checkpoint_parallel_dimensions")
        check(type(cpd) is dict and list(cpd.items()) == [("pp_degree", 1), ("tp_degree", 1)],
              f"checkpoint_parallel_dimensions {cpd!r}, expected {{'pp_degree': 1, 'tp_degree': 1}}")
    if KEYS[line] in (COMMON, COMMON_0_19_5):
        check(isinstance(sd["param_shapes"], list) and all(isinstance(g, collections.OrderedDict) for g in sd["param_shapes"]),
              "param_shapes is not a list of OrderedDicts")
        check(isinstance(sd["ds_config"], dict) and "zero_optimization" in sd["ds_config"], "ds_config without zero_optimization")
        check(sd["ds_version"].startswith(line[:4]), f"ds_version {sd['ds_version']} is not of line {line}")
    module = sd["module"]
    lm = module["language_model"]
    check(type(module) is dict and type(lm) is dict and type(lm["embedding"]) is dict,
          "module / language_model / embedding are not plain dicts (Megatron's state_dict_for_save_checkpoint)")
    enc, we = lm["encoder"], lm["embedding"]["word_embeddings"]
    check(type(enc) is collections.OrderedDict and type(we) is collections.OrderedDict, "encoder / word_embeddings are not state_dicts")
    check(not any("expert" in k and "moe.gate.wg.weight" not in k for k in enc), "expert keys left in the encoder")
    metadata = line == "0.14"
    check(hasattr(enc, "_metadata") == metadata and hasattr(we, "_metadata") == metadata,
          f"_metadata {'missing' if metadata else 'present'} (line {line})")
    if metadata:
        check(any(".deepspeed_experts." in k for k in enc._metadata), "encoder _metadata does not list the expert modules")
    tensors = [t for sub in (we, lm["embedding"]["position_embeddings"], enc) for t in sub.values()]
    storages = {t.storage().data_ptr() for t in tensors}
    if line == "0.14":  # views into the param groups' flat buffers: far fewer storages than tensors
        check(len(storages) <= 4, f"{len(storages)} storages for {len(tensors)} module tensors: not views of flat buffers")
    else:
        check(all(t.storage().size() == t.numel() for t in tensors), "module tensors are not compact copies")

    # load_moe_state_dict for every EP rank, then Megatron's routing into the encoder.
    meta = json.load(open(meta_path))
    num_experts = sd["num_experts"]
    check(isinstance(num_experts, list), "num_experts is not a list")
    full = {p["name"]: p for p in meta["params"]}
    prefix = ".deepspeed_moe.experts.deepspeed_experts."
    for ep_rank in range(ep):
        state = {k: v for k, v in module.items()}  # DeepSpeed passes checkpoint['module'] itself
        for moe_layer_id, n in enumerate(num_experts):
            per = n // ep
            for local in range(per):
                g = ep_rank * per + local
                f = os.path.join(d, f"layer_{moe_layer_id}_expert_{g}_mp_rank_00_model_states.pt")
                esd = torch.load(f, map_location="cpu", weights_only=False)
                check(type(esd) is dict, f"{f}: a {type(esd).__name__}, DeepSpeed saves a plain dict")
                for key in list(esd.keys()):
                    esd[key.replace(f"{prefix}{g}", f"{prefix}{local}")] = esd.pop(key)
                state.update(esd)
        moe = {k: state.pop(k) for k in list(state) if "expert" in k and "moe.gate.wg.weight" not in k}
        enc_sd = dict(state["language_model"]["encoder"])
        for k, v in moe.items():
            parts = k.split(".")
            while parts[0] != "encoder":
                parts.pop(0)
            enc_sd[".".join(parts[1:])] = v
        got = {"language_model.encoder." + k: v for k, v in enc_sd.items()}
        for sub, od in state["language_model"]["embedding"].items():
            got.update({f"language_model.embedding.{sub}.{k}": v for k, v in od.items()})
        for k, v in state["language_model"].get("output_layer", {}).items():
            got["language_model.output_layer." + k] = v
        want_names = {}
        for name, p in full.items():
            if p["expert"] is None:
                want_names[name] = p
            elif p["expert"] // (num_experts[p["moe_layer"]] // ep) == ep_rank:
                m = re.search(r"deepspeed_experts\.(\d+)\.", name)
                local = int(m.group(1)) % (num_experts[p["moe_layer"]] // ep)
                want_names[name.replace(f"deepspeed_experts.{m.group(1)}.", f"deepspeed_experts.{local}.")] = p
        check(set(got) == set(want_names), f"EP rank {ep_rank}: loaded names differ: missing "
              f"{sorted(set(want_names) - set(got))[:3]}, extra {sorted(set(got) - set(want_names))[:3]}")
        for n, p in want_names.items():
            if n in got:
                shape = list(p["shape"])
                if p.get("vocab"):
                    shape[0] = got[n].shape[0]  # padded rows
                check(list(got[n].shape) == shape, f"{n}: shape {list(got[n].shape)} != {shape}")

    expp = sorted(f for f in os.listdir(d) if f.startswith("expp_rank_"))
    if line == "0.19.5":
        check(not expp, f"expp files written: {expp}")
    else:
        check(expp == sorted(f"expp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ep)), f"expp files {expp}")
        for f in expp:
            check(torch.load(os.path.join(d, f), weights_only=False) == {"optimizer": None}, f"{f} is not {{'optimizer': None}}")
    if errors:
        for e in errors:
            print(f"check_moe_line {line}: {e}", file=sys.stderr)
        return 1
    print(f"check_moe_line: OK {ck_dir} laid out as DeepSpeed line {line} (EP {ep})")
    return 0


if __name__ == "__main__":
    a = sys.argv[1:]
    if not a or len(a) % 4:
        sys.exit(__doc__)
    sys.exit(max(main(a[i], a[i + 1], int(a[i + 2]), a[i + 3]) for i in range(0, len(a), 4)))
