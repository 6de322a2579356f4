#!/bin/sh
# Builds and runs the AdaptiveWindow goal tables (markdown on stdout) and writes the
# p95-vs-load plots to docs/img/adaptive/. Usage, from the repository root:
#   benchmarks/adaptive/run.sh [build-dir]        (default build/adaptive-bench, Release)
# Exit status 1 when a goal is missed (the tables say which).
set -eu
build=${1:-build/adaptive-bench}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTAILBATCH_CUDA=OFF \
  -DTAILBATCH_BUILD_TESTS=OFF -DTAILBATCH_BUILD_EXAMPLES=OFF -DTAILBATCH_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "$build" --target adaptive_goals >/dev/null
start=$(date +%s)
status=0
"$build/benchmarks/adaptive_goals" docs/img/adaptive || status=$?
echo
echo "($(($(date +%s) - start)) s wall on this machine)"
exit $status
