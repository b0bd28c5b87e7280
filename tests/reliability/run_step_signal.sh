#!/usr/bin/env bash
# run_step (examples/slurm/common.sh) under the signals Slurm sends when a job is cancelled,
# without Slurm: `mpirun -np 2 ucp-union` paused once its output is staged (UCPKIT_TEST_PAUSE_STAGED),
# then, in a batch-script stand-in (its own session, like a job's processes):
#   scancel   SIGTERM to every process of the job (mpirun and its ranks, then the script, whose trap
#             passes the signal on), then SIGKILL to whatever is left once the script has ended (Slurm
#             ends the job then) or after a KillWait of 15 s;
#   batch     SIGTERM to the script alone (scancel --batch, kill), SIGKILL after KillWait as above.
# Each must end with run_step logging INTERRUPTED, no staging folder and no output left, the source
# unchanged. Before the fix the scancel case left the staging folder: the trap's SIGTERM was mpirun's
# second, and Open MPI's mpirun exits at once on a second one, leaving its ranks to the SIGKILL.
# Usage: run_step_signal.sh BUILD_DIR CHECKPOINT [ROUNDS]   (CHECKPOINT: a DP 2 ZeRO save folder)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
rounds=${3:-2}
work=$(mktemp -d /tmp/ucpkit-run-step.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$2" "$work/ckpt"
(cd "$work/ckpt" && find . -type f -print0 | sort -z | xargs -0 sha256sum) > "$work/ckpt.sha256"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 UCPKIT_TEST_PAUSE_STAGED=1
failures=0
fail() { echo "FAIL ($1, round $2): $3"; failures=$((failures + 1)); }
staged() { find "$work/ckpt" -maxdepth 1 -name '.*-tmp-*' | grep -q .; }

for round in $(seq "$rounds"); do
  for mode in scancel batch; do
    setsid bash -c ". '$root/examples/slurm/common.sh'; run_step ucp-union mpirun -np 2 \
      '$build/bin/ucp-union' --input '$work/ckpt' --output '$work/ckpt/out'" > "$work/log" 2>&1 &
    script=$!
    for _ in $(seq 1200); do staged && break; sleep 0.05; done
    staged || { fail $mode "$round" "the run never staged its output"; cat "$work/log"; kill -KILL -- -"$script"; continue; }
    sleep 0.3
    job=$(ps -o pid= -s "$script" | tr '\n' ' ')  # every process of the stand-in job
    if [ $mode = scancel ]; then
      for p in $job; do [ "$p" = "$script" ] || kill -TERM "$p" 2>/dev/null || true; done
      sleep 0.05
    fi
    kill -TERM "$script"
    for _ in $(seq 300); do kill -0 "$script" 2>/dev/null || break; sleep 0.05; done
    left=""
    for p in $job; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -z "$left" ] || kill -KILL $left 2>/dev/null || true  # the job ends: Slurm kills what is left
    wait "$script" 2>/dev/null || true
    sleep 0.2
    grep -q "ucp-union: INTERRUPTED" "$work/log" || fail $mode "$round" "run_step did not report the interruption"
    ! staged || fail $mode "$round" "the staging folder was left: $(find "$work/ckpt" -maxdepth 1 -name '.*-tmp-*')"
    [ ! -e "$work/ckpt/out" ] || fail $mode "$round" "an output was written"
    (cd "$work/ckpt" && sha256sum --quiet -c "$work/ckpt.sha256") || fail $mode "$round" "the source changed"
    [ $failures -eq 0 ] || sed 's/^/  /' "$work/log"
    rm -rf "$work/ckpt"/.*-tmp-* "$work/ckpt/out" "$work/ckpt/latest_universal"
  done
done
[ $failures -eq 0 ] || { echo "run_step_signal: $failures failure(s)"; exit 1; }
echo "run_step_signal: $rounds round(s) of scancel and batch signals, no staging left"
