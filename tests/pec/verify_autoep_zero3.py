#!/usr/bin/python3
"""Independent check of a pec-restore output for DeepSpeed AutoEP under ZeRO-3 (partition-native), with
Python torch and zipfile only (not ucpkit's reader).

Which element of a rank's ZeRO-3 sub-group partition belongs to which expert is derived here from the
checkpoint's own metadata, the way DeepSpeed lays it out (docs/formats.md "AutoEP under ZeRO-3"): the
sub-group marked 'autoep_expert' in ds_zero_partition_groups holds the rank's fused expert weights in
param_shapes order, each split on its own into ceil(n / partition_count) slices, the rank's slice
[partition_rank * per, ...) padded at the end; element i of a weight [E_local, ...] belongs to local
expert i // (n / E_local), global id ep_rank * E_local + local (ep_rank from the rank's
ds_autoep_layers).

Checks, for every restored file:
* model-states files are byte copies of the target step's;
* optimizer shards load with torch.load, every zip record's CRC-32 is right (zipfile.testzip), every
  value outside the expert sub-group tensors equals the target step's, and in fp32_flat_groups[g] and
  every optimizer tensor state of the expert sub-group each expert's elements equal those of the step
  the PEC report names for it, every other element (padding) those of the target step;
* bytes outside the expert sub-group tensors' records are the target step's bytes;
* with --universal U (the restored folder converted by ucp-union), every dense parameter state equals
  the target step's truth and row g of every expert weight state [E, ...] that of the step the report
  names for expert g.
Usage: verify_autoep_zero3.py RESTORED_STEP_DIR REPORT.json TARGET_STEP STEP=GENERATED_DIR... [--universal U]"""
import json
import os
import sys
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "generator"))
import dsgen  # noqa: E402,F401  (registers the DeepSpeed stand-in classes for torch.load)
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from verify_restore import load, same  # noqa: E402


