#!/bin/sh
# Checks ucpkit's DCP writer against the real torch (not in CI). By default with the pinned framework
# environment's torch 2.15 (scripts/frameworks/setup.sh; no root, no chroot):
#
#   scripts/verify/dcp_verify.sh [BUILD]      # BUILD: a build folder or an install prefix (default ./build)
#   FRAMEWORKS_PY=/path/to/python scripts/verify/dcp_verify.sh BUILD      # another interpreter with torch >= 2.4
#   TRIXIE=/opt/trixie scripts/verify/dcp_verify.sh BUILD                 # the older line, as root (below)
#
# The line that is the point: the newest torch (2.15.0, pinned), whose dcp.load users run on our output.
# TRIXIE=... keeps the old path: torch 2.6 (Debian trixie's python3-torch) in the chroot that
# ../shared/tools/torch2-env.sh builds; the point there is that an older torch still unpickles the
# .metadata we write (torch 2.6 is the oldest 2.x line the fixtures were made with).
#
# 1. Our DCP output of the committed fixtures (tests/formats/dcp/data), two writers:
#    * the gtest DcpVerifyWriter.WritesOurOutputForRealTorch (BUILD/tests/test_formats, or $TEST_FORMATS;
#      skipped with a note when BUILD is an install prefix without it): whole tensors, rows / columns for
#      2 ranks, rows / a 2x2 grid for 4 ranks of 7 fixtures, and the merged rank-local save (layouts the
#      CLI cannot ask for);
#    * the shipped tool, `ucp-load --input <fixture> --format dcp --world-size 1|2|4` (BUILD/bin), of
#      the same 7 fixtures and the newer saves (torch 2.14's plain, zstd, rank-local and Hugging Face
#      safetensors flavours, torch 2.6's shard-properties and strides fixtures).
# 2. scripts/verify/dcp_verify.py: torch's own dcp.load at every other world size of 1, 2 and 4 (gloo,
#    DTensors resharded), each tensor compared bit for bit with the fixture's recorded truth, each bytes
#    item with torch's own load of the original fixture; and torch's dcp_to_torch_save of every folder.
# Output: one line per folder and load, then `RESULT framework=torch version=... case=dcp_verify/<fixture>
# tensors=N equal=yes|no` per fixture (scripts/frameworks/run_all.sh collects them) and a TOTAL line.
# Exit status: 0 when every tensor and bytes item is equal; 77 when no framework environment can be made.
set -e
HERE=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-${BUILD:-$HERE/build}}" && pwd)
BIN=$BUILD/bin
DATA=$HERE/tests/formats/dcp/data
TEST_FORMATS=${TEST_FORMATS:-$BUILD/tests/test_formats}
. "$HERE/scripts/frameworks/env.sh"
frameworks_lab "$HERE" dcpverify
mkdir -p "$LAB/truth" "$LAB/src"
: >"$LAB/cases.tsv"
if [ -x "$TEST_FORMATS" ]; then
  UCPKIT_DCP_VERIFY_OUT="$LAB" "$TEST_FORMATS" --gtest_filter='DcpVerifyWriter.*' >"$LAB/writer.log" 2>&1 ||
    { cat "$LAB/writer.log"; exit 1; }
else
  echo "note: no $TEST_FORMATS (an install prefix?): the gtest writer's layouts (columns, 2x2 grid, merged rank-local) are not checked"
fi
# The shipped tool: ucp-load of each fixture for 1, 2 and 4 ranks (run from the lab folder, relative output paths)
# (torch 2.6 has no zstd transform to decode the original t214_zstd_w2's bytes items with: not under TRIXIE)
zstd=t214_zstd_w2; [ -n "${TRIXIE:-}" ] && zstd=
for f in fsdp_w2 twod_w4 fsdp_optim_w2 fsdp_tp_optim_w4 plain_w2 single_item_w1 torch113_w2 ranklocal_w2 \
  t214_plain_w2 $zstd t214_ranklocal_w2 t214_hf_w2 t214_hfmulti_w2 t26_shardprops_w2 t26_strides6_w2; do
  for w in 1 2 4; do
    (cd "$LAB" && "$BIN/ucp-load" -q --input "$DATA/$f" --format dcp --world-size $w --output "${f}__ucpload_w$w") ||
      { echo "ucp-load --input $f --world-size $w failed"; exit 1; }
    printf '%s\t%s\t%s\n' "${f}__ucpload_w$w" "$f" $w >>"$LAB/cases.tsv"
  done
done
for t in "$DATA"/*.truth; do cp -r "$t" "$LAB/truth/"; done
for d in "$DATA"/*/; do case $d in *.truth/) ;; *) cp -r "$d" "$LAB/src/" ;; esac; done
cp "$HERE/scripts/verify/dcp_verify.py" "$LAB/"
if [ -n "${TRIXIE:-}" ]; then
  exec chroot "$TRIXIE" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PYTHONWARNINGS=ignore PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 USE_LIBUV=0 \
    python3 /lab/dcpverify/dcp_verify.py /lab/dcpverify
fi
PYTHONWARNINGS=ignore PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 USE_LIBUV=0 \
  "$FRAMEWORKS_PY" "$LAB/dcp_verify.py" "$LAB"
