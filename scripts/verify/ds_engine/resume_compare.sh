#!/bin/bash
# Issue 33 item 4 (outside CI): DeepSpeed's real engine resumes from each ucp-load output of the real-engine
# fixtures (tests/generator/engine/*_v<ver>), for three model kinds and both DeepSpeed lines, and its state
# (weights, fp32 master, Adam moments, step) is compared with
#   * DeepSpeed's own universal-load path: ds_to_universal.py of the same source checkpoint, then the
#     engine at the same target layout with {"checkpoint": {"load_universal": true}};
#   * the source run's state (the fixture's truth/);
#   * and after one more training step, the two resumed engines with each other.
# For native MoE DeepSpeed's universal path is broken (issue 33 item 4): its numbers are printed, the
# ucp-load resume is checked against the source state.
#   v0.14 line: the host's /usr/bin/python3 (torch 1.13) with DS014 (a DeepSpeed v0.14.5 tree)
#   v0.19 line: the trixie chroot's python3 (torch 2.6) with DS019 (a DeepSpeed v0.19.x tree, chroot path)
# Usage: DS014=/tmp/ds0145 DS019=/lab/ds0195 [TRIXIE=/opt/trixie] resume_compare.sh BUILD_DIR [LINES] [KINDS]
#   LINES defaults to "0.14 0.19", KINDS to "dense pipe moe". One line per check:
#   resume_compare: <line> <kind> <target> <what>: <engine_state.py's line>
# For MoE also: a pec-restore (K = 1) of the fixture's chain loaded by the engine, its state equal to the
# restored folder's universal form; and DeepSpeed's load_universal of ucp-union's universal folder (the folder ucp-union no longer tags
# latest_universal for native MoE; tagged here by hand), against the source state.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bin=$(cd "$1" && pwd)/bin
lines=${2:-"0.14 0.19"}
kinds=${3:-"dense pipe moe"}
trixie=${TRIXIE:-/opt/trixie}
work=$trixie/lab/ds_engine_resume  # both lines work here; the chroot sees it as /lab/ds_engine_resume
mkdir -p "$work"
cp "$here"/*.py "$work/"
state=$repo/tests/reshard/engine_state.py
py=/usr/bin/python3
port=29800

engine() {  # line script args...: run a ds_engine script with that line's python and DeepSpeed (args: host paths under $work)
  local line=$1 script=$2; shift 2
  port=$((port + 1))
  if [ "$line" = 0.14 ]; then
    (cd "$work" && DS_SRC=$DS014 DS_ACCELERATOR=cpu $py "$work/$script" "$@" --port $port)
  else
    local args=()
    for x in "$@"; do args+=("${x//$work//lab/ds_engine_resume}"); done
    chroot "$trixie" env DS_SRC="$DS019" DS_ACCELERATOR=cpu USE_LIBUV=0 python3 "/lab/ds_engine_resume/$script" "${args[@]}" --port $port
  fi
}
ds_universal() {  # line src_dir: DeepSpeed's ds_to_universal of src_dir's global_step3 into src_dir/global_step3_universal
  local line=$1 d=$2 args=(--input_folder "$2/global_step3" --output_folder "$2/global_step3_universal" --inject_missing_state)
  if [ "$line" = 0.14 ]; then
    (cd "$work" && DS_SRC=$DS014 DS_ACCELERATOR=cpu $py "$work/ds_to_universal_run.py" "${args[@]}")
  else
    chroot "$trixie" env DS_SRC="$DS019" DS_ACCELERATOR=cpu python3 /lab/ds_engine_resume/ds_to_universal_run.py \
      "${args[@]//$work//lab/ds_engine_resume}"
  fi
}
say() { echo "resume_compare: $*"; }

for line in $lines; do
  if [ "$line" = 0.14 ]; then v=$(cat "$DS014/version.txt"); else v=$(cat "$trixie$DS019/version.txt"); fi
  for kind in $kinds; do
    case $kind in
      dense) fx=dense_blocks_v$v; truth=truth
             targets=("dp4_z1|--dp 4 --zero-stage 1|--world 4 --zero 1" "dp2_z2|--dp 2 --zero-stage 2|--world 2 --zero 2"
                      "dp4_z2|--dp 4 --zero-stage 2|--world 4 --zero 2") ;;
      pipe)  fx=pipe_module_v$v; truth=truth
             targets=("pp2_dp2|--pp 2 --dp 2 --zero-stage 1|--world 4 --pp 2" "pp1_dp2|--pp 1 --dp 2 --zero-stage 1|--world 2 --pp 1"
                      "pp3_dp1|--pp 3 --dp 1 --zero-stage 1|--world 3 --pp 3"
                      "pp3_dp1_typeBlock|--pp 3 --dp 1 --zero-stage 1 --partition-method type:Block --layer-types $repo/tests/generator/engine/$fx/layer_types.txt|--world 3 --pp 3 --partition-method type:Block") ;;
      moe)   fx=moe_tutorial_v$v; truth=truth; [ "$v" = 0.14.5 ] && truth=state
             targets=("dp4_ep4|--dp 4 --ep 4 --zero-stage 1|--world 4 --ep 4" "dp4_ep2|--dp 4 --ep 2 --zero-stage 1|--world 4 --ep 2"
                      "dp2_ep2_z2|--dp 2 --ep 2 --zero-stage 2|--world 2 --ep 2 --zero 2") ;;
    esac
    src=$repo/tests/generator/engine/$fx
    base=$work/$fx
    rm -rf "$base" && mkdir -p "$base"
    "$bin/ucp-union" -q --input "$src" --output "$base/u" 2>/dev/null || { say "$line $kind: ucp-union failed"; continue; }
    say "$line $kind union vs source state: $($py "$state" union "$base/u" "$src/$truth")"
    # DeepSpeed's own path: ds_to_universal of the same source checkpoint
    mkdir -p "$base/dsu" && cp -r "$src/latest" "$src/global_step3" "$base/dsu/"
    if ds_universal "$line" "$base/dsu" > "$base/dsu.log" 2>&1; then ds_ok=1; else ds_ok=0; say "$line $kind: ds_to_universal failed: $(grep -a Error "$base/dsu.log" | tail -1)"; fi
    if [ $kind = moe ]; then  # DeepSpeed's load_universal of ucp-union's folder (tagged latest_universal by hand)
      mkdir -p "$base/uu" && cp -r "$base/u" "$base/uu/global_step3_universal" && echo global_step3_universal > "$base/uu/latest_universal"
    fi
    if [ $kind = moe ]; then  # PEC: the chain (steps 1, 2 and the fixture's 3) stored with K = 1, step 3 restored, loaded by the engine
      for s in 1 2 3; do
        ck=$src; [ "$s" -lt 3 ] && ck=$src/chain/step$s
        "$bin/pec-save" -q --checkpoint "$ck" --store "$base/pec_store" --step "$s" --policy sequential --k 1
      done
      "$bin/pec-restore" -q --store "$base/pec_store" --output "$base/pec_out" --report "$base/pec_out.json" 2>/dev/null
      "$bin/ucp-union" -q --input "$base/pec_out" --output "$base/pec_u" 2>/dev/null
      steps=$($py -c "import json, sys; print(sorted({e['restored_step'] for e in json.load(open(sys.argv[1]))['experts']}))" "$base/pec_out.json")
      if engine "$line" train_engine.py "$base/r_pec" --kind moe --after 0 --resume "$base/pec_out" > "$base/r_pec.log" 2>&1; then
        say "$line moe pec-restore (experts from steps $steps) loaded by the engine vs its universal form: $($py "$state" union "$base/pec_u" "$base/r_pec/loaded")"
      else
        say "$line moe pec-restore: engine load failed: $(grep -a Error "$base/r_pec.log" | tail -1)"
      fi
    fi
    for t in "${targets[@]}"; do
      IFS='|' read -r name load_args engine_args <<< "$t"
      out=$base/l_$name
      # shellcheck disable=SC2086
      if ! "$bin/ucp-load" -q --input "$base/u" --output "$out" --tp 1 $( [ $kind = pipe ] || echo --pp 1 ) $load_args --dtype fp32 2> "$out.err"; then
        say "$line $kind $name: ucp-load failed: $(head -1 "$out.err")"; continue
      fi
      # shellcheck disable=SC2086
      engine "$line" train_engine.py "$base/r_$name" --kind $kind $engine_args --resume "$out" > "$base/r_$name.log" 2>&1 \
        || { say "$line $kind $name: engine resume from ucp-load failed: $(grep -a Error "$base/r_$name.log" | tail -1)"; continue; }
      say "$line $kind $name ucp-load resume vs source state: $($py "$state" same "$base/r_$name/loaded" "$src/$truth")"
      if [ $kind = moe ]; then
        # shellcheck disable=SC2086
        if engine "$line" train_engine.py "$base/du_$name" --kind $kind $engine_args --resume "$base/uu" --universal > "$base/du_$name.log" 2>&1; then
          say "$line $kind $name DeepSpeed load_universal of ucp-union's folder vs source state: $($py "$state" same "$base/du_$name/loaded" "$src/$truth")"
        else
          say "$line $kind $name: DeepSpeed load_universal of ucp-union's folder failed: $(grep -a Error "$base/du_$name.log" | tail -1)"
        fi
      fi
      [ $ds_ok = 1 ] || continue
      # shellcheck disable=SC2086
      if ! engine "$line" train_engine.py "$base/d_$name" --kind $kind $engine_args --resume "$base/dsu" --universal > "$base/d_$name.log" 2>&1; then
        say "$line $kind $name: DeepSpeed universal load failed: $(grep -a Error "$base/d_$name.log" | tail -1)"; continue
      fi
      say "$line $kind $name ucp-load resume vs DeepSpeed universal resume: $($py "$state" same "$base/r_$name/loaded" "$base/d_$name/loaded")"
      say "$line $kind $name after one more step, ucp-load vs DeepSpeed universal: $($py "$state" same "$base/r_$name/after" "$base/d_$name/after") (losses $(grep -ah 'more steps' "$base/r_$name.log" | sed 's/.*loss //') / $(grep -ah 'more steps' "$base/d_$name.log" | sed 's/.*loss //'))"
    done
  done
done
