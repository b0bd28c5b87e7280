#!/usr/bin/env bash
# The DeepSpeed 0.19.8 fixtures (issue 48; outside CI; tests/formats/deepspeed/data/README.md):
#
#   scripts/ds_fixtures_newest.sh [--build BUILD] [DEST]     (DEST: default tests/formats/deepspeed/data)
#
# DeepSpeed 0.19.8's own engine, in the pinned framework environment (scripts/frameworks/setup.sh, torch
# 2.15.0, CPU, 2 gloo ranks), trains and saves the three cases of tests/frameworks/deepspeed_engine_test.sh
# through the same script (scripts/frameworks/ds_train_loop.py save: dense ZeRO-1, dense ZeRO-3, native MoE
# EP 2 with ZeRO-1; 3 steps, engine.save_checkpoint, the engine's state recorded), then DeepSpeed's own
# ds_to_universal converts each save (ds_train_loop.py universal; native MoE: it fails, its error is kept).
# scripts/ds_fixtures_newest.py keep writes DEST/<name>/ (the save) and DEST/<name>.truth/ (the engine's
# state, ds_to_universal's zero/ files or its error). With --build, ucp-union and ucp-info of BUILD/bin are
# then checked against the truth (ds_fixtures_newest.py check, the comparison of
# tests/formats/deepspeed/newest_line_test.cpp). Exit 77 when the framework environment cannot be made.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=
if [[ ${1:-} == --build ]]; then build=$(cd "$2" && pwd); shift 2; fi
dest=$(mkdir -p "${1:-$root/tests/formats/deepspeed/data}" && cd "${1:-$root/tests/formats/deepspeed/data}" && pwd)
. "$root/scripts/frameworks/env.sh"
frameworks_python "$root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step() {  # NAME LOG_PREFIX: ds_train_loop.py NAME of the three cases into $work/src, its own lines shown
  "$FRAMEWORKS_PY" "$root/scripts/frameworks/ds_train_loop.py" "$1" --out "$work/src" --cases dense,zero3,moe \
    "${@:3}" >"$work/$1.log" 2>&1 || { tail -30 "$work/$1.log"; exit 1; }
  grep "^$2:" "$work/$1.log"
}
step save ds_train_loop --world 2
step universal ds_to_universal
"$FRAMEWORKS_PY" "$here/ds_fixtures_newest.py" keep "$work/src" "$dest" "$work/universal.log"
versions=$("$FRAMEWORKS_PY" -c \
  'import importlib.metadata as m; print(*(f"{p} {m.version(p)}" for p in ("deepspeed", "torch")))')
echo "ds_fixtures_newest: $versions, $(du -sb "$dest" | cut -f1) bytes in $dest"
if [[ -n $build ]]; then
  "$FRAMEWORKS_PY" "$here/ds_fixtures_newest.py" check "$build" "$dest"
fi
