# Sourced by the example job scripts: logging, the tool launcher, and what each exit code means.
# Settings (environment): UCPKIT_BIN (folder of the tools; default: on PATH),
# UCPKIT_LAUNCH (how MPI-capable tools start; default `mpirun -np $SLURM_NTASKS` inside an allocation
# of more than one task, else nothing).
# Open MPI gives a signalled rank 1 s before SIGKILL (odls_base_sigkill_timeout): too short for rank 0
# to remove its staging folder on a loaded node. Slurm's own KillWait still bounds the wait.
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-20}
log() { printf '[%s %s] %s\n' "$(date +%T)" "${SLURM_JOB_ID:-local}" "$*"; }
tool() { if [ -n "${UCPKIT_BIN:-}" ]; then echo "$UCPKIT_BIN/$1"; else command -v "$1"; fi; }
launcher() {
  if [ -n "${UCPKIT_LAUNCH:-}" ]; then echo "$UCPKIT_LAUNCH"
  elif [ "${SLURM_NTASKS:-1}" -gt 1 ]; then echo "mpirun -np $SLURM_NTASKS"
  fi
}

# signal_tool SIG PID COMMAND...: sends SIG to what run_step started for COMMAND: PID's children that
# run a program COMMAND names (the local ranks when COMMAND is `mpirun ... TOOL ...`), else PID itself;
# sets `signalled` to them. A rank dying by the signal (after removing its staging) makes mpirun end
# the job.
signal_tool() {
  local sig=$1 pid=$2 kids=() k comm w
  shift 2
  for k in $(pgrep -P "$pid" 2>/dev/null); do
    comm=$(ps -o comm= -p "$k" 2>/dev/null) || continue
    for w in "$@"; do
      if [ "${w##*/}" = "$comm" ]; then kids+=("$k"); break; fi
    done
  done
  signalled=${kids[*]:-$pid}
  kill -"$sig" $signalled 2>/dev/null || true
}

# running PID...: true while one of the PIDs runs (a zombie, ended but not reaped yet, does not count).
running() {
  local p s
  for p in "$@"; do
    s=$(ps -o stat= -p "$p" 2>/dev/null) || continue
    case $s in Z*) ;; *) return 0 ;; esac
  done
  return 1
}

# run_step NAME COMMAND...: runs one tool, logs its exit code and what a hook should do about it, and
# returns that code (the scripts run under `set -e`, so a failure ends the job with it).
#   0        done; the output is complete and durable
#   1        runtime failure (I/O, corrupt or inconsistent input): nothing was written; keep using
#            the previous checkpoint and look at the message (the file it names)
#   2        usage error: the job script is wrong; do not retry
#   130/143  interrupted (SIGINT/SIGTERM, e.g. scancel): nothing was written; resubmitting is safe
run_step() {
  local name=$1 rc=0
  shift
  log "$name: $*"
  # In the background and waited for, so that a SIGTERM/SIGINT to this script (scancel, Ctrl-C) is
  # passed on and the script stays until the tool has removed its staged output: Slurm ends the job
  # (and kills what is left) as soon as the batch script exits.
  # The signal goes to the tool itself (under mpirun: its local ranks), not to the launcher: scancel
  # signals every process of the job, mpirun included, and Open MPI's mpirun exits at once on a second
  # SIGTERM, leaving its ranks to be SIGKILLed by Slurm when this script ends, before rank 0 has
  # removed its staging folder (scripts/checks/test_slurm.sh, tests/reliability/run_step_signal.sh).
  # After a signal the script waits for the processes it signalled (the ranks), not for mpirun: after
  # an abort Open MPI's mpirun sleeps out its SIGKILL grace (below) even when its ranks are gone, and
  # would outlast Slurm's KillWait; Slurm ends it with the job.
  "$@" &
  local pid=$! stopped=0 words
  signalled=$pid
  words=$(printf '%q ' "$@")
  trap "stopped=143; signal_tool TERM $pid $words" TERM
  trap "stopped=130; signal_tool INT $pid $words" INT
  wait "$pid" || rc=$?
  if [ "$stopped" -ne 0 ] && [ "$signalled" != "$pid" ]; then
    while running $signalled; do sleep 0.1; done
  else
    while kill -0 "$pid" 2>/dev/null; do rc=0; wait "$pid" || rc=$?; done
  fi
  trap - TERM INT
  # mpirun reports a rank ended by a signal as a plain failure; the job was stopped, say so.
  [ "$stopped" -eq 0 ] || [ "$rc" -eq 0 ] || rc=$stopped
  case $rc in
    0) log "$name: done" ;;
    1) log "$name: FAILED (runtime error, nothing written; the previous checkpoint is untouched)" ;;
    2) log "$name: FAILED (usage error in the job script; fix it, do not retry)" ;;
    130|143) log "$name: INTERRUPTED (nothing written; resubmit to retry)" ;;
    *) log "$name: FAILED with exit code $rc" ;;
  esac
  return $rc
}

# newest_tag DIR: the tag DeepSpeed wrote last into DIR/latest (it writes `latest` after the tag).
# Called as tag=$(newest_tag DIR): its message goes to stderr, which the substitution does not take.
newest_tag() {
  [ -s "$1/latest" ] || {
    log "FAILED: no $1/latest: not a DeepSpeed save folder, or no checkpoint finished yet" >&2
    return 1
  }
  tr -d '[:space:]' < "$1/latest"
}
