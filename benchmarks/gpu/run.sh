#!/usr/bin/env bash
# The GPU check of tailbatch, in one go (under 5 minutes on one GPU):
#   1. configure and build the CUDA tests, benchmark and example for this machine's GPU
#      (CMAKE_CUDA_ARCHITECTURES=native);
#   2. run the CUDA tests: the classifier's kernels against the CPU twin (logits bit for
#      bit, probabilities within 1e-5 relative), bitwise batch invariance on the device,
#      the StreamPool (leasing, event timing, buffers, errors), the fallback to host lanes;
#   3. run the classifier example on CUDA lanes;
#   4. measure batch scaling (batch 1..64) and lane overlap (1, 2, 4 streams);
#   5. print a short table, last.
# Without an NVIDIA GPU it still builds everything (for the default architectures), then
# fails loudly: nothing on this page may pass without a GPU.
#
# Usage: benchmarks/gpu/run.sh [build-dir]      (default: build/gpu)
#        benchmarks/gpu/run.sh --prebuilt DIR  runs programs built elsewhere (for a GPU machine
#                                              with no compilers or libraries: build with
#                                              benchmarks/gpu/pack.sh, copy DIR there)
# Environment: CUDA_ARCH overrides the architecture (e.g. 90); JOBS the build parallelism.
set -euo pipefail

cd "$(dirname "$0")/../.."
prebuilt=""
if [[ ${1:-} == --prebuilt ]]; then
  prebuilt=${2:?--prebuilt needs a folder}
  build=$prebuilt
  # The libraries the programs need beside them (pack.sh copies them into lib/).
  export LD_LIBRARY_PATH=$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  build=${1:-build/gpu}
fi
start=$SECONDS
say() { printf '\n=== %s (at %ss)\n' "$*" "$((SECONDS - start))"; }
fail() { printf '\nrun.sh: FAILED: %s\n' "$*" >&2; exit 1; }

# --- the machine -----------------------------------------------------------------------------
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n $nvcc || -n $prebuilt ]] || fail "nvcc not found (put the CUDA toolkit's bin/ on PATH)"

gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
fi

cmake_version=$(cmake --version 2>/dev/null | head -n 1 | awk '{print $3}' || true)
if [[ -n ${CUDA_ARCH:-} ]]; then
  arch=$CUDA_ARCH
elif [[ -n $gpu ]]; then
  if [[ $(printf '3.24\n%s\n' "$cmake_version" | sort -V | head -n 1) == 3.24 ]]; then
    arch=native
  else
    # cmake older than 3.24 has no "native": use the compute capability nvidia-smi reports.
    arch=$(printf '%s' "$gpu" | awk -F', ' '{gsub(/\./, "", $2); print $2}')
  fi
else
  arch="80-real;90"
fi

say "machine"
echo "nvcc:  $([[ -n $nvcc ]] && "$nvcc" --version | tail -n 1)${prebuilt:+ (programs prebuilt in $prebuilt)}"
echo "cmake: ${cmake_version:-}"
echo "GPU:   ${gpu:-none found by nvidia-smi}"
echo "CUDA architectures: $arch"

# --- build -----------------------------------------------------------------------------------
tests=(cuda_test_classifier_gpu cuda_test_stream_pool cuda_test_fallback_lanes cuda_test_generator
       cuda_test_unique_handle)
programs=("${tests[@]}" cuda_bench_classifier_gpu classifier_pipeline_cuda)
if [[ -z $prebuilt ]]; then
  say "configure ($build)"
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  cmake -S . -B "$build" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DTAILBATCH_CUDA=ON \
    -DTAILBATCH_BUILD_TESTS=ON -DTAILBATCH_BUILD_BENCHMARKS=ON -DTAILBATCH_BUILD_EXAMPLES=ON >/dev/null
  say "build"
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${programs[@]}" test_cuda_headers_standalone
fi

if [[ -z $gpu ]]; then
  fail "no NVIDIA GPU on this machine (nvidia-smi found none). Everything built; nothing ran, nothing was measured."
fi

# --- tests: 77 (skipped) is a failure here, since there is a GPU -------------------------------
say "CUDA tests"
for t in "${tests[@]}"; do
  exe=$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)
  [[ -n $exe ]] || fail "$t was not built"
  echo "--- $t"
  set +e
  "$exe"
  rc=$?
  set -e
  [[ $rc -eq 0 ]] || fail "$t exited with $rc$([[ $rc -eq 77 ]] && echo ' (skipped: it found no usable GPU)')"
done

say "example: the classifier behind a Pipeline on CUDA lanes"
"$(find "$build" -type f -name classifier_pipeline_cuda -perm -u+x | head -n 1)"

# --- measurements ------------------------------------------------------------------------------
say "benchmarks"
csv="${OUT:-$build}/gpu_bench.csv"
"$(find "$build" -type f -name cuda_bench_classifier_gpu -perm -u+x | head -n 1)" --benchmark_min_time=0.2 --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out="$csv" --benchmark_out_format=csv

say "summary (medians of 3 repetitions; ${gpu})"
awk -F, '
  /_median"?,/ {
    name = $1; gsub(/"/, "", name); sub(/_median$/, "", name); sub(/\/manual_time$/, "", name)
    split(name, parts, "/")
    ips[name] = $7 + 0
    n = split($0, cols, ",")
    dev[name] = cols[n] + 0
    order[++count] = name
  }
  END {
    printf "%-26s %14s %10s %16s\n", "benchmark", "requests/s", "vs base", "device p50 (us)"
    for (i = 1; i <= count; i++) {
      name = order[i]
      split(name, parts, "/")
      base = ""
      if (parts[1] == "BM_Classifier_GPU") base = "BM_Classifier_GPU/1"
      if (parts[1] == "BM_Lane_Overlap") base = "BM_Lane_Overlap/1"
      if (parts[1] == "BM_Classifier_CPU") base = "BM_Classifier_CPU/1"
      ratio = (base in ips && ips[base] > 0) ? sprintf("%.2fx", ips[name] / ips[base]) : "-"
      d = (parts[1] == "BM_Classifier_GPU") ? sprintf("%.1f", dev[name]) : "-"
      printf "%-26s %14.0f %10s %16s\n", name, ips[name], ratio, d
    }
  }' "$csv"
echo "(batch scaling: BM_Classifier_GPU/<batch> vs batch 1; lane overlap: BM_Lane_Overlap/<streams> vs 1 stream)"
echo "done in $((SECONDS - start))s"
