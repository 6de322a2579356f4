#!/usr/bin/env bash
# Builds everything (tests, examples, benchmarks; CUDA code where nvcc is found) and runs
# every test. The README's second command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test
# CUDA code is compiled wherever the toolkit is installed, even if its bin/ is not on PATH.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake --preset default
cmake --build --preset default
ctest --preset default "$@"
