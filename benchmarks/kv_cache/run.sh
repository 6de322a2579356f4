#!/bin/sh
# Builds and runs kv_load: the KV-cache goals measured live on the reference generator
# (docs/kv-cache.md, figures in docs/performance.md). Usage, from the repository root:
#   benchmarks/kv_cache/run.sh [--json] [--quick] [build-dir]   (default build/kv-bench, Release)
# --json: exactly one JSON object per reported run on stdout, one per line:
#   {"scenario": "grow_vs_reserve", "mode", "tokens_per_s", "ttft_p95_ms", "preemptions"}
#   {"scenario": "shared_prefix", "reuse": true|false, "prefill_tokens", "ttft_p50_ms"}
# and every probe and the goals on stderr; without it, all of that on stdout. Exit status 1
# when a goal is missed.
set -eu
args=""
build=build/kv-bench
for a in "$@"; do
  case "$a" in
    --json|--quick) args="$args $a" ;;
    -*) echo "usage: $0 [--json] [--quick] [build-dir]" >&2; exit 2 ;;
    *) build=$a ;;
  esac
done
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTAILBATCH_CUDA=OFF \
  -DTAILBATCH_BUILD_TESTS=OFF -DTAILBATCH_BUILD_EXAMPLES=OFF -DTAILBATCH_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "$build" --target kv_load >/dev/null
# shellcheck disable=SC2086
exec "$build/benchmarks/kv_load" $args