def owners(model_states, meta):
    """Per element of the expert sub-group partition: (moe_layer_id, global expert) or None (padding)."""
    layers = {l["expert_key_prefix"]: l for l in model_states["ds_autoep_layers"]}
    shapes = model_states["param_shapes"][meta["sub_group"]]
    count, prank = meta["partition_count"], meta["partition_rank"]
    out = []
    for name, shape in shapes.items():
        layer = layers[name.rsplit(".", 1)[0]]
        n = int(torch.Size(shape).numel())
        per_expert = n // shape[0]
        per = -(-n // count)
        for i in range(prank * per, (prank + 1) * per):
            if i < n:
                out.append((layer["moe_layer_id"], layer["ep_rank"] * layer["num_local_experts"] + i // per_expert))
            else:
                out.append(None)
    return out


def record_spans(path, names):
    """(start, end) of the data of each named zip record inside the file."""
    spans = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if info.filename.split("/", 1)[-1] in names:
                f.seek(info.header_offset + 26)
                n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
                start = info.header_offset + 30 + n + m
                spans.append((start, start + info.compress_size))
    return spans


def check_shard(name, restored, gens, target, src_step, errors):
    got = load(os.path.join(restored, name))
    tgt_path = os.path.join(gens[target], name)
    tgt = load(tgt_path)
    with zipfile.ZipFile(os.path.join(restored, name)) as z:
        bad = z.testzip()
        if bad:
            errors.append(f"{name}: CRC-32 of {bad} is wrong")
    osd_g, osd_t = got["optimizer_state_dict"], tgt["optimizer_state_dict"]
    expert_groups = [m["sub_group"] for m in osd_t["ds_zero_partition_groups"] if "autoep_expert" in m["families"]]
    skip = set()
    for g in expert_groups:
        skip.add(f"{name}.optimizer_state_dict.fp32_flat_groups[{g}]")
        for k, v in osd_t["optimizer_state_dict"]["state"][g].items():
            if isinstance(v, torch.Tensor) and v.dim() == 1:
                skip.add(f"{name}.optimizer_state_dict.optimizer_state_dict.state.{g}.{k}")
    same(got, tgt, name, skip)
    rank = int(name.split("zero_pp_rank_")[1].split("_")[0])
    model = load(os.path.join(gens[target], f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"))
    sources = {}
    for g in expert_groups:
        meta = osd_t["ds_zero_partition_groups"][g]
        own = owners(model, meta)
        tensors = [("fp32", lambda sd: sd["optimizer_state_dict"]["fp32_flat_groups"][g])]
        for k, v in osd_t["optimizer_state_dict"]["state"][g].items():
            if isinstance(v, torch.Tensor) and v.dim() == 1:
                tensors.append((k, lambda sd, k=k: sd["optimizer_state_dict"]["optimizer_state_dict"]["state"][g][k]))
        for state, get in tensors:
            t_got = get(got)
            if t_got.numel() != len(own):
                errors.append(f"{name}: {state} of sub-group {g} has {t_got.numel()} elements, expected {len(own)}")
                continue
            for i, o in enumerate(own):
                step = target if o is None else src_step[o]
                if step not in sources:
                    sources[step] = load(os.path.join(gens[step], name))
                want = get(sources[step])[i]
                if not torch.equal(t_got[i], want):
                    errors.append(f"{name}: {state}[{i}] of sub-group {g} ({o}) is not that of step {step}")
                    break
    # Bytes outside the records of the expert sub-group tensors are the target's bytes.
    keys = set()
    for g in expert_groups:
        for t in [osd_g["fp32_flat_groups"][g]] + [v for v in osd_g["optimizer_state_dict"]["state"][g].values()
                                                   if isinstance(v, torch.Tensor) and v.dim() == 1]:
            keys.add(storage_key(os.path.join(restored, name), t))
    spans = record_spans(os.path.join(restored, name), {f"data/{k}" for k in keys})
    a = open(os.path.join(restored, name), "rb").read()
    b = open(tgt_path, "rb").read()
    if len(a) != len(b):
        errors.append(f"{name}: {len(a)} bytes, the target step's file {len(b)}")
        return
    pos = 0
    for s, e in sorted(spans) + [(len(a), len(a))]:
        if a[pos:s] != b[pos:s]:
            # CRC-32 fields of the touched records legitimately differ: compare outside them.
            diff = [i for i in range(pos, s) if a[i] != b[i]]
            if not all(crc_field(tgt_path, i) for i in diff):
                errors.append(f"{name}: bytes {diff[0]}.. outside the expert records differ from step {target}")
        pos = e


_crc_cache = {}


def crc_field(path, offset):
    """True when `offset` lies in a CRC-32 field of a local header, data descriptor or central entry."""
    if path not in _crc_cache:
        fields = []
        with zipfile.ZipFile(path) as z:
            data = open(path, "rb").read()
            for info in z.infolist():
                h = info.header_offset
                fields.append((h + 14, h + 18))  # local header CRC-32
                n, m = int.from_bytes(data[h + 26:h + 28], "little"), int.from_bytes(data[h + 28:h + 30], "little")
                end = h + 30 + n + m + info.compress_size
                if info.flag_bits & 0x08:  # data descriptor (optionally signed)
                    d = end + (4 if data[end:end + 4] == b"PK\x07\x08" else 0)
                    fields.append((d, d + 4))
            cd = data.rfind(b"PK\x05\x06")
            start = int.from_bytes(data[cd + 16:cd + 20], "little")
            if start == 0xFFFFFFFF:  # zip64 end record
                loc = data.rfind(b"PK\x06\x06")
                start = int.from_bytes(data[loc + 48:loc + 56], "little")
            p = start
            while data[p:p + 4] == b"PK\x01\x02":
                fields.append((p + 16, p + 20))
                n, m, k = (int.from_bytes(data[p + 28 + 2 * i:p + 30 + 2 * i], "little") for i in range(3))
                p += 46 + n + m + k
        _crc_cache[path] = fields
    return any(s <= offset < e for s, e in _crc_cache[path])


def storage_key(path, t):
    """The record name (data/<key>) of a loaded tensor's storage, found by matching its bytes."""
    raw = (t.view(torch.int16) if t.element_size() == 2 else t).contiguous().numpy().tobytes()
    with zipfile.ZipFile(path) as z:
        hits = [i.filename.split("/data/", 1)[1] for i in z.infolist()
                if "/data/" in i.filename and z.read(i) == raw]
    if len(hits) != 1:
        raise AssertionError(f"{path}: cannot tell the record of a tensor ({len(hits)} candidates)")
    return hits[0]


def check_universal(uni, gens, target, src_step, errors):
    meta = json.load(open(os.path.join(gens[target], "..", "truth", "meta.json")))

    def value(path):
        v = load(path)
        return v["param"] if isinstance(v, dict) else v

    def truth(step, name, state):
        return value(os.path.join(gens[step], "..", "truth", "universal", "zero", name, f"{state}.pt"))

    for p in meta["params"]:
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            got = value(os.path.join(uni, "zero", p["name"], f"{state}.pt"))
            if not p["expert"]:
                if not torch.equal(got.reshape(-1), truth(target, p["name"], state).reshape(-1)):
                    errors.append(f"universal {p['name']}/{state}: dense values are not those of step {target}")
                continue
            layer = int(p["name"].split(".layers.")[1].split(".")[0])  # moe_layer_id = layer index here
            for g in range(got.shape[0]):
                step = src_step[(layer, g)]
                if not torch.equal(got[g], truth(step, p["name"], state)[g]):
                    errors.append(f"universal {p['name']}/{state}: expert {g} is not that of step {step}")


def main():
    args = sys.argv[1:]
    uni = None
    if "--universal" in args:
        i = args.index("--universal")
        uni = args[i + 1]
        del args[i:i + 2]
    restored, report, target = args[0], args[1], int(args[2])
    gens = {}
    for a in args[3:]:
        step, d = a.split("=", 1)
        gens[int(step)] = os.path.join(d, open(os.path.join(d, "latest")).read().strip())
    rep = json.load(open(report))
    src_step = {(e["moe_layer"], e["expert"]): int(e["restored_step"]) for e in rep["experts"]}
    errors = []
    names = sorted(os.listdir(restored))
    if names != sorted(os.listdir(gens[target])):
        errors.append(f"restored files {names} are not the target step's {sorted(os.listdir(gens[target]))}")
    for name in names:
        if name.endswith("_model_states.pt"):
            if open(os.path.join(restored, name), "rb").read() != open(os.path.join(gens[target], name), "rb").read():
                errors.append(f"{name} is not a byte copy of step {target}'s")
        elif name.endswith("_optim_states.pt"):
            try:
                check_shard(name, restored, gens, target, src_step, errors)
            except AssertionError as e:
                errors.append(str(e))
    older = sum(1 for s in src_step.values() if s != target)
    if older == 0:
        errors.append("no expert came from an older step: the restore was not partial")
    if uni:
        check_universal(uni, gens, target, src_step, errors)
    for e in errors[:20]:
        print("MISMATCH", e)
    if errors:
        sys.exit(1)
    print(f"ok: {len(names)} files, {len(src_step)} experts, {older} restored from older steps")


if __name__ == "__main__":
    main()
