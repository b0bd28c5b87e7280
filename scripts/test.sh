#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: set-up (packages + build of the tools, tests, fuzzer
# and benchmarks: setup.sh --tests), then every test.
# Usage: scripts/test.sh [ctest args...]   (ctest's JUnit report: <build>/ctest-junit.xml; the 20 slowest tests printed last)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${UCPKIT_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" --tests "$build"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$build"
status=0
# The tests' warm python servers (tests/support/pywarm.py) end with the run, not 2 idle minutes later.
trap '/usr/bin/python3 "$root/tests/support/pywarm.py" --stop || true' EXIT
# One test more than cores: about an eighth of a -j nproc run was idle cores (tests waiting on signals, Slurm,
# killed runs; docs/notes/ci-times.md).
ctest --output-on-failure -j "$(( $(nproc) + 1 ))" --output-junit "$build/ctest-junit.xml" "$@" || status=$?
# Where the time goes (issue 50): the 20 slowest tests of this run, from ctest's JUnit report (kept in the build folder).
/usr/bin/python3 - "$build/ctest-junit.xml" <<'PY' || true
import sys, xml.etree.ElementTree as ET
cases = sorted(((float(c.get("time") or 0), c.get("name")) for c in ET.parse(sys.argv[1]).iter("testcase")), reverse=True)
print(f"20 slowest of {len(cases)} tests (seconds, wall; -j runs them side by side):")
for t, name in cases[:20]:
    print(f"{t:9.1f}  {name}")
PY
exit $status
