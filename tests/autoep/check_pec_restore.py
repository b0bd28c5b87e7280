#!/usr/bin/python3
"""Checks a pec-restore output of an AutoEP chain (ZeRO-1/2) against the generator's ground truth of
each step, with Python torch only. The restored folder is first turned into universal form by
ucp-union (the caller passes that folder); then every dense parameter state must equal the target
step's truth, and rows g of every expert weight state [E, ...] must equal the truth of the step the
PEC report says expert g of that layer was restored from. The per-expert files
(layer_<L>_expert_<g>_...) must be byte copies of that step's files.
Usage: check_pec_restore.py <universal> <restored_step_dir> <report.json> <target_step> STEP=GENERATED_DIR..."""
import filecmp
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401
import torch  # noqa: E402

STATES = ("fp32", "exp_avg", "exp_avg_sq")


def main():
    uni, restored, report, target = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    gens = {int(k): v for k, v in (a.split("=", 1) for a in sys.argv[5:])}
    rep = json.load(open(report))
    src = {(e["moe_layer"], e["expert"]): int(e["restored_step"]) for e in rep["experts"]}
    meta = json.load(open(os.path.join(gens[target], "truth", "meta.json")))
    errors, older = [], 0

    def truth(step, name, state):
        return torch.load(os.path.join(gens[step], "truth", "universal", "zero", name, f"{state}.pt"), weights_only=False)["param"]

    for p in meta["params"]:
        for state in STATES:
            got = torch.load(os.path.join(uni, "zero", p["name"], f"{state}.pt"), weights_only=False)["param"]
            if not p["expert"]:
                if not torch.equal(got, truth(target, p["name"], state)):
                    errors.append(f"{p['name']}/{state}: dense values are not those of step {target}")
                continue
            layer = int(p["name"].split(".layers.")[1].split(".")[0])  # moe_layer_id = layer index here
            for g in range(got.shape[0]):
                step = src[(layer, g)]
                older += step != target and state == "fp32" and p["name"].endswith("w1")
                if not torch.equal(got[g], truth(step, p["name"], state)[g]):
                    errors.append(f"{p['name']}/{state}: expert {g} is not that of step {step}")
    for (layer, g), step in src.items():
        f = f"layer_{layer}_expert_{g}_mp_rank_00_model_states.pt"
        tag = open(os.path.join(gens[step], "latest")).read().strip()
        if not filecmp.cmp(os.path.join(restored, f), os.path.join(gens[step], tag, f), shallow=False):
            errors.append(f"{f} is not a byte copy of step {step}'s")
    if older == 0:
        errors.append("no expert came from an older step: the restore was not partial")
    for e in errors[:20]:
        print("MISMATCH", e)
    if errors:
        sys.exit(1)
    print(f"ok: {len(src)} experts, {older} from older steps")


if __name__ == "__main__":
    main()
