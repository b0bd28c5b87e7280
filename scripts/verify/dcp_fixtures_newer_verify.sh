#!/bin/sh
# torch's own readers on the newer DCP fixtures, bit for bit against their truth (outside CI; root;
# after scripts/fixtures/dcp_fixtures_newer.sh has built the overlay; tests/formats/dcp/data/README.md):
#
#   scripts/verify/dcp_fixtures_newer_verify.sh [DATA]     (default: tests/formats/dcp/data)
#
# torch 2.14.1's FileSystemReader (torch2lab dcp_ref.py through the overlay) for the FileSystemWriter
# saves, 2.14.1's HuggingFaceStorageReader + dcp.load for the safetensors flavour, torch 2.6's own
# dcp_ref.py for the t26_* saves (t26_strides6_w2 is expected to fail: 2.6 and 2.14.1 read 5 items).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=$(cd "${1:-$HERE/../../tests/formats/dcp/data}" && pwd)
TRIXIE=${TRIXIE:-/opt/trixie}
LAB=$TRIXIE/lab/h30d
rm -rf "$LAB/check" && mkdir -p "$LAB/check" && cp -r "$DATA"/t214_* "$DATA"/t26_* "$LAB/check/"
py() {  # PYTHONPATH, python arguments
  pp=$1; shift
  chroot "$TRIXIE" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 PYTHONPATH="$pp" \
    PYTHONWARNINGS=ignore PYTHONDONTWRITEBYTECODE=1 python3 "$@" 2>&1 | grep -v dcp_fixtures_newer_shim | tail -1
}
OV=/lab/h30d/ov214:/lab/h30d/shim
for v in t214_zstd_w2 t214_plain_w2; do
  printf '%s (torch 2.14.1 FileSystemReader): ' "$v"
  py $OV -c "import dcp_fixtures_newer_shim, runpy, sys; sys.argv = ['dcp_ref.py', '/lab/h30d/check/$v', '--out', '/tmp/ref_$v', '--truth', '/lab/h30d/check/$v.truth']; runpy.run_path('/torch2lab/dcp_ref.py', run_name='__main__')"
done
for v in t214_hf_w2:t214_hf_w2 t214_hfmulti_w2:t214_hfmulti_w2 t214_hfcons_w2/sharded:t214_hfcons_w2 \
         t214_hfcons_w2:t214_hfcons_w2; do
  ck=${v%%:*}; tr=${v##*:}
  printf '%s (torch 2.14.1 HuggingFaceStorageReader): ' "$ck"
  py $OV -c "
import dcp_fixtures_newer_shim, torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader
from safetensors.torch import load_file
t = load_file('/lab/h30d/check/$tr.truth/tensors.safetensors')
sd = {k: torch.zeros_like(x) for k, x in t.items()}
dcp.load(sd, storage_reader=HuggingFaceStorageReader('/lab/h30d/check/$ck'))
ok = sum(torch.equal(sd[k].view(torch.uint8), t[k].view(torch.uint8)) for k in t)
print('%d passed, %d failed' % (ok, len(t) - ok))"
done
for v in t26_shardprops_w2 t26_strides6_w2; do
  printf '%s (torch 2.6 FileSystemReader): ' "$v"
  py /lab/h30d/shim /torch2lab/dcp_ref.py "/lab/h30d/check/$v" --out "/tmp/ref_$v" --truth "/lab/h30d/check/$v.truth"
done
