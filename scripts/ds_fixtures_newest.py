"""The DeepSpeed 0.19.8 fixtures of tests/formats/deepspeed/data (issue 48; README.md there): what
scripts/ds_fixtures_newest.sh keeps of a scripts/frameworks/ds_train_loop.py run, and the check the C++ test
tests/formats/deepspeed/newest_line_test.cpp makes, in Python (run by the shell script with --build).

  keep WORK DEST UNIVERSAL_LOG
      per case of ds_train_loop.py (dense, zero3, moe): DEST/<name>/ = the engine's save (latest and the tag
      folder; DeepSpeed's copies of zero_to_fp32.py / zero_to_torch.py left out), and DEST/<name>.truth/:
        engine.safetensors   the state the engine held at the save (ds_train_loop.py's record, through
                             DeepSpeed's safe_get_full_fp32_param / safe_get_full_optimizer_state), merged
                             over the ranks by ds_train_loop.merged: "<param>/fp32", "<param>/exp_avg",
                             "<param>/exp_avg_sq" (float32, the parameter's shape)
        engine.json          its Adam step and global step, the DeepSpeed and torch versions (a JSON file:
                             safetensors' own metadata is written in no fixed order)
        ds_to_universal.json DeepSpeed's own ds_to_universal of the same save: ok, or its error and where
        ds_to_universal/zero/ what it wrote under zero/ when it converted (fp32, exp_avg, exp_avg_sq, step
                             .pt per parameter, optimizer_state.pt)
  check BUILD DEST
      ucp-union of every DEST/<name> (run from a scratch folder) equals its truth: ds_to_universal's files
      value for value (ds_train_loop.same_value: keys in order, kinds, tensors' dtype, shape and bits; not
      requires_grad, True on ds_to_universal's fp32.pt tensors and False on ours: listed), the only files
      ours alone has being step.pt where ds_to_universal writes none (ZeRO-3); every state of
      engine.safetensors bit for bit (ZeRO-3's flat form compared as its elements), step.pt the Adam step;
      ucp-info --json's version, layout and step. Exit 1 when one is not equal.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "frameworks"))
import ds_train_loop  # noqa: E402  (the run's own record format and comparisons)

# ds_train_loop.py case -> fixture name, ucp-info --json layout
CASES = {
    "dense": ("ds0198_dense_zero1_dp2", {"zero_stage": 1, "dp": 2, "ep": 1}),
    "zero3": ("ds0198_dense_zero3_dp2", {"zero_stage": 3, "dp": 2, "ep": 1}),
    "moe": ("ds0198_moe_ep2_zero1_dp2", {"zero_stage": 1, "dp": 2, "ep": 2}),
}
STATES = ("fp32", "exp_avg", "exp_avg_sq")


def keep(work, dest, universal_log):
    import importlib.metadata as md
    import torch
    from safetensors.torch import save_file
    results = {}
    for line in open(universal_log):
        if line.startswith("ds_to_universal: "):
            r = json.loads(line.split(": ", 1)[1])
            results[r["case"]] = r
    os.makedirs(dest, exist_ok=True)
    for case, (name, _) in CASES.items():
        ckpt = os.path.join(work, case, "ckpt")
        tag = open(os.path.join(ckpt, "latest")).read().strip()
        out, truth = os.path.join(dest, name), os.path.join(dest, name + ".truth")
        for d in (out, truth):
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(out)
        shutil.copy(os.path.join(ckpt, "latest"), out)
        shutil.copytree(os.path.join(ckpt, tag), os.path.join(out, tag))
        params, steps, gsteps = ds_train_loop.merged(torch, os.path.join(work, case, "truth"))
        if len(steps) != 1 or len(steps[0]) != 1 or len(gsteps) != 1:
            sys.exit(f"{case}: not one Adam step and one global step: {steps} {gsteps}")
        tensors = {f"{n}/{k}": params[n][k].contiguous() for n in sorted(params) for k in STATES}
        os.makedirs(truth)
        save_file(tensors, os.path.join(truth, "engine.safetensors"))
        with open(os.path.join(truth, "engine.json"), "w") as f:
            json.dump({"adam_step": steps[0][0], "global_steps": gsteps[0], "deepspeed": md.version("deepspeed"),
                       "torch": torch.__version__}, f, sort_keys=True)
            f.write("\n")
        res = results[case]
        with open(os.path.join(truth, "ds_to_universal.json"), "w") as f:
            json.dump(res, f, sort_keys=True)
            f.write("\n")
        if res["ok"]:
            shutil.copytree(os.path.join(work, case, "dsu", tag + "_universal", "zero"),
                            os.path.join(truth, "ds_to_universal", "zero"))
        size = sum(os.path.getsize(p) for d in (out, truth) for p in glob.glob(d + "/**", recursive=True)
                   if os.path.isfile(p))
        print(f"ds_fixtures_newest: {name}: {len(params)} params, ds_to_universal "
              f"{'ok' if res['ok'] else 'failed: ' + res['error']}, {size} bytes with its truth", flush=True)


def check_one(build, dest, case, scratch):
    import torch
    from safetensors import safe_open
    load = ds_train_loop.load
    name, layout = CASES[case]
    fixture, truth = os.path.join(dest, name), os.path.join(dest, name + ".truth")
    work = os.path.join(scratch, name)
    os.makedirs(work)
    subprocess.run([os.path.join(build, "bin", "ucp-union"), "-q", "--input", fixture, "--output", "u"], cwd=work,
                   check=True, stderr=subprocess.DEVNULL)
    ours = os.path.join(work, "u")
    bad = []
    info = json.loads(subprocess.run([os.path.join(build, "bin", "ucp-info"), "--json", fixture], check=True,
                                     capture_output=True, text=True).stdout)
    got = {k: info["layout"][k] for k in layout}
    if not info["ok"] or info["ds_version"] != "0.19.8" or got != layout or info["step"] != 3:
        bad.append(f"ucp-info: ok {info['ok']}, ds_version {info['ds_version']}, layout {got}, step {info['step']}")
    with safe_open(os.path.join(truth, "engine.safetensors"), "pt") as f:
        engine = {k: f.get_tensor(k) for k in f.keys()}
    step = json.load(open(os.path.join(truth, "engine.json")))["adam_step"]
    names = sorted({k.rsplit("/", 1)[0] for k in engine})
    have = sorted(os.path.basename(d) for d in glob.glob(os.path.join(ours, "zero", "*")) if os.path.isdir(d))
    if have != names:
        bad.append(f"params differ from the engine's: {sorted(set(have) ^ set(names))[:6]}")
    for n in sorted(set(names) & set(have)):
        for k in STATES:
            x = load(torch, os.path.join(ours, "zero", n, k + ".pt"))
            x = x["param"] if isinstance(x, dict) else x
            t = engine[f"{n}/{k}"]
            if x.dim() == 1 and t.dim() != 1:
                t = t.reshape(-1)
            if not ds_train_loop.same_value(torch, x, t):
                bad.append(f"{n}/{k} vs the engine")
        s = load(torch, os.path.join(ours, "zero", n, "step.pt"))
        if not ds_train_loop.same_value(torch, s, torch.tensor(step, dtype=torch.float32)):
            bad.append(f"{n}/step.pt {s!r} vs the engine's Adam step {step}")
    theirs_files, grads = 0, set()
    dsu = os.path.join(truth, "ds_to_universal")
    if os.path.isdir(dsu):
        theirs = {os.path.relpath(p, dsu) for p in glob.glob(os.path.join(dsu, "zero", "**", "*.pt"), recursive=True)}
        mine = {os.path.relpath(p, ours) for p in glob.glob(os.path.join(ours, "zero", "**", "*.pt"), recursive=True)}
        theirs_files = len(theirs)
        extra = mine - theirs
        if any(os.path.basename(r) != "step.pt" for r in extra) or (
                extra and any(os.path.basename(r) == "step.pt" for r in theirs)):
            bad.append(f"ours only: {sorted(extra)[:6]}")
        bad += [f"{r} not written by ucp-union" for r in sorted(theirs - mine)]
        for r in sorted(theirs & mine):
            a, b = load(torch, os.path.join(ours, r)), load(torch, os.path.join(dsu, r))
            if not ds_train_loop.same_value(torch, a, b):
                bad.append(f"{r} differs from ds_to_universal's")
            elif getattr(state_tensor(a), "requires_grad", False) != getattr(state_tensor(b), "requires_grad", False):
                grads.add(os.path.basename(r))  # not state (newest_line_test.cpp without_requires_grad)
    print(f"{name}: {len(names)} params x ({', '.join(STATES)}, step) vs the engine, {theirs_files} files vs "
          f"ds_to_universal, ucp-info --json: {len(bad)} differ" + (": " + "; ".join(bad[:8]) if bad else "") +
          (f" (requires_grad of the tensor not compared, it differs in {', '.join(sorted(grads))})" if grads else ""),
          flush=True)
    return not bad


def state_tensor(x):
    return x["param"] if isinstance(x, dict) and "param" in x else x


def check(build, dest):
    build, dest = os.path.abspath(build), os.path.abspath(dest)
    scratch = tempfile.mkdtemp(prefix="ds_fixtures_newest.")
    try:
        ok = [check_one(build, dest, case, scratch) for case in CASES]
    finally:
        shutil.rmtree(scratch)
    sys.exit(0 if all(ok) else 1)


def main():
    ds_train_loop.env_defaults()
    if len(sys.argv) == 5 and sys.argv[1] == "keep":
        keep(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        check(*sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
