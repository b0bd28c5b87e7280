#!/usr/bin/env bash
# Hugging Face in and out (issue 49, docs/hf.md "Benchmark"), each against, in the same run and on the same
# input, the floor "read the input once and write the output once" (every data byte of the input read, holes
# skipped; as many bytes written as the output holds on disk; sync -f: bench_lib.sh floor_data), and the peer a user
# would run instead where it can run here (transformers 5's from_pretrained + save_pretrained of the same folder: the
# Hugging Face side of any converter). Conversions timed:
#   import  ucp-load --input <hf> --format torch_dist --tp 2 --pp 1 --dp 1   (fp32 masters and Adam moments written)
#           and the same under mpirun -np 2 (import_np2)
#   export  ucp-load --input <that torch_dist save> --format hf
# Time (s) and peak RSS (GNU time) per round, rounds alternating, medians and ratios at the end. The input
# (bench_hf_make.py, transformers' save_pretrained, bf16, 1 GB shards) is made once and kept.
# Usage: bench/bench_hf.sh [build_dir] [rounds]   env: HIDDEN (1536), INTER (4096), LAYERS (6), VOCAB (32000), WORK;
#        MODEL=qwen3moe: instead a Qwen3-MoE-shaped folder (bench_hf_make.py qwen3moe: vocabulary 151,936 x hidden 2048, LAYERS
#        (2) layers of EXPERTS (8) experts), imported at TP 2 x EP 4 x DP 4
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
rounds=${2:-2}
HIDDEN=${HIDDEN:-1536}; INTER=${INTER:-4096}; VOCAB=${VOCAB:-32000}
if [[ ${MODEL:-} == qwen3moe ]]; then LAYERS=${LAYERS:-2}; else LAYERS=${LAYERS:-6}; fi
work=${WORK:-/tmp/ucpkit-bench-hf}
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
. "$root/bench/bench_lib.sh"
mkdir -p "$work"
if [[ ${MODEL:-} == qwen3moe ]]; then
  hf=$work/qwen3moe-l$LAYERS-e${EXPERTS:=8}
  layout=(--tp 2 --ep 4 --dp 4)
  [ -f "$hf/config.json" ] || PYTHONWARNINGS=ignore "$FRAMEWORKS_PY" "$root/bench/bench_hf_make.py" "$hf" qwen3moe "$LAYERS" "$EXPERTS" 2>/dev/null
else
  hf=$work/hf-h$HIDDEN-l$LAYERS
  layout=(--tp 2 --pp 1 --dp 1)
  [ -f "$hf/config.json" ] || PYTHONWARNINGS=ignore "$FRAMEWORKS_PY" "$root/bench/bench_hf_make.py" "$hf" "$HIDDEN" "$INTER" "$LAYERS" "$VOCAB" 2>/dev/null
fi
bytes() { du -sb "$1" | cut -f1; }
peer=$work/peer.py
cat > "$peer" <<'PY'
import sys, warnings
warnings.filterwarnings("ignore")
import torch
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).save_pretrained(sys.argv[2], max_shard_size="1GB")
PY
echo "input: $hf, $(bytes "$hf") bytes ($(ls "$hf" | tr '\n' ' '))"
for ((r = 1; r <= rounds; r++)); do
  rm -rf "$work/td" "$work/td2" "$work/back" "$work/peer_out"
  room $((10 * $(bytes "$hf")))
  add import $(measure "$build/bin/ucp-load" -q --input "$hf" --format torch_dist "${layout[@]}" --output "$work/td")
  td_bytes=$(du -s -B1 "$work/td" | cut -f1)  # on disk: the zero moments are holes
  # The same import by two MPI ranks (the data files shared: docs/ucp-load.md), written beside and removed.
  add import_np2 $(measure env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --allow-run-as-root \
    --oversubscribe -np 2 "$build/bin/ucp-load" -q --input "$hf" --format torch_dist "${layout[@]}" --output "$work/td2")
  rm -rf "$work/td2"
  add import_floor $(measure bash -c "$(declare -f floor_data); floor_data '$hf' $td_bytes '$work/floor.bin'")
  iter=$work/td/release  # an import is a release save (weights without a training run)
  [[ -d $iter ]] || iter=$(ls -d "$work"/td/iter_*)
  add export $(measure "$build/bin/ucp-load" -q --input "$work/td" --format hf --output "$work/back")
  add export_floor $(measure bash -c "$(declare -f floor_data); floor_data '$iter' $(bytes "$work/back") '$work/floor.bin'")
  add peer $(measure env PYTHONWARNINGS=ignore "$FRAMEWORKS_PY" "$peer" "$hf" "$work/peer_out")
  echo "round $r: import ${t[import]##* } export ${t[export]##* } (seconds so far: ${t[import]}/ ${t[export]})" | tr -s ' '
done
"$FRAMEWORKS_PY" - "$hf" "$work/back" <<'PY'
import sys, torch
from safetensors.torch import load_file
import glob
def tensors(d):
    out = {}
    for f in sorted(glob.glob(f"{d}/*.safetensors")): out.update(load_file(f))
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
print(f"round trip: {len(a)} tensors, {'bit-identical' if same else 'DIFFERENT'}")
PY
printf "%-13s %9s %9s %11s\n" step wall_s cpu_s peak_rss_MB
for k in import import_np2 import_floor export export_floor peer; do
  printf "%-13s %9s %9s %11.0f\n" "$k" "$(med <<< "${t[$k]}")" "$(med <<< "${c[$k]}")" "$(awk -v x="$(med <<< "${m[$k]}")" 'BEGIN{print x/1024}')"
done
awk -v a="$(med <<< "${t[import]}")" -v b="$(med <<< "${t[import_floor]}")" -v c="$(med <<< "${t[export]}")" \
    -v d="$(med <<< "${t[export_floor]}")" -v e="$(med <<< "${t[peer]}")" \
    -v n="$(med <<< "${t[import_np2]}")" \
    'BEGIN { printf "import / floor %.2f (mpirun -np 2: %.2f of one process), export / floor %.2f, export / transformers round trip %.2f\n", a / b, n / a, c / d, c / e }'
