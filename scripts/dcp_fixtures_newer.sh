#!/bin/sh
# DCP fixtures written by newer torch DCP save code than the installed torch 2.6 (outside CI; run as
# root; tests/formats/dcp/data/README.md, docs/formats-dcp.md):
#
#   scripts/dcp_fixtures_newer.sh [OUT]     (default: tests/formats/dcp/data)
#
# torch 2.14.1's torch/distributed/checkpoint package (pure Python) comes from Debian sid's
# python3-torch 2.14.1+dfsg-1 (.deb fetched with apt-get download through a private sources list; the
# chroot's own apt state is not touched). It is overlaid on the chroot's torch 2.6.0: $LAB/ov214/torch
# is a folder of symlinks to every entry of the installed torch package except distributed/, whose
# entries are symlinks too except checkpoint/, a copy of 2.14.1's. PYTHONPATH puts it first; the
# installed torch is not modified. scripts/dcp214_shim.py supplies, verbatim from 2.14.1, what 2.14's
# package imports and 2.6 lacks (torch._utils.try_import; torch.cuda._pin_memory_utils), and nothing
# else. The saving script is scripts/dcp_fixtures_newer.py (torch2lab's dcp_save.py model, sharding
# and truth; the real dcp.save of 2.14.1 from 2 gloo CPU ranks, USE_LIBUV=0).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$HERE/../tests/formats/dcp/data}
TRIXIE=${TRIXIE:-/opt/trixie}
TORCH2LAB=${TORCH2LAB:-$HERE/../../shared/tools/torch2lab}
LAB=$TRIXIE/lab/h30d
mkdir -p "$LAB/aptlists/partial" "$LAB/shim" "$LAB/out" "$TRIXIE/torch2lab"
chroot "$TRIXIE" python3 -c 'import zstandard' 2>/dev/null || chroot "$TRIXIE" apt-get install -y python3-zstandard
# 1. torch 2.14.1's python package from Debian sid (its InRelease is past Valid-Until on this clock).
if [ ! -d "$LAB/x214/usr/lib/python3/dist-packages/torch" ]; then
  printf 'deb http://deb.debian.org/debian sid main\n' >"$LAB/sid.list"
  A="-o Acquire::Check-Valid-Until=false -o Dir::Etc::SourceList=/lab/h30d/sid.list -o Dir::Etc::SourceParts=/nonexistent -o Dir::State::Lists=/lab/h30d/aptlists -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache="
  chroot "$TRIXIE" apt-get $A update
  chroot "$TRIXIE" sh -c "cd /lab/h30d && apt-get $A download python3-torch=2.14.1+dfsg-1"
  rm -rf "$LAB/x214" && dpkg-deb -x "$LAB"/python3-torch_2.14.1+dfsg-1_amd64.deb "$LAB/x214"
