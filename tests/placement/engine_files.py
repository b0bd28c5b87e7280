"""Engine files for the moe-replace tests, made and checked independently of ucpkit.

  make DIR: SGLang's expert-distribution "stat" dump, as _StatAccumulator.dump writes it
      (python/sglang/srt/eplb/expert_distribution.py: dict(rank, logical_count [buffer, layers,
      logical] int32, average_utilization_rate_over_window), torch.save), and the sum over the
      buffer dimension that SGLang's rebalance_experts takes (eplb_algorithms/__init__.py:27,
      tokens_per_expert.sum(dim=0)) as sglang_sum.json; a vLLM EPLB load window (EplbModelState
      expert_load_window [window, layers, physical] int32 and physical_to_logical_map int64,
      vllm/distributed/eplb/eplb_state.py) written as safetensors by hand, and the logical loads
      vLLM's rearrange computes from it (scatter_add_ onto logical experts, sum over the window) as
      vllm_logical.json.
  check PLAN SGLANG_JSON VLLM_SAFETENSORS [PLAN SGLANG_JSON VLLM_SAFETENSORS ...]: the two output files against the plan, with the
      semantics of the loaders: SGLang's init_by_mapping(**data) (only the key
      physical_to_logical_map; logical_to_all_physical_map built in ascending physical order;
      physical expert p on GPU p // num_local_physical_experts; num_physical = num_logical +
      ep_num_redundant_experts divisible by ep_size) and vLLM's EplbState.add_model fill loop
      (logical_to_physical_map[l, e, count] = p for p ascending; logical_replica_count = count).
Prints one line per problem; exit 1 when any."""
import json
import struct
import sys

import torch


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        tag = {torch.int32: "I32", torch.int64: "I64"}[t.dtype]
        b = t.numpy().tobytes()
        header[name] = {"dtype": tag, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        dt = {"I64": torch.int64, "I32": torch.int32}[e["dtype"]]
        out[name] = (e["dtype"], torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=dt).reshape(e["shape"]))
    return out


def make(d):
    g = torch.Generator().manual_seed(15)
    layers, experts, buffer = 2, 12, 3
    lc = torch.randint(0, 500, (buffer, layers, experts), generator=g, dtype=torch.int32)
    torch.save(dict(rank=0, logical_count=lc, average_utilization_rate_over_window=None), f"{d}/sglang_dump.pt")
    json.dump(lc.sum(dim=0).tolist(), open(f"{d}/sglang_sum.json", "w"))
    torch.save(dict(rank=0, records=[]), f"{d}/sglang_no_counts.pt")

    physical, window = 16, 4
    p2l = torch.stack([torch.randperm(physical, generator=g) % experts for _ in range(layers)]).to(torch.int64)
    w = torch.randint(0, 300, (window, layers, physical), generator=g, dtype=torch.int32)
    write_safetensors(f"{d}/vllm_window.safetensors", {"expert_load_window": w, "physical_to_logical_map": p2l})
    logical = torch.zeros(window, layers, experts, dtype=torch.int64)
    logical.scatter_add_(-1, p2l.unsqueeze(0).expand(window, -1, -1), w.to(torch.int64))
    json.dump(logical.sum(dim=0).tolist(), open(f"{d}/vllm_logical.json", "w"))


def check(plan_path, sglang_path, vllm_path):
    problems = []
    plan = json.load(open(plan_path))
    N, G, S, E = plan["nodes"], plan["gpus_per_node"], plan["slots_per_gpu"], plan["experts"]
    phy = torch.tensor([layer["phy2log"] for layer in plan["layers"]], dtype=torch.int64)
    L, P = phy.shape

    data = json.load(open(sglang_path))
    if list(data) != ["physical_to_logical_map"]:
        problems.append(f"sglang: keys {list(data)} (init_by_mapping takes physical_to_logical_map only)")
    m = torch.tensor(data.get("physical_to_logical_map", []), dtype=torch.int64)
    ep_size = N * G
    if tuple(m.shape) != (L, P):
        problems.append(f"sglang: shape {tuple(m.shape)}, plan ({L}, {P})")
    else:
        if P % ep_size or P // ep_size != S:
            problems.append(f"sglang: {P} physical experts do not give {S} per GPU on {ep_size} GPUs")
        if P - E < 0:
            problems.append("sglang: fewer physical than logical experts")
        for l in range(L):
            all_phys = [[] for _ in range(E)]
            for p in range(P):
                all_phys[int(m[l, p])].append(p)
            for e in range(E):
                if not all_phys[e]:
                    problems.append(f"sglang: layer {l} expert {e} has no physical expert")
            for gpu in range(ep_size):
                mine = sorted(int(m[l, p]) for p in range(P) if p // (P // ep_size) == gpu)
                want = sorted(int(x) for x in phy[l, gpu * S:(gpu + 1) * S])
                if mine != want:
                    problems.append(f"sglang: layer {l} GPU {gpu} holds {mine}, plan {want}")

    t = read_safetensors(vllm_path)
    for k in ("physical_to_logical_map", "logical_to_physical_map", "logical_replica_count"):
        if k not in t:
            problems.append(f"vllm: no {k}")
        elif t[k][0] != "I64":
            problems.append(f"vllm: {k} dtype {t[k][0]}")
    if not problems:
        p2l, l2p, cnt = (t[k][1] for k in ("physical_to_logical_map", "logical_to_physical_map", "logical_replica_count"))
        if not torch.equal(p2l, phy):
            problems.append("vllm: physical_to_logical_map differs from the plan's phy2log")
        width = P - E + 1  # num_redundant_experts + 1 (EplbModelState docstring)
        want_l2p = torch.full((L, E, width), -1, dtype=torch.int64)
        want_cnt = torch.zeros((L, E), dtype=torch.int64)
        for l in range(L):
            for i in range(P):  # EplbState.add_model's fill loop
                e = int(phy[l, i])
                want_l2p[l, e, want_cnt[l, e]] = i
                want_cnt[l, e] += 1
        if tuple(l2p.shape) != tuple(want_l2p.shape) or not torch.equal(l2p, want_l2p):
            problems.append(f"vllm: logical_to_physical_map {tuple(l2p.shape)} differs from add_model's fill")
        if not torch.equal(cnt, want_cnt):
            problems.append("vllm: logical_replica_count differs")
        if not torch.equal(cnt, (l2p != -1).sum(dim=-1)):
            problems.append("vllm: logical_replica_count is not the non -1 count")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
        sys.exit(0)
    args = sys.argv[2:]
    sys.exit(max(check(*args[i:i + 3]) for i in range(0, len(args), 3)))
