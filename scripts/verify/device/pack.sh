#!/usr/bin/env bash
# Packs a trimmed build for the lent GPU machine (which has none of the Debian packages) into
# .devbuild/: binaries, libucpkit, test_reshard with its ctest fixtures, and the Debian runtime libraries
# they need (NCCL excepted: the machine's pip NCCL is used). Carry `.devbuild` with the device tool and
# run scripts/verify/device/gpu_check.sh there. Usage: scripts/verify/device/pack.sh [build_dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=${1:-$root/build}
dst=$root/.devbuild
rm -rf "$dst"; mkdir -p "$dst/bin" "$dst/lib" "$dst/tests" "$dst/fixtures" "$dst/syslib"
(cd "$build" && ctest -R '^fixtures_reshard$' >/dev/null)
cp -a "$build"/bin/* "$dst/bin/"
cp -a "$build"/lib/libucpkit.so* "$build"/lib/libucpkit_gpu.so* "$dst/lib/"  # the GPU module is dlopen()ed: ldd does not list it
cp -a "$build/tests/test_reshard" "$dst/tests/"
# only what the GPU test reads (the first case of cases.json): the whole set is over the carry limit
mkdir -p "$dst/fixtures/reshard"
first=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["name"])' "$build/fixtures/reshard/cases.json")
cp -a "$build/fixtures/reshard/cases.json" "$build/fixtures/reshard/$first" "$dst/fixtures/reshard/"
strip --strip-unneeded "$dst"/bin/* "$dst"/lib/libucpkit*.so* "$dst/tests/test_reshard" 2>/dev/null || true
for f in "$dst"/bin/* "$dst"/lib/libucpkit.so "$dst"/lib/libucpkit_gpu.so "$dst/tests/test_reshard"; do
  ldd "$f" | awk '/=> \//{print $3}'
done | sort -u | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64|libpthread|libdl|librt|libnccl|libucpkit)\.so' |
  while read -r lib; do cp -L "$lib" "$dst/syslib/"; done
du -sh "$dst" "$dst"/*
