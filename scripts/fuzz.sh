#!/usr/bin/env bash
# Builds tailbatch-serve's request-decoding fuzz target with clang and libFuzzer
# (-fsanitize=fuzzer,address,undefined) and runs it for a bounded time over the seed corpus
# kept in tests/fuzz/corpus/request_decoding/. New inputs go to a scratch directory, never
# into the repository. Exits non-zero if the fuzzer finds a crash, a leak, undefined
# behaviour or an escaping exception; the reproducer is left in build/fuzz/.
#
#   scripts/fuzz.sh [SECONDS]      (default 30)
#
# Needs clang++ with libFuzzer (Debian: clang), Boost headers and nlohmann-json
# (scripts/deps.sh installs them). Independent of the CMake build and its compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
cxx=${CLANGXX:-clang++}
out=build/fuzz
mkdir -p "$out"
bin=$out/fuzz_request_decoding
src=examples/server/fuzz_request_decoding.cpp
if [[ ! -x $bin || $src -nt $bin || examples/server/request_decoding.hpp -nt $bin ||
      examples/server/openai_protocol.hpp -nt $bin ]]; then
  echo "building $bin"
  "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -fno-omit-frame-pointer -Wall -Wextra -Werror -Iexamples/server -Iinclude "$src" -o "$bin"
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "fuzzing for ${seconds}s"
cd "$out"
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
  ./fuzz_request_decoding -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "$scratch" ../../tests/fuzz/corpus/request_decoding
