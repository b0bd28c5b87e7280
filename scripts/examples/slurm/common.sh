# Sourced by the example job scripts: logging, the tool launcher, and what each exit code means.
# Settings (environment): UCPKIT_BIN (folder of the tools; default: on PATH),
# UCPKIT_LAUNCH (how MPI-capable tools start; default `mpirun -np $SLURM_NTASKS` inside an allocation
# of more than one task, else nothing).
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
  "$@" || rc=$?
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
