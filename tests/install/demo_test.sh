#!/usr/bin/env bash
# The README's first command (issue 28 item 7) on the tools already built: scripts/demo.sh --no-setup,
# run from another working directory with a relative work folder, (a) without the placement data
# folder: every step runs, the placement on a generated loads file, and the output says so; (b) with
# ../shared/data when it exists: the placement reads it. Every tool of the build appears in the demo:
# it ran or a "skipped:" line says why. The outputs of each step are there.
# Usage: demo_test.sh <build_dir> <tool>...
. "$(dirname "$0")/common.sh"
build=$(cd "$1" && pwd)
shift
tools=("$@")
cd "$work"

UCPKIT_BUILD_DIR=$build UCPKIT_DEMO_DATA=$work/no-data "$src/scripts/demo.sh" --no-setup out >log.txt 2>&1 ||
  fail "demo.sh without the data folder: exit $? (log: $(tail -5 log.txt))"
for f in out/universal/manifest.json out/universal2/manifest.json out/target/latest out/store \
         out/restored/global_step200 out/loads.json out/placement.json; do
  [ -e "$f" ] || fail "demo.sh without the data folder left no $f (log: $(tail -5 log.txt))"
done
grep -q "using a generated loads file" log.txt || fail "the placement step does not say it uses generated loads"
for t in "${tools[@]}"; do
  grep -Eq "(^|[ /])$t([ :,]|$)" log.txt || fail "the demo does not show $t (neither run nor 'skipped:')"
done
if grep -q '^skipped:' log.txt; then
  grep '^skipped:' log.txt | grep -vq 'is not built' && fail "unexpected skip: $(grep '^skipped:' log.txt)"
fi

data=$src/../shared/data
if [ -f "$data/smartmoe_expert_loads.json" ]; then
  rm -rf out
  UCPKIT_BUILD_DIR=$build "$src/scripts/demo.sh" --no-setup out >log2.txt 2>&1 || fail "demo.sh with $data: exit $?"
  grep -q "moe-replace on SmartMoE loads" log2.txt || fail "with $data present the placement does not read it"
  [ -f out/placement.json ] && [ ! -e out/loads.json ] || fail "with $data present: no placement.json, or generated loads"
fi
echo "demo_test: ok"
