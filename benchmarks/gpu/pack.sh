#!/usr/bin/env bash
# Builds the GPU check's programs here and packs them, with the shared libraries they need
# that a bare GPU machine may lack (fmt, Google Benchmark, libstdc++), into one folder, for
# a machine with a GPU but no compilers or Debian libraries:
#
#   benchmarks/gpu/pack.sh DIR [build-dir]     (default build dir: build/gpu)
#   ... copy DIR there, then:  benchmarks/gpu/run.sh --prebuilt DIR
#
# CUDA_ARCH sets the GPU architecture (default 90: Hopper SASS and compute_90 PTX, which
# newer GPUs run through the driver's JIT). Neither the C library nor the CUDA driver is
# packed: those must come from the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: benchmarks/gpu/pack.sh DIR [build-dir]}
build=${2:-build/gpu}
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[[ -x $nvcc ]] || { echo "pack.sh: nvcc not found" >&2; exit 1; }

programs=(cuda_test_classifier_gpu cuda_test_stream_pool cuda_test_fallback_lanes cuda_test_generator
          cuda_test_unique_handle cuda_bench_classifier_gpu classifier_pipeline_cuda)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DTAILBATCH_CUDA=ON \
  -DTAILBATCH_BUILD_TESTS=ON -DTAILBATCH_BUILD_BENCHMARKS=ON -DTAILBATCH_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$build" -j "${JOBS:-2}" --target "${programs[@]}"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for p in "${programs[@]}"; do
  exe=$(find "$build" -type f -name "$p" -perm -u+x | head -n 1)
  [[ -n $exe ]] || { echo "pack.sh: $p was not built" >&2; exit 1; }
  cp "$exe" "$out/bin/"
  # Every shared library it loads, but the C library's own and the CUDA driver's.
  ldd "$exe" | awk '$3 ~ /^\// {print $3}' |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda)\.so' |
    while read -r lib; do cp -nL "$lib" "$out/lib/"; done
done
echo "pack.sh: $(ls "$out/bin" | wc -l) programs and $(ls "$out/lib" | wc -l) libraries in $out ($(du -sh "$out" | cut -f1))"
