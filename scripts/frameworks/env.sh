# Sourced by the framework checks (tests/frameworks/*_test.sh, scripts/verify/*_verify.sh; POSIX sh):
# `frameworks_python ROOT` sets FRAMEWORKS_PY to the pinned environment's python (kept when already
# set), which scripts/frameworks/setup.sh makes on first use, or exits 77 (ctest: skipped) when it
# cannot be made.
frameworks_python() {
  [ -n "${FRAMEWORKS_PY:-}" ] && return 0
  frameworks_env=$("$1/scripts/frameworks/setup.sh") ||
    { echo "SKIP: no framework environment (scripts/frameworks/setup.sh failed)"; exit 77; }
  FRAMEWORKS_PY=$frameworks_env/bin/python
}

# `frameworks_lab ROOT NAME` sets LAB, the check's work folder: $TRIXIE/lab/NAME (emptied) when TRIXIE names
# the Debian-trixie chroot of the older line, else a new temporary folder for the pinned python
# (frameworks_python), removed at exit unless KEEP is set.
frameworks_lab() {
  if [ -n "${TRIXIE:-}" ]; then
    LAB=$TRIXIE/lab/$2
    rm -rf "$LAB"
  else
    frameworks_python "$1"
    LAB=$(mktemp -d)
    if [ -n "${KEEP:-}" ]; then echo "work folder kept: $LAB"; else trap 'rm -rf "$LAB"' EXIT; fi
  fi
}

# `megatron_src TAG` prints the Megatron-LM source tree of that tag ($MEGATRON_SRC/megatron-lm-TAG, default
# ~/.cache/ucpkit), extracting it once with `git archive` from MEGATRON_GIT (a repository of
# github:NVIDIA/Megatron-LM); returns 1 when there is neither. MEGATRON_ENV: the environment of every run of
# Megatron's training code with the pinned python (TORCH2LAB_CUDA_ON_CPU=1: its hard-wired CUDA calls go to
# torch2lab's CPU shims, which go on PYTHONPATH beside the tree).
megatron_src() {
  megatron_root=${MEGATRON_SRC:-${XDG_CACHE_HOME:-$HOME/.cache}/ucpkit}
  megatron_dst=$megatron_root/megatron-lm-$1
  if [ ! -d "$megatron_dst/megatron/training" ]; then
    [ -n "${MEGATRON_GIT:-}" ] || return 1
    mkdir -p "$megatron_root" && rm -rf "$megatron_dst.partial" && mkdir "$megatron_dst.partial" &&
      git --git-dir="$MEGATRON_GIT" archive "$1" | tar -x -C "$megatron_dst.partial" &&
      mv "$megatron_dst.partial" "$megatron_dst" || return 1
  fi
  echo "$megatron_dst"
}
MEGATRON_ENV="PYTHONWARNINGS=ignore PYTHONDONTWRITEBYTECODE=1 TORCH2LAB_CUDA_ON_CPU=1 TORCHDYNAMO_DISABLE=1 OMP_NUM_THREADS=1 CUDA_DEVICE_MAX_CONNECTIONS=1 TORCH2LAB_PORT=0"
