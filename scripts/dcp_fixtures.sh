#!/bin/sh
# Real DCP fixtures for tests/formats/dcp (outside CI; docs/formats-dcp.md, tests/formats/dcp/data/README.md).
#
#   scripts/dcp_fixtures.sh [OUT]      (default: tests/formats/dcp/data; needs root for the chroot)
#
# torch 2.6 (Debian trixie's python3-torch, in the chroot that ../shared/tools/torch2-env.sh builds)
# writes with the real torch.distributed.checkpoint.save from gloo ranks, through the shared torch2lab
# script dcp_save.py (TinyLlama, torchtitan names); its truth (<variant>.truth/tensors.safetensors) is
# the full state dict gathered by torch's own get_state_dict(full_state_dict=True), not by DCP.
# torch 1.13 (Debian 12's python3-torch, on this host) writes the old class-path era
# (scripts/dcp_fixtures_torch113.py). Small sizes keep the committed files at a few hundred KB.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$HERE/../tests/formats/dcp/data}
TRIXIE=${TRIXIE:-/opt/trixie}
LAB=${LAB:-$HERE/../../shared/tools/torch2lab}
"${TORCH2_ENV:-$HERE/../../shared/tools/torch2-env.sh}" "$TRIXIE"
SMALL="--vocab 32 --dim 8 --hidden 16 --layers 1"
run() {  # name, dcp_save.py arguments
  n=$1; shift
  rm -rf "$TRIXIE/lab/dcpfx/$n" "$TRIXIE/lab/dcpfx/$n.truth"
  echo "== $n: dcp_save.py $*"
  rc=0
  TRIXIE=$TRIXIE "$LAB/lab.sh" dcp_save.py --out "/lab/dcpfx/$n" $SMALL "$@" >"$TRIXIE/lab/dcpfx/$n.log" 2>&1 || rc=$?
  tail -2 "$TRIXIE/lab/dcpfx/$n.log"
  return $rc
}
mkdir -p "$TRIXIE/lab/dcpfx"
run fsdp_w2 --world 2 --layout fsdp                      # DTensor Shard(0): row sharding, 2 ranks
run twod_w4 --world 4 --layout 2d --tp 2                 # 2-D mesh (Shard(0), Shard(1)), 4 ranks
run fsdp_optim_w2 --world 2 --layout fsdp --optim        # + Adam state through get_state_dict
run fsdp_tp_optim_w4 --world 4 --layout fsdp_tp --tp 2 --optim  # FSDP2 x TP, torchtitan placements
run plain_w2 --world 2 --layout replicated               # plain tensors: whole-tensor chunks
run ranklocal_w2 --world 2 --layout replicated --rank-local  # no_dist save: rank_<r>/.metadata
rc=0; run ranklocal_sharded_w2 --world 2 --layout fsdp --rank-local || rc=$?  # torch 2.6 refuses
echo "   (exit status $rc: torch 2.6 refuses it, the log above says why; nothing of it is kept)"
# One rank, one tensor: storage_data holds a single item, pickled with SETITEM instead of SETITEMS.
rm -rf "$TRIXIE/lab/dcpfx/single_item_w1" "$TRIXIE/lab/dcpfx/single_item_w1.truth" "$TRIXIE/lab/dcpfx/float8_w1"
chroot "$TRIXIE" /usr/bin/env -i PATH=/usr/bin:/bin python3 -c '
import os, torch, torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
w = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
dcp.save({"w": w}, checkpoint_id="/lab/dcpfx/single_item_w1")  # no process group: one rank
os.makedirs("/lab/dcpfx/single_item_w1.truth")
save_file({"w": w}, "/lab/dcpfx/single_item_w1.truth/tensors.safetensors")
# a dtype ucpkit has no DType for (float8_e4m3fn): must be refused by name
dcp.save({"f8": torch.zeros(4, dtype=torch.float8_e4m3fn)}, checkpoint_id="/lab/dcpfx/float8_w1")
'
mkdir -p "$OUT"
for v in fsdp_w2 twod_w4 fsdp_optim_w2 fsdp_tp_optim_w4 plain_w2 ranklocal_w2 single_item_w1; do
  rm -rf "$OUT/$v" "$OUT/$v.truth"
  cp -r "$TRIXIE/lab/dcpfx/$v" "$TRIXIE/lab/dcpfx/$v.truth" "$OUT/"
done
rm -rf "$OUT/float8_w1" && cp -r "$TRIXIE/lab/dcpfx/float8_w1" "$OUT/"
rm -rf "$OUT/torch113_w2" "$OUT/torch113_w2.truth"
/usr/bin/python3 "$HERE/dcp_fixtures_torch113.py" "$OUT/torch113_w2"
du -sh "$OUT"
