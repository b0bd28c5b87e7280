#!/usr/bin/env bash
# Outside CI (issue 30 part B; needs the torch2lab chroot, ../shared/tools/torch2lab/README.md): a generated
# Megatron-DeepSpeed Llama GQA + SwiGLU checkpoint (TP 2, 4 heads, 2 query groups) -> ucp-union --to-names
# megatron-core -> ucp-load --format torch_dist -> Megatron-Core's own reader (mcore_ckpt.py truth:
# dist_checkpointing.load_plain_tensors) -> every optimizer state and bf16 weight, read as Megatron-Core reads
# it, equal to the generator's truth (scripts/verify/megatron_core_names_verify.py). The same check on the one pass
# ucp-load --input <the DeepSpeed checkpoint> --format torch_dist (no Megatron-Core-named folder in between).
# Usage: scripts/verify/megatron_core_names_verify.sh [build_dir]   (run as root; writes under /opt/trixie/lab/h30b_verify)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$src/build}/bin
lab=${TRIXIE:-/opt/trixie}/lab/h30b_verify
rm -rf "$lab" && mkdir -p "$lab"
/usr/bin/python3 "$src/tests/generator/gen_ds_checkpoint.py" --output "$lab/src" --model llama --tp 2 --dp 1 >/dev/null
"$bin/ucp-union" -q --input "$lab/src" --output "$lab/mc" --to-names megatron-core
"$bin/ucp-load" -q --input "$lab/mc" --output "$lab/td" --format torch_dist
"$bin/ucp-load" -q --input "$lab/src" --output "$lab/td1" --format torch_dist 2>/dev/null
cp -r "$src/tests/generator" "$lab/generator"
cp "$src/scripts/verify/megatron_core_names_verify.py" "$lab/"
for out in td td1; do
  echo "== $out ($([ $out = td ] && echo "two runs" || echo "one pass"))"
  it=$(cat "$lab/$out/latest_checkpointed_iteration.txt")
  "$src/../shared/tools/torch2lab/lab.sh" mcore_ckpt.py truth --ckpt "/lab/h30b_verify/$out/iter_$(printf %07d "$it")" \
    --truth /lab/h30b_verify/$out/truth >/dev/null 2>&1
  chroot "${TRIXIE:-/opt/trixie}" python3 /lab/h30b_verify/megatron_core_names_verify.py /lab/h30b_verify/$out/truth \
    /lab/h30b_verify/src/truth /lab/h30b_verify/generator
done