fi
# 2. the overlay: installed torch 2.6 with only distributed/checkpoint replaced by 2.14.1's.
T=$TRIXIE/usr/lib/python3/dist-packages/torch
rm -rf "$LAB/ov214" && mkdir -p "$LAB/ov214/torch/distributed"
for e in "$T"/* "$T"/.[!.]*; do
  [ -e "$e" ] || continue; n=$(basename "$e")
  [ "$n" = distributed ] || ln -s "/usr/lib/python3/dist-packages/torch/$n" "$LAB/ov214/torch/$n"
done
for e in "$T"/distributed/*; do
  n=$(basename "$e")
  [ "$n" = checkpoint ] || ln -s "/usr/lib/python3/dist-packages/torch/distributed/$n" "$LAB/ov214/torch/distributed/$n"
done
cp -r "$LAB/x214/usr/lib/python3/dist-packages/torch/distributed/checkpoint" "$LAB/ov214/torch/distributed/"
cp "$HERE/dcp214_shim.py" "$LAB/shim/" && cp "$HERE/dcp_fixtures_newer.py" "$LAB/"
cp "$TORCH2LAB"/*.py "$TRIXIE/torch2lab/"
run() {  # name, arguments (OVERLAY=0: the installed torch 2.6's own DCP package)
  n=$1; shift
  rm -rf "$LAB/out/$n" "$LAB/out/$n.truth"
  echo "== $n: dcp_fixtures_newer.py $*"
  pp=/lab/h30d/ov214:/lab/h30d/shim:/torch2lab; [ "${OVERLAY:-1}" = 0 ] && pp=/lab/h30d/shim:/torch2lab
  chroot "$TRIXIE" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PYTHONPATH=$pp PYTHONWARNINGS=ignore PYTHONDONTWRITEBYTECODE=1 \
    TORCHDYNAMO_DISABLE=1 OMP_NUM_THREADS=1 USE_LIBUV=0 \
    python3 /lab/h30d/dcp_fixtures_newer.py --out "/lab/h30d/out/$n" "$@" 2>&1 | grep -v 'ProcessGroupGloo' | tail -3
}
run t214_zstd_w2 --variant zstd --optim        # ZStandard on every item, FSDP2 Shard(0) + Adam state
run t214_plain_w2 --variant plain --optim      # the same without extensions: Metadata.version, modules
run t214_ranklocal_w2 --variant ranklocal      # use_collectives=False: __0.metadata, __1.metadata
run t214_hf_w2 --variant hf                    # HuggingFaceStorageWriter(save_distributed=True)
run t214_hfcons_w2 --variant hfcons            # ... enable_consolidation=True: sharded/ + consolidated
run t214_hfmulti_w2 --variant hfmulti          # ... fqn_to_index_mapping: two files per rank
# torch 2.6's own save: the torch 2.0-2.2 TensorProperties class path as torch's compatibility test
# makes it, and an EMULATED 6-item TensorProperties state (see dcp_fixtures_newer.py's docstring)
OVERLAY=0 run t26_shardprops_w2 --variant shardprops --optim
OVERLAY=0 run t26_strides6_w2 --variant strides6
# One process, no process group: large zstd items (MiBs decoded from a few hundred bytes stored), so
# the decoder's output grows through many 128 KiB blocks. Truth: truth.json, per tensor dtype, shape,
# byte count and zlib.crc32 of its bytes, computed by the saving script (6 MiB of safetensors would be
# too large to commit for what it tells).
rm -rf "$LAB/out/t214_zstd_big_w1" "$LAB/out/t214_zstd_big_w1.truth"
echo "== t214_zstd_big_w1 (inline)"
chroot "$TRIXIE" /usr/bin/env -i PATH=/usr/bin:/bin PYTHONPATH=/lab/h30d/ov214:/lab/h30d/shim PYTHONWARNINGS=ignore \
  python3 -c '
import json, os, zlib, dcp214_shim, torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._extension import ZStandard
sd = {"zeros": torch.zeros(1 << 20),                                          # 4 MiB float32
      "pattern": (torch.arange(256).repeat(4096) / 7).to(torch.bfloat16)}     # 2 MiB bfloat16, periodic
dcp.save(sd, storage_writer=dcp.FileSystemWriter("/lab/h30d/out/t214_zstd_big_w1", _extensions=[ZStandard()]))
os.makedirs("/lab/h30d/out/t214_zstd_big_w1.truth")
truth = {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape), "nbytes": v.numel() * v.element_size(),
             "crc32": zlib.crc32(v.contiguous().view(-1).view(torch.uint8).numpy().tobytes())} for k, v in sd.items()}
json.dump(truth, open("/lab/h30d/out/t214_zstd_big_w1.truth/truth.json", "w"), indent=1, sort_keys=True)
' 2>&1 | { grep -v dcp214_shim || true; }
mkdir -p "$OUT"
for v in t214_zstd_w2 t214_plain_w2 t214_ranklocal_w2 t214_hf_w2 t214_hfcons_w2 t214_hfmulti_w2 t26_shardprops_w2 \
         t26_strides6_w2 t214_zstd_big_w1; do
  rm -rf "$OUT/$v" "$OUT/$v.truth"
  cp -r "$LAB/out/$v" "$LAB/out/$v.truth" "$OUT/"
done
du -sh "$OUT"
