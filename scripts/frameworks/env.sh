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
