#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: set-up (packages + build of the tools, tests, fuzzer
# and benchmarks: setup.sh --tests), then every test.
# Usage: scripts/test.sh [ctest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${UCPKIT_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" --tests "$build"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$build"
ctest --output-on-failure -j "$(nproc)" "$@"
