#!/usr/bin/env bash
# The GPU check of ucp-load --device cuda (issue: GPU path), run on the lent GPU machine through the
# device tool, from the repository root, with a trimmed build carried as .devbuild/ (made here by
# scripts/verify/device/pack.sh: binaries, libucpkit, test_reshard, its fixtures, the Debian runtime libraries).
#   scripts/verify/device/gpu_check.sh [layers] [hidden]     (writes its log and results under $OUT)
# Steps: probe; real torch 2.x fixtures; the GPU gtest; a >= 2 GB checkpoint generated with the
# machine's torch 2.x -> ucp-union -> ucp-load on CPU and --device cuda per DP rank (GB/s vs pinned
# cudaMemcpy in the same run); torch 2.x reads the CPU output and checks the GPU partitions' CRCs.
set -uo pipefail
root=$(pwd)
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
layers=${1:-12} hidden=${2:-1024}
step() { echo; echo "=== $* ($(date +%T))"; }

step probe
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, numpy, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__, "cuda", torch.cuda.is_available())'
nproc; free -g | head -2; df -h /tmp | tail -1
# Compile-time paths of the carried build are /work/main/...: point them at this copy.
if [ "$root" != /work/main ]; then mkdir -p /work && ln -sfn "$root" /work/main; fi
ln -sfn "$root/.devbuild" "$root/build"
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH="$root/.devbuild/syslib:${nccl}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
B=$root/build/bin
ldd "$B/ucp-load" | grep -E "not found|nccl|cudart|tbb|mpi" || true

step "real torch 2.x fixtures"
python3 scripts/verify/device/torch2_fixtures.py "$OUT/torch2" && tar -C "$OUT" -czf "$OUT/torch2.tar.gz" torch2 && rm -rf "$OUT/torch2"

step "GPU gtest (LoadDevice.*)"
"$root/build/tests/test_reshard" --gtest_filter='LoadDevice.*' > "$OUT/gtest.txt" 2>&1; grep -E "^\[|Failure|Expected|Which is|error" "$OUT/gtest.txt" | head -40

step "generate a checkpoint with torch $(python3 -c 'import torch; print(torch.__version__)') (layers $layers, hidden $hidden)"
W=/tmp/gpuw; rm -rf $W; mkdir -p $W
time python3 tests/generator/gen_ds_checkpoint.py --output $W/src --model gpt --layers "$layers" --hidden "$hidden" \
  --heads 16 --ffn $((4 * hidden)) --vocab 50304 --seq 2048 --tp 1 --pp 1 --dp 2 --zero 1 --dtype bf16 --no-truth
du -sh $W/src
step "ucp-union"
time "$B/ucp-union" -q --input $W/src --output $W/u || echo "ucp-union FAILED on a torch $(python3 -c 'import torch; print(torch.__version__)') checkpoint"
du -sh $W/u
common="--input $W/u --tp 1 --pp 1 --dp 2 --zero-stage 1"
step "ucp-load CPU (both ranks' files)"
time "$B/ucp-load" -q --dtype bf16 --output $W/cpu $common
for r in 0 1; do
  step "ucp-load --device cuda --dp-rank $r (cold: first touch of the page cache is warm from the CPU run)"
  for rep in 1 2 3; do
    /usr/bin/env time -f "wall %e s, max RSS %M KiB" "$B/ucp-load" --device cuda -q --json --dp-rank $r $common > $W/gpu$r.json \
      || time "$B/ucp-load" --device cuda -q --json --dp-rank $r $common > $W/gpu$r.json
    python3 -c "import json; j=json.load(open('$W/gpu$r.json')); b=j['baseline_pinned_memcpy_gbps']; print('rep $rep: bytes', j['bytes_to_device'], 'transfers', round(j['gbps'],2), 'GB/s (%.3f of memcpy)' % (j['gbps']/b), 'end to end', round(j['end_to_end_seconds'],3), 's', round(j['end_to_end_gbps'],2), 'GB/s (%.3f of memcpy)' % (j['end_to_end_gbps']/b), 'pinned memcpy', round(b,2), 'GB/s', 'threads', j['threads'], 'phases', {k: round(v,3) for k,v in j['phase_seconds'].items()})"
  done
  cp $W/gpu$r.json "$OUT/gpu$r.json"
done
step "ucp-load --device cuda --dp 1 (the whole 2.46 GB of fp32 + moments to one GPU)"
for rep in 1 2 3; do
  "$B/ucp-load" --device cuda -q --json --dp-rank 0 --input $W/u --tp 1 --pp 1 --dp 1 --zero-stage 1 > $W/gpu_dp1.json
  python3 -c "import json; j=json.load(open('$W/gpu_dp1.json')); b=j['baseline_pinned_memcpy_gbps']; print('rep $rep: bytes', j['bytes_to_device'], 'transfers %.2f GB/s (%.3f of memcpy), end to end %.3f s %.2f GB/s, stage %.3f s = %.2f GB/s, memcpy %.2f GB/s' % (j['gbps'], j['gbps']/b, j['end_to_end_seconds'], j['end_to_end_gbps'], j['phase_seconds']['stage'], j['bytes_to_device']/j['phase_seconds']['stage']/1e9, b))"
done
cp $W/gpu_dp1.json "$OUT/gpu_dp1.json"
step "host read floor: the universal checkpoint's files read from the page cache by 16 processes"
for rep in 1 2 3; do
  s=$(date +%s.%N); find $W/u -name '*.pt' -print0 | xargs -0 -P16 -n4 cat > /dev/null; e=$(date +%s.%N)
  python3 -c "b=$(du -sb $W/u | cut -f1); t=$e-$s; print('rep $rep: %.2f GB in %.3f s = %.2f GB/s' % (b/1e9, t, b/1e9/t))"
done
step "torch reads ucp-load's CPU output; GPU partition CRCs"
python3 scripts/verify/device/torch_reads_output.py $W/cpu $W/gpu0.json $W/gpu1.json
step done
