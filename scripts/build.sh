#!/usr/bin/env bash
# Configures and builds fusebox into ${BUILD_DIR:-build} (Release with debug
# info, Ninja, -j${JOBS:-2}).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j "${JOBS:-2}"
