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
  "$@" &
  local pid=$! stopped=0
  trap "stopped=143; kill -TERM $pid 2>/dev/null" TERM
  trap "stopped=130; kill -INT $pid 2>/dev/null" INT
  wait "$pid" || rc=$?
  while kill -0 "$pid" 2>/dev/null; do rc=0; wait "$pid" || rc=$?; done
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
newest_tag() {
  [ -s "$1/latest" ] || { log "no $1/latest: not a DeepSpeed save folder, or no checkpoint finished yet"; return 1; }
  tr -d '[:space:]' < "$1/latest"
}
