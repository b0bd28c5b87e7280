#!/usr/bin/env bash
# The Debian package, end to end (outside CI: it installs and removes a system package; as root).
# Makes the packages with CPack from a configured and built build folder, installs the main one with
# `apt-get install ./ucpkit_*.deb`, runs every tool from /usr/bin (--version, man page, a conversion:
# ucp-union of a small generated checkpoint, ucp-load of the result; ucp-load --device cuda without the
# ucpkit-gpu package fails with one line), then removes the package.
# Usage: scripts/checks/test_deb.sh [build_dir]   (default build/; build it first, e.g. scripts/setup.sh --tools)
# The result of the last run is written in docs/install.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
fail() { echo "test_deb: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "run as root (apt-get install / remove)"
if dpkg-query -W -f='${Status}' ucpkit 2>/dev/null | grep -q "install ok installed"; then
  fail "a ucpkit package is installed already: remove it first (apt-get remove ucpkit)"
fi
work=$(mktemp -d /tmp/ucpkit-deb.XXXXXX)
installed=0
cleanup() {
  if [ "$installed" = 1 ]; then DEBIAN_FRONTEND=noninteractive apt-get purge -y -q ucpkit >/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

(cd "$build" && cpack -G DEB -B "$work/pkg" >"$work/cpack.log" 2>&1) ||
  fail "cpack (is $build built? cmake --build $build --target ucpkit_tools): $(grep -E 'Error|cannot' "$work/cpack.log" | head -3 | tr -s ' \n' ' ')"
cd "$work/pkg"
deb=$(ls ucpkit_*.deb) || fail "cpack made no ucpkit_*.deb: $(ls)"
echo "test_deb: $(ls -1 ./*.deb | tr '\n' ' ')"
dpkg-deb -f "$deb" Package Version Depends Recommends
tools=$(dpkg-deb -c "$deb" | sed -n 's|.* \./usr/bin/\(.*\)$|\1|p')
[ -n "$tools" ] || fail "$deb installs no tool under /usr/bin"

DEBIAN_FRONTEND=noninteractive apt-get install -y -q ./"$deb" >"$work/apt.log" 2>&1 || fail "apt-get install ./$deb: $(tail -5 "$work/apt.log")"
installed=1
cd "$work"
for t in $tools; do
  [ "$(command -v "$t")" = "/usr/bin/$t" ] || fail "$t is not /usr/bin/$t on PATH"
  "/usr/bin/$t" --version | head -1 | grep -q "^$t (ucpkit) " || fail "/usr/bin/$t --version"
  man -w "$t" >/dev/null 2>&1 || [ -f "/usr/share/man/man1/$t.1.gz" ] || [ -f "/usr/share/man/man1/$t.1" ] ||
    fail "no man page for $t"
done
if readelf -d /usr/bin/ucp-load /usr/lib/libucpkit.so | grep -E 'NEEDED.*(libcudart|libnccl)'; then
  fail "the packaged tools need CUDA libraries at start"
fi
[ -x /usr/share/ucpkit/examples/slurm/elastic_resume.sbatch ] && [ -f /usr/share/ucpkit/examples/slurm/common.sh ] ||
  fail "the Slurm job scripts are not in the package (/usr/share/ucpkit/examples/slurm)"
/usr/bin/python3 "$root/tests/generator/gen_ds_checkpoint.py" --output ck --model gpt --tp 2 --pp 1 --dp 2 --zero 1 \
  --dtype bf16 --layers 2 --hidden 32 --heads 4 --ffn 64 --vocab 96 --seq 16 --seed 3 >/dev/null
ucp-union -q --input ck --output universal || fail "/usr/bin/ucp-union"
ucp-load -q --input universal --output target --tp 1 --pp 1 --dp 1 --zero-stage 1 || fail "/usr/bin/ucp-load"
/usr/bin/python3 "$root/tests/to_universal/check_universal.py" universal ck >/dev/null || fail "ucp-union from /usr/bin: wrong output"
# Without the ucpkit-gpu package, --device cuda says so in one line, exit 1.
set +e
err=$(ucp-load --device cuda --input universal --tp 1 --pp 1 --dp 1 --zero-stage 1 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 1 ] && [ "$(wc -l <<<"$err")" -eq 1 ] && grep -q '^ucp-load: error: no GPU: ' <<<"$err" ||
  fail "ucp-load --device cuda from /usr/bin: exit $rc: $err"
echo "test_deb: $err"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q ucpkit >/dev/null || fail "apt-get purge ucpkit"
installed=0
[ ! -e /usr/bin/ucp-load ] || fail "/usr/bin/ucp-load left after apt-get purge"
echo "test_deb: ok ($deb: $(echo $tools | wc -w) tools ran from /usr/bin; installed and purged with apt-get)"
