#!/usr/bin/env bash
# Builds everything (tests, examples, benchmarks; CUDA code where nvcc is found) and runs
# every test. The README's second command.
#
#   scripts/test.sh [CTEST_ARGS...]        what a fresh machine needs for the tests, then all
#   scripts/test.sh --all [CTEST_ARGS...]  also installs libtorch (heavy: about 150 Debian
#                                          packages) and so builds and runs the libtorch
#                                          example's tests (ctest label libtorch) too
set -euo pipefail
cd "$(dirname "$0")/.."
deps=--test
if [[ ${1:-} == --all ]]; then
  deps=--all
  shift
fi
scripts/deps.sh "$deps"
# CUDA code is compiled wherever the toolkit is installed, even if its bin/ is not on PATH.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake --preset default
cmake --build --preset default
ctest --preset default "$@"
