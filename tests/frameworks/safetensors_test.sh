#!/usr/bin/env bash
# ucp-load --format safetensors judged by the real safetensors library (issue 48; label `frameworks`,
# docs/frameworks.md "safetensors"). tests/frameworks/safetensors_check.py, run by the pinned environment's
# python: the generator (Debian's python3) writes three DeepSpeed checkpoints with their truth: llama (GQA,
# untied) TP 2 DP 2 ZeRO-1 bf16, native MoE (dsmoe, 4 experts) EP 2 DP 4 ZeRO-1 fp16, gpt ZeRO-3 TP 1 DP 2 fp32
# (vocabulary 100 padded to 104). From another folder with relative paths, ucp-load --format safetensors
# writes 8 cases from ucp-union's universal folder and directly from the checkpoint, at the source's dtype (the
# default) and another, one file or shards (--shard-size), once under `mpirun -np 2` (when mpirun is on PATH).
# safetensors 0.8.0's own loader (`safetensors.torch.load_file`, `safe_open` for the metadata) reads every
# file; the index must name every file and tensor once, and every tensor must equal the truth's fp32 master
# converted by torch to the output dtype, in dtype, shape and bytes. One line and one RESULT line per case, then
# a negative control (one flipped byte is found). Exit 77 (skipped) when the framework environment cannot be made.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
exec "$FRAMEWORKS_PY" "$root/tests/frameworks/safetensors_check.py" "$(cd "$1" && pwd)"
