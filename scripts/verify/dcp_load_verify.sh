#!/bin/sh
# Checks ucp-load --format dcp against the real torch (not in CI). By default with the pinned framework
# environment's torch 2.15 (scripts/frameworks/setup.sh; no root, no chroot):
#
#   scripts/verify/dcp_load_verify.sh [BUILD]   # BUILD: a build folder or an install prefix with bin/ (default ./build)
#   FIXTURES=... scripts/verify/dcp_load_verify.sh BUILD   # default BUILD/fixtures/reshard, else ./build/fixtures/reshard
#   FRAMEWORKS_PY=/path/to/python scripts/verify/dcp_load_verify.sh BUILD  # another interpreter with torch >= 2.4
#   TRIXIE=/opt/trixie scripts/verify/dcp_load_verify.sh BUILD             # the older line, as root (below)
#
# The line that is the point: the newest torch (2.15.0, pinned), whose dcp.load users run on our output.
# TRIXIE=... keeps the old path: torch 2.6 (Debian trixie's python3-torch) in the chroot that
# ../shared/tools/torch2-env.sh builds (an older torch reading the .metadata we write).
#
# 1. ucp-union turns every dsgen load fixture (FIXTURES/*/src, made by ctest's fixtures_reshard: GPT,
#    pipeline, ZeRO-3 flat, fp16, native MoE, Llama BF16_Optimizer) into a universal folder; ucp-load
#    --format dcp writes each fp32 whole (one rank), and the GPT one also as fp32 rows (--world-size 2:
#    FSDP2's Shard(0)) and bf16 whole, and those DCP folders re-chunked by ucp-load --input <DCP>
#    (whole -> 2 ranks, 2 ranks -> whole). Run from the work folder with relative paths, as job scripts
#    run the tools.
# 2. scripts/verify/dcp_load_verify.py: torch's own dcp.load of each folder at world size 1 (plain tensors) and
#    2 (DTensors Shard(0) on a gloo mesh), into the nested state dict rebuilt from the folder's
#    planner_data ({"model": ..., "optim": {"state": ..., "param_groups": [...]}}), each tensor compared
#    bit for bit with the universal truth torch reads (fp32 master cast by torch's .to(dtype), exp_avg,
#    exp_avg_sq), each step and param_groups value with the universal folder's.
# Output: one line per folder and load, `RESULT framework=torch version=... case=dcp_load_verify/<folder>
# tensors=N equal=yes|no values=M` per folder (scripts/frameworks/run_all.sh collects them), a TOTAL line.
# Exit status: 0 when every tensor and value is equal; 77 when no framework environment can be made.
set -e
HERE=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-${BUILD:-$HERE/build}}" && pwd)
FIXTURES=${FIXTURES:-$BUILD/fixtures/reshard}
[ -d "$FIXTURES" ] || FIXTURES=$HERE/build/fixtures/reshard
ls "$FIXTURES"/*/src >/dev/null 2>&1 || { echo "no load fixtures in $FIXTURES (ctest -R fixtures_reshard makes them)"; exit 1; }
BIN=$BUILD/bin
. "$HERE/scripts/frameworks/env.sh"
frameworks_lab "$HERE" dcpload
mkdir -p "$LAB"
cd "$LAB"
: >cases.tsv
for src in "$FIXTURES"/*/src; do
  f=$(basename "$(dirname "$src")")
  "$BIN/ucp-union" -q --input "$src" --output "$f.u"
  "$BIN/ucp-load" -q --input "$f.u" --output "$f.fp32_w1" --format dcp --dtype fp32
  printf '%s\tfp32\t%s\n' "$f.fp32_w1" "$f.u" >>cases.tsv
done
g=gpt_tp1dp2_to_tp2dp3
"$BIN/ucp-load" -q --input $g.u --output $g.fp32_w2 --format dcp --dtype fp32 --world-size 2
"$BIN/ucp-load" -q --input $g.u --output $g.bf16_w1 --format dcp --dtype bf16
printf '%s\tfp32\t%s\n%s\tbf16\t%s\n' $g.fp32_w2 $g.u $g.bf16_w1 $g.u >>cases.tsv
# ucp-load --input <a DCP checkpoint> (issue 30): re-chunked, whole -> 2 ranks' rows and rows -> whole
"$BIN/ucp-load" -q --input $g.fp32_w1 --output $g.rechunk_w2 --format dcp --world-size 2
"$BIN/ucp-load" -q --input $g.fp32_w2 --output $g.rechunk_w1 --format dcp
printf '%s\tfp32\t%s\n%s\tfp32\t%s\n' $g.rechunk_w2 $g.u $g.rechunk_w1 $g.u >>cases.tsv
cp "$HERE/scripts/verify/dcp_load_verify.py" "$LAB/"
if [ -n "${TRIXIE:-}" ]; then
  exec chroot "$TRIXIE" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PYTHONWARNINGS=ignore PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 USE_LIBUV=0 \
    python3 /lab/dcpload/dcp_load_verify.py /lab/dcpload
fi
PYTHONWARNINGS=ignore PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 USE_LIBUV=0 \
  "$FRAMEWORKS_PY" "$LAB/dcp_load_verify.py" "$LAB"
