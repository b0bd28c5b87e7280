#!/usr/bin/env bash
# Builds ucpkit ON the lent GPU machine (CUDA + NCCL of that machine, sm_90) and runs the test suite
# there. That machine has none of the Debian packages: carry `.devdeb` (the Debian 12 -dev packages,
# fetched here with `apt-get download`, see docs/ucp-load.md "GPU path") and `.devbuild` (for the
# runtime libraries, scripts/verify/device/pack.sh). Usage there: scripts/verify/device/build_on_gpu.sh [ctest args]
set -uo pipefail
root=$(pwd)
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
P=/opt/deb
L=$P/usr/lib/x86_64-linux-gnu
mkdir -p $P
for f in .devdeb/*.deb; do dpkg -x "$f" $P; done
nccl=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])')
ln -sf "$nccl/lib/libnccl.so.2" "$nccl/lib/libnccl.so"
export CPLUS_INCLUDE_PATH="$P/usr/include" LIBRARY_PATH="$L"  # the fuzz target is built by a plain clang++ command
export LD_LIBRARY_PATH="$L:$root/.devbuild/syslib:$nccl/lib:${LD_LIBRARY_PATH:-}"
# The tests call /usr/bin/python3 (Debian's, with torch): in this throwaway copy, point them at the
# machine's torch 2.x Python instead (a venv's python3 is a symlink to /usr/bin/python3, so no link).
py=$(command -v python3)
grep -rl /usr/bin/python3 tests scripts CMakeLists.txt | grep -v scripts/verify/device | xargs sed -i "s#/usr/bin/python3#$py#g"
echo "nvcc: $(nvcc --version | tail -1); NCCL from $nccl; fixtures by $($py -c 'import torch; print("torch", torch.__version__)')"
B=/tmp/b
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$P/usr" -DZLIB_ROOT=$P/usr \
  -DMPI_CXX_HEADER_DIR=$L/openmpi/include -DMPI_CXX_LIB_NAMES="mpi_cxx;mpi" \
  -DMPI_mpi_LIBRARY=$L/openmpi/lib/libmpi.so -DMPI_mpi_cxx_LIBRARY=$L/openmpi/lib/libmpi_cxx.so \
  -DNCCL_LIBRARY="$nccl/lib/libnccl.so" -DNCCL_INCLUDE_DIR="$nccl/include" -DCMAKE_CUDA_ARCHITECTURES=90 \
  > "$OUT/cmake.txt" 2>&1 || { tail -40 "$OUT/cmake.txt"; exit 1; }
grep -E "ucpkit:|CUDA|MPI" "$OUT/cmake.txt"
time cmake --build $B -j 16 > "$OUT/build.txt" 2>&1 || { grep -E "error|Error" -A3 "$OUT/build.txt" | head -60; exit 1; }
echo "build OK"
cd $B && ctest -j 16 --timeout 300 "$@" > "$OUT/ctest.txt" 2>&1
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Skipped" "$OUT/ctest.txt" | head -60
grep -E "LoadDevice" "$OUT/ctest.txt"
