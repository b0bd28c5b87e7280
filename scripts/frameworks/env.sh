# Sourced by the framework checks (tests/frameworks/*_test.sh, scripts/*_verify.sh; POSIX sh):
# `frameworks_python ROOT` sets FRAMEWORKS_PY to the pinned environment's python (kept when already
# set), which scripts/frameworks/setup.sh makes on first use, or exits 77 (ctest: skipped) when it
# cannot be made.
frameworks_python() {
  [ -n "${FRAMEWORKS_PY:-}" ] && return 0
  frameworks_env=$("$1/scripts/frameworks/setup.sh") ||
    { echo "SKIP: no framework environment (scripts/frameworks/setup.sh failed)"; exit 77; }
  FRAMEWORKS_PY=$frameworks_env/bin/python
}
