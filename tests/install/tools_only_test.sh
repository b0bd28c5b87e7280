#!/usr/bin/env bash
# A tools-only build (issue 28 item 7): configuring with -DBUILD_TESTING=OFF (what scripts/setup.sh
# --tools and --demo do) and -DUCPKIT_CUDA=OFF gives a build with the tools, libucpkit and the man pages
# and no test, fuzzer, benchmark, GPU module nor LibTorch interop target; the ucpkit_tools target builds
# only the tools. The packages setup.sh installs for the tools have no LibTorch, no Python torch and no
# GoogleTest; the demo's add only the generator's Python torch; the tests' have all.
# Usage: tools_only_test.sh <tool>...   (configures in a temporary folder; builds nothing)
. "$(dirname "$0")/common.sh"
tools=("$@")
cd "$work"

cmake -S "$src" -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DUCPKIT_CUDA=OFF >cfg.log 2>&1 ||
  fail "configure -DBUILD_TESTING=OFF: $(tail -5 cfg.log)"
ninja -C b -t targets all >targets.txt
for t in "${tools[@]}"; do
  grep -q "^$t: " targets.txt || fail "no target for the tool $t"
done
grep -q "^ucpkit_tools: " targets.txt || fail "no ucpkit_tools target"
if grep -E '^(test_[a-z_]+|bench_[a-z_]+|fuzz_torch_reader|ucpkit_gpu|ucpkit_torch): ' targets.txt >extra.txt; then
  fail "a tools-only configure still builds: $(cut -d: -f1 extra.txt | sort -u | tr '\n' ' ')"
fi
[ ! -f b/CTestTestfile.cmake ] || ! grep -q add_test b/CTestTestfile.cmake || fail "tests registered with BUILD_TESTING=OFF"
# What ucpkit_tools builds: the tools, libucpkit and the man pages, nothing from tests/ or bench/.
ninja -C b -t commands ucpkit_tools >plan.txt
for t in "${tools[@]}"; do grep -q -- "-o bin/$t " plan.txt || fail "ucpkit_tools does not build $t"; done
if grep -E 'tests/|bench/|fuzz' plan.txt >extra.txt; then fail "ucpkit_tools builds $(head -3 extra.txt)"; fi

# UCPKIT_BUILD_TESTS, the option's former name, still works on a first configure.
cmake -S "$src" -B old -G Ninja -DUCPKIT_BUILD_TESTS=OFF -DUCPKIT_CUDA=OFF >old.log 2>&1 || fail "configure -DUCPKIT_BUILD_TESTS=OFF"
grep -q '^BUILD_TESTING:BOOL=OFF' old/CMakeCache.txt || fail "-DUCPKIT_BUILD_TESTS=OFF did not turn BUILD_TESTING off"

# The packages each purpose installs.
pk() { "$src/scripts/setup.sh" "--$1" --print-packages | tr '\n' ' '; }
tools_pk=$(pk tools) demo_pk=$(pk demo) tests_pk=$(pk tests)
for p in libtorch-dev python3-torch libgtest-dev; do
  [[ " $tools_pk" != *" $p "* ]] || fail "setup.sh --tools installs $p: $tools_pk"
done
[[ " $demo_pk" != *" libtorch-dev "* && " $demo_pk" == *" python3-torch "* ]] ||
  fail "setup.sh --demo must install python3-torch (the generator) and not libtorch-dev: $demo_pk"
for p in libtorch-dev python3-torch libgtest-dev cmake g++; do
  [[ " $tests_pk" == *" $p "* ]] || fail "setup.sh --tests does not install $p: $tests_pk"
done
echo "tools_only_test: ok"
