#!/usr/bin/env bash
# Idempotent set-up: installs the Debian packages ucpkit needs (only those missing) and builds it.
# Usage: scripts/setup.sh [build_dir]   (default: build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}

packages=(cmake ninja-build g++ libtorch-dev libtbb-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev
          libzstd-dev zlib1g-dev libcli11-dev libgtest-dev python3-torch python3-numpy strace)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${UCPKIT_BUILD_TYPE:-Release} >/dev/null
cmake --build "$build" -j "$(nproc)"
