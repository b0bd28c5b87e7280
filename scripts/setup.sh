#!/usr/bin/env bash
# Idempotent set-up: installs the Debian packages a purpose needs (only those missing) and builds.
# Usage: scripts/setup.sh [--tools | --demo | --tests] [--print-packages] [build_dir]   (default: --tools, build/)
#   --tools  the tools only (configure -DBUILD_TESTING=OFF on a new build folder; target ucpkit_tools):
#            compilers, CMake, Ninja and the libraries the tools link; no LibTorch, no Python
#   --demo   --tools plus what scripts/demo.sh's checkpoint generator needs (python3-torch, python3-numpy)
#   --tests  everything scripts/test.sh needs: the tools, the test suite, the fuzzer and the benchmarks
#            (LibTorch for the interop library and its tests, GoogleTest, Python torch for the fixtures)
#   --print-packages  print the Debian packages the purpose needs, one a line, and stop
# A build folder configured for the tests stays so (--tools then builds only the tools' targets in it).
# The GPU module (ucp-load --device cuda) is built for --tests when CUDA and NCCL are found; --tools and
# --demo leave it out of a new build folder (-DUCPKIT_CUDA=ON adds it: docs/install.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
purpose=tools
case "${1:-}" in
  --tools | --demo | --tests) purpose=${1#--}; shift ;;
  -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
print_packages=0
if [ "${1:-}" = --print-packages ]; then
  print_packages=1
  shift
fi
case "${1:-}" in
  -*) echo "setup.sh: error: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
build=${1:-$root/build}

packages=(cmake ninja-build g++ libtbb-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev libzstd-dev zlib1g-dev
          libcli11-dev libjemalloc-dev)
later=()  # not needed by the build: installed while it runs
case $purpose in
  demo) later=(python3-torch python3-numpy) ;;
  tests) packages+=(libtorch-dev libgtest-dev python3-torch python3-numpy strace universal-ctags clang-format) ;;
esac
if [ "$print_packages" = 1 ]; then
  printf '%s\n' "${packages[@]}" "${later[@]}"
  exit 0
fi
missing_of() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(missing_of "${packages[@]}")
mapfile -t missing_later < <(missing_of "${later[@]}")
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
apt_install() { DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "$@"; }
if [ $((${#missing[@]} + ${#missing_later[@]})) -gt 0 ]; then
  $sudo_cmd apt-get update -q
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  apt_install "${missing[@]}"
fi
later_pid=""
if [ ${#missing_later[@]} -gt 0 ]; then
  mkdir -p "$build"
  echo "setup: installing ${missing_later[*]} while building (log: $build/setup-apt.log)" >&2
  apt_install "${missing_later[@]}" >"$build/setup-apt.log" 2>&1 &
  later_pid=$!
fi

options=(-DCMAKE_BUILD_TYPE="${UCPKIT_BUILD_TYPE:-Release}")
if [ "$purpose" = tests ]; then
  options+=(-DBUILD_TESTING=ON)
elif [ ! -f "$build/CMakeCache.txt" ]; then
  options+=(-DBUILD_TESTING=OFF -DUCPKIT_CUDA=OFF)
fi
cmake -S "$root" -B "$build" -G Ninja "${options[@]}" >/dev/null
if [ "$purpose" = tests ]; then
  cmake --build "$build" -j "$(nproc)"
else
  cmake --build "$build" -j "$(nproc)" --target ucpkit_tools
fi
if [ -n "$later_pid" ] && ! wait "$later_pid"; then
  echo "setup: error: apt-get install ${missing_later[*]} failed: $(tail -3 "$build/setup-apt.log")" >&2
  exit 1
fi
