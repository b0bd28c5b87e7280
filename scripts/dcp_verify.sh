#!/bin/sh
# Checks ucpkit's DCP writer against the real torch 2.6 (not in CI; run as root on a machine with the
# Debian-trixie chroot that ../shared/tools/torch2-env.sh builds):
#
#   scripts/dcp_verify.sh            # TRIXIE=/opt/trixie, build folder ./build
#
# 1. The gtest DcpVerifyWriter.WritesOurOutputForRealTorch (build/tests/test_formats) writes our DCP
#    output for every committed fixture (tests/formats/dcp/data: whole tensors, rows / columns for 2
#    ranks, rows / a 2x2 grid for 4 ranks) and the merged rank-local save into $TRIXIE/lab/dcpverify.
# 2. scripts/dcp_verify.py runs in the chroot: torch's own dcp.load at every other world size of 1,
#    2 and 4 (gloo, USE_LIBUV=0, DTensors resharded), each tensor compared bit for bit with the
#    fixture's recorded truth, each bytes item with torch's own load of the original fixture.
# Exit status: 0 when every tensor and bytes item is equal.
set -e
HERE=$(cd "$(dirname "$0")/.." && pwd)
TRIXIE=${TRIXIE:-/opt/trixie}
BUILD=${BUILD:-$HERE/build}
LAB=$TRIXIE/lab/dcpverify
rm -rf "$LAB"
mkdir -p "$LAB/truth" "$LAB/src"
UCPKIT_DCP_VERIFY_OUT="$LAB" "$BUILD/tests/test_formats" --gtest_filter='DcpVerifyWriter.*' >"$LAB/writer.log" 2>&1 ||
  { cat "$LAB/writer.log"; exit 1; }
for t in "$HERE"/tests/formats/dcp/data/*.truth; do cp -r "$t" "$LAB/truth/"; done
for d in "$HERE"/tests/formats/dcp/data/*/; do cp -r "$d" "$LAB/src/"; done
cp "$HERE/scripts/dcp_verify.py" "$LAB/"
exec chroot "$TRIXIE" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  PYTHONWARNINGS=ignore PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 USE_LIBUV=0 \
  python3 /lab/dcpverify/dcp_verify.py /lab/dcpverify
