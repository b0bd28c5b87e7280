#!/bin/bash
# Makes the real-engine fixtures of issue 33 (outside CI): DeepSpeed's own engine trains each model kind a
# few steps and saves; the script keeps latest, global_step3/ and truth/ (the engine's state, recorded by
# train_engine.py) and, for MoE, the run's saves after steps 1 and 2 (chain/step1, chain/step2).
#   v0.14 line: the host's Debian 12 python3 (torch 1.13), DS014 = a DeepSpeed v0.14.5 source tree
#   v0.19 line: the Debian-trixie chroot (torch 2.6), DS019 = a DeepSpeed v0.19.x source tree under it
# The PipelineModule fixtures also get partitions.json: DeepSpeed's own PipelineModule partition
# (module.parts, train_engine.py --parts) of their layer list for each method and PP 1-4, and
# layer_types.txt: the layer class names as DeepSpeed's _find_layer_type names them (ucp-load --layer-types).
# Usage: DS014=/tmp/ds0145 DS019=/lab/ds0195 TRIXIE=/opt/trixie scripts/verify/ds_engine/make_fixtures.sh WORK [parts]
#   (parts: only the partitions of the existing pipe fixtures)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
work=$1
trixie=${TRIXIE:-/opt/trixie}
lab=$trixie/lab/ds_engine_fixtures
mkdir -p "$work" "$lab"
cp "$here"/*.py "$lab/"
port=29700
run() {  # line kind name args...
  local line=$1 kind=$2 name=$3; shift 3
  port=$((port + 1))
  if [ "$line" = 0.14 ]; then
    (cd "$work" && DS_SRC=$DS014 DS_ACCELERATOR=cpu /usr/bin/python3 "$here/train_engine.py" "$name" --kind "$kind" --port $port "$@")
    echo "$work/$name"
  else
    chroot "$trixie" env DS_SRC="$DS019" DS_ACCELERATOR=cpu USE_LIBUV=0 python3 /lab/ds_engine_fixtures/train_engine.py \
      "/lab/ds_engine_fixtures/$name" --kind "$kind" --port $port "$@"
    echo "$lab/$name"
  fi
}
keep() {  # source_dir fixture_name
  local src=$1 dst=$repo/tests/generator/engine/$2
  rm -rf "$dst.tmp"; mkdir -p "$dst.tmp"
  cp -r "$src/latest" "$src/global_step3" "$src/truth" "$dst.tmp/"
  [ -d "$src/chain" ] && cp -r "$src/chain" "$dst.tmp/"
  [ -f "$dst/PROVENANCE.md" ] && cp "$dst/PROVENANCE.md" "$dst.tmp/"
  rm -rf "$dst"; mv "$dst.tmp" "$dst"
}
partitions() {  # line fixture_dir: partitions.json and layer_types.txt from DeepSpeed's PipelineModule
  local line=$1 dst=$2 first=1
  {
    echo "["
    for method in parameters uniform type:Block "type:head|embed"; do
      for pp in 1 2 3 4; do
        [ $first = 1 ] || echo ","
        first=0
        run $line pipe parts --pp $pp --world $pp --partition-method "$method" --parts 2>&1 | grep -a '^train_engine parts: ' \
          | sed 's/^train_engine parts: //' | tr -d '\n'
      done
    done
    echo; echo "]"
  } > "$dst/partitions.json"
  /usr/bin/python3 -c "import json, sys; print('\n'.join(json.load(open(sys.argv[1]))[0]['layer_types']))" \
    "$dst/partitions.json" > "$dst/layer_types.txt"
}
if [ "${2:-}" = parts ]; then
  partitions 0.14 "$repo/tests/generator/engine/pipe_module_v$(cat "$DS014/version.txt")"
  partitions 0.19 "$repo/tests/generator/engine/pipe_module_v$(cat "$trixie$DS019/version.txt")"
  exit 0
fi
for line in 0.14 0.19; do
  v=$([ $line = 0.14 ] && cat "$DS014/version.txt" || cat "$trixie$DS019/version.txt")
  for kind in dense pipe moe; do
    name=${kind}_v$v
    # moe_tutorial_v0.14.5 was committed before (train_moe_tutorial.py, the same model and run)
    [ $line = 0.14 ] && [ $kind = moe ] && continue
    rm -rf "$work/$name" "$lab/$name"
    src=$(run $line $kind $name 2>&1 | tee /dev/stderr | tail -1)
    if [ $kind = moe ]; then  # the chain: the same run saved after every step
      chain=$(run $line $kind ${name}_chain --save-every 2>&1 | tail -1)
      mkdir -p "$src/chain"
      for s in 1 2; do cp -r "$chain/step$s" "$src/chain/"; rm -f "$src/chain/step$s/zero_to_fp32.py"; done
      for f in "$chain/step3/global_step3"/*; do cmp "$f" "$src/global_step3/$(basename "$f")"; done  # the chain's step 3 is the fixture
    fi
    case $kind in dense) fx=dense_blocks_v$v;; pipe) fx=pipe_module_v$v;; moe) fx=moe_tutorial_v$v;; esac
    keep "$src" "$fx"
    [ $kind = pipe ] && partitions $line "$repo/tests/generator/engine/$fx"
  done
done
