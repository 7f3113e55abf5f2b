#!/usr/bin/env bash
# Installs what fusebox, its tests and its benchmarks need on Debian 12
# (python3-torchvision: the DDP benchmark's CNN; python3-matplotlib: the
# scaling plots) (idempotent; skips apt when
# every package is already present). Runs as root, or through sudo when available.
set -euo pipefail
PACKAGES=(build-essential cmake ninja-build libgtest-dev libgmock-dev
  libucx-dev ucx-utils libopenmpi-dev openmpi-bin libabsl-dev nlohmann-json3-dev libtorch-dev
  python3-torch python3-torchvision python3-matplotlib python3-numpy python3-pytest python3-dev
  pybind11-dev
  clang libclang-rt-14-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all packages present"
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
