# Sourced by the tests/install scripts: strict mode, the source tree ($src), `fail MESSAGE` (one line
# naming the test, exit 1) and a fresh work folder ($work) removed on exit.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
test_name=$(basename "$0" .sh)
fail() { echo "$test_name: FAIL: $*" >&2; exit 1; }
work=$(mktemp -d "/tmp/ucpkit-$test_name.XXXXXX")
trap 'rm -rf "$work"' EXIT
