"""Outside CI: DeepSpeed's own universal loader for AutoEP, `load_hp_checkpoint_state`
(deepspeed/checkpoint/universal_checkpoint.py, the per-parameter load ZeRO-1/2 runs through
base_optimizer.py), on a universal folder written by ucp-union. For every parameter and every EP
size given, each EP rank's parameter is loaded as one fragment (the whole local tensor) the way a
ZeRO-1/2 rank of that EP size would (expert weights: shape [E/ep, ...], sliced by the loader from
the `is_expert_param` state), and fp32 / exp_avg / exp_avg_sq are compared with the generator's
ground truth rows. Usage: run_autoep_hp_load.py <universal_dir> <generated_fixture_dir> EP..."""
import json
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shim  # noqa: E402,F401
import torch  # noqa: E402
from deepspeed.checkpoint.universal_checkpoint import load_hp_checkpoint_state  # noqa: E402

uni, gen, eps = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3:]]
meta = json.load(open(os.path.join(gen, "truth", "meta.json")))


class Mapping:  # the hp mapping's surface load_hp_checkpoint_state uses (tensor_fragment.py)
    def __init__(self, numel):
        self.lp_fragment_address = types.SimpleNamespace(start=0, numel=numel)
        self.hp = torch.zeros(numel)
        self.optim_fragment = {}

    def get_hp_fragment(self):
        return self.hp


class Param:  # a ZeRO-1/2 rank's lp parameter: shape and the mapping
    def __init__(self, shape):
        self.shape = torch.Size(shape)
        self._hp_mapping = Mapping(self.shape.numel())

    def numel(self):
        return self.shape.numel()


bad = n = 0
for p in meta["params"]:
    truth = {s: torch.load(os.path.join(gen, "truth", "universal", "zero", p["name"], f"{s}.pt"), weights_only=False)["param"]
             for s in ("fp32", "exp_avg", "exp_avg_sq")}
    for ep in eps if p["expert"] else [1]:
        E = p["shape"][0]
        for r in range(ep):
            shape = [E // ep] + p["shape"][1:] if p["expert"] else p["shape"]
            q = Param(shape)
            step = load_hp_checkpoint_state(q, os.path.join(uni, "zero", p["name"]), 0, 1, ep_rank=r, ep_size=ep)
            rows = slice(r * (E // ep), (r + 1) * (E // ep)) if p["expert"] else slice(None)
            got = {"fp32": q._hp_mapping.hp, **q._hp_mapping.optim_fragment}
            for s, t in truth.items():
                n += 1
                if not torch.equal(got[s], t[rows].float().reshape(-1)):
                    bad += 1
                    print("MISMATCH", p["name"], s, "ep", ep, "rank", r)
            if step != meta["step"]:
                bad += 1
                print("MISMATCH step", p["name"], step)
print(f"{n} loaded fragments compared with the truth, {bad} differ")
sys.exit(1 if bad else 0)
