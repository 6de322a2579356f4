#!/usr/bin/env bash
# What including tailbatch costs a server's build, measured against a baseline in the same run:
#
#   1. preprocessed lines of the umbrella <tailbatch/tailbatch.hpp> (goal: <= 120k with g++ 12
#      in C++20 mode), and of a file that includes only the standard and system headers the
#      core needs (the floor: what any C++20 server file with threads and futures pays anyway);
#   2. the time to compile a file that instantiates one Pipeline (submit, future, shutdown)
#      against the time to compile that standard-headers file (goal: <= 3x), each the median
#      of --runs runs, interleaved so both see the same machine load. CPU time (user + sys)
#      makes the ratio; wall time and peak memory are printed beside it;
#   3. for scale, in the same runs: a minimal hand-written batcher (not tailbatch) using the
#      same standard facilities (threads, condition variable, promise/future, std::function);
#   4. what a precompiled header buys: the umbrella precompiled once (its own time printed),
#      then the same Pipeline file compiled against it, in the same runs.
#
# Usage: benchmarks/compile_cost.sh [--cxx g++] [--runs 3] [--flags "-O2"]
# Not a test: it prints figures and whether the goals are met, and exits 0 unless a
# compilation fails. docs/performance.md records its output.
set -euo pipefail
cd "$(dirname "$0")/.."

cxx=g++
runs=3
flags="-O2"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cxx) cxx="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --flags) flags="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "compile_cost.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x /usr/bin/time ]] || { echo "compile_cost.sh: needs /usr/bin/time (Debian: time)" >&2; exit 2; }
command -v readelf > /dev/null || { echo "compile_cost.sh: needs readelf (Debian: binutils)" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The standard and system headers the core includes: every <...> include that the compiler
# takes in the core's headers (include/tailbatch/ without the CUDA subtree) and that is not a
# tailbatch header. Read from the preprocessor (-dI keeps the #include lines, the line
# markers say which file each is in), so that an include this compiler skips (a fallback
# under #if, as detail/math.hpp's <cmath>) is not counted.
find include/tailbatch -name '*.hpp' -not -path 'include/tailbatch/cuda/*' -not -name cuda.hpp | sort |
  sed 's|^include/\(.*\)|#include <\1>|' > "$work/all_core.cpp"
"$cxx" -std=c++20 -Iinclude -E -dI "$work/all_core.cpp" |
  awk '/^# [0-9]+ "/ { f = $3; gsub(/"/, "", f); next }
       /^[[:space:]]*#[[:space:]]*include[[:space:]]*</ {
         if (f ~ /(^|\/)include\/tailbatch\//) {
           match($0, /<[^>]+>/); h = substr($0, RSTART + 1, RLENGTH - 2)
           if (h !~ /^tailbatch\//) print h
         }
       }' | sort -u > "$work/std_headers.txt"
{
  sed 's/.*/#include <&>/' "$work/std_headers.txt"
  echo 'int main() { return 0; }'
} > "$work/std_headers.cpp"

cat > "$work/umbrella.cpp" <<'EOF'
#include <tailbatch/tailbatch.hpp>
EOF

cat > "$work/pipeline.cpp" <<'EOF'
// One Pipeline, instantiated and used the way a server file uses it.
#include <tailbatch/tailbatch.hpp>

#include <chrono>
#include <cstddef>
#include <span>

int main() {
  using namespace std::chrono_literals;
  auto square = [](std::span<const int> in, std::span<int> out, tailbatch::HostLane&) {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * in[i];
  };
  tailbatch::Pipeline<int, int> pipeline(square, tailbatch::FixedWindow(32, 5ms));
  auto answer = pipeline.submit(7, {.timeout = 100ms});
  const bool ok = answer.get().ok();
  pipeline.shutdown();
  return ok ? 0 : 1;
}
EOF

# The floor's floor: a minimal hand-written batching front door using the same standard
# facilities as a Pipeline (worker threads, a mutex and condition variable, promise and
# future, a std::function model, a deadline check, EDF order), with none of a Pipeline's
# other features. Not tailbatch code: it says how much of the 3x budget a batcher of any
# design spends on the standard library alone.
cat > "$work/minimal_batcher.cpp" <<'EOF'
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <future>
#include <iterator>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

template <class Req, class Resp>
class MiniBatcher {
 public:
  using Clock = std::chrono::steady_clock;
  using Model = std::function<void(std::span<const Req>, std::span<Resp>)>;
  struct Result {
    bool ok = false;
    std::optional<Resp> value;
    std::string error;
  };
  MiniBatcher(Model m, std::size_t max_batch, std::chrono::nanoseconds window, std::size_t workers)
      : model_(std::move(m)), max_batch_(max_batch), window_(window) {
    for (std::size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { run(); });
  }
  ~MiniBatcher() { shutdown(); }
  std::future<Result> submit(Req r, std::chrono::nanoseconds timeout) {
    std::promise<Result> p;
    auto f = p.get_future();
    {
      std::lock_guard lk(mu_);
      if (closed_) {
        p.set_value({false, {}, "shutting down"});
        return f;
      }
      const auto now = Clock::now();
      q_.push_back({std::move(r), std::move(p), now + timeout, now});
    }
    cv_.notify_one();
    return f;
  }
  void shutdown() {
    {
      std::lock_guard lk(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  struct Entry {
    Req req;
    std::promise<Result> done;
    Clock::time_point deadline, arrival;
  };
  void run() {
    for (;;) {
      std::vector<Entry> batch;
      {
        std::unique_lock lk(mu_);
        for (;;) {
          if (q_.empty()) {
            if (closed_) return;
            cv_.wait(lk);
            continue;
          }
          const auto due = q_.front().arrival + window_;
          if (q_.size() >= max_batch_ || closed_ || Clock::now() >= due) break;
          cv_.wait_until(lk, due);
        }
        const auto n = static_cast<std::ptrdiff_t>(std::min(max_batch_, q_.size()));
        std::sort(q_.begin(), q_.end(), [](const Entry& a, const Entry& b) { return a.deadline < b.deadline; });
        std::move(q_.begin(), q_.begin() + n, std::back_inserter(batch));
        q_.erase(q_.begin(), q_.begin() + n);
      }
      const auto now = Clock::now();
      std::vector<Req> in;
      std::vector<Entry*> live;
      for (auto& e : batch) {
        if (e.deadline < now) {
          e.done.set_value({false, {}, "deadline exceeded"});
        } else {
          in.push_back(e.req);
          live.push_back(&e);
        }
      }
      std::vector<Resp> out(in.size());
      try {
        model_(in, out);
        for (std::size_t i = 0; i < live.size(); ++i) live[i]->done.set_value({true, out[i], {}});
      } catch (const std::exception& ex) {
        for (auto* e : live) e->done.set_value({false, {}, ex.what()});
      }
    }
  }
  Model model_;
  std::size_t max_batch_;
  std::chrono::nanoseconds window_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> q_;
  bool closed_ = false;
  std::vector<std::thread> threads_;
};

int main() {
  using namespace std::chrono_literals;
  MiniBatcher<int, int> b(
      [](std::span<const int> in, std::span<int> out) {
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * in[i];
      },
      32, 5ms, 2);
  auto f = b.submit(7, 100ms);
  const bool ok = f.get().ok;
  b.shutdown();
  return ok ? 0 : 1;
}
EOF

std_flags=(-std=c++20 -Iinclude)
read -r -a extra_flags <<< "$flags"

lines() { "$cxx" "${std_flags[@]}" -E "$1" | wc -l; }

# One compilation of file $2 into object $1 (further arguments are extra flags):
# prints "wall_s cpu_s peak_kib".
compile_once() {
  local obj="$1" src="$2"
  shift 2
  /usr/bin/time -f '%e %U %S %M' -o "$work/time.txt" \
    "$cxx" "${std_flags[@]}" "${extra_flags[@]}" "$@" -c "$src" -o "$obj"
  awk '{ printf "%.3f %.3f %d\n", $1, $2 + $3, $4 }' "$work/time.txt"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

umbrella_lines=$(lines "$work/umbrella.cpp")
std_lines=$(lines "$work/std_headers.cpp")

: > "$work/std.runs"
: > "$work/pipe.runs"
: > "$work/mini.runs"
: > "$work/pch.runs"

# The umbrella as a precompiled header, built with the same flags as the files that use it
# (both compilers refuse a header precompiled with other flags: clang's -include-pch fails
# by itself, g++ with -Werror=invalid-pch, instead of a silent full parse).
mkdir -p "$work/pch"
echo '#include <tailbatch/tailbatch.hpp>' > "$work/pch/umbrella_pch.hpp"
if "$cxx" --version | grep -qi clang; then
  pch_file="$work/pch/umbrella_pch.hpp.pch"
  pch_use=(-include-pch "$pch_file")
else
  pch_file="$work/pch/umbrella_pch.hpp.gch"
  pch_use=(-include "$work/pch/umbrella_pch.hpp" -Winvalid-pch -Werror=invalid-pch)
fi
/usr/bin/time -f '%e %U %S %M' -o "$work/time.txt" \
  "$cxx" "${std_flags[@]}" "${extra_flags[@]}" -x c++-header "$work/pch/umbrella_pch.hpp" -o "$pch_file"
pch_build=$(awk '{ printf "%.3f %.3f %d\n", $1, $2 + $3, $4 }' "$work/time.txt")

for ((i = 1; i <= runs; ++i)); do
  compile_once "$work/std.o" "$work/std_headers.cpp" >> "$work/std.runs"
  compile_once "$work/pipe.o" "$work/pipeline.cpp" >> "$work/pipe.runs"
  compile_once "$work/mini.o" "$work/minimal_batcher.cpp" >> "$work/mini.runs"
  compile_once "$work/pipe_pch.o" "$work/pipeline.cpp" "${pch_use[@]}" >> "$work/pch.runs"
done
col() { awk -v c="$2" '{ print $c }' "$1" | median; }
std_wall=$(col "$work/std.runs" 1); std_cpu=$(col "$work/std.runs" 2); std_mem=$(col "$work/std.runs" 3)
pipe_wall=$(col "$work/pipe.runs" 1); pipe_cpu=$(col "$work/pipe.runs" 2); pipe_mem=$(col "$work/pipe.runs" 3)
mini_wall=$(col "$work/mini.runs" 1); mini_cpu=$(col "$work/mini.runs" 2); mini_mem=$(col "$work/mini.runs" 3)
pch_wall=$(col "$work/pch.runs" 1); pch_cpu=$(col "$work/pch.runs" 2); pch_mem=$(col "$work/pch.runs" 3)
read -r pchb_wall pchb_cpu pchb_mem <<< "$pch_build"

verdict() { if awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; then echo met; else echo "NOT met"; fi; }
ratio=$(awk -v a="$pipe_cpu" -v b="$std_cpu" 'BEGIN { printf "%.2f", a / b }')

echo "compiler: $("$cxx" --version | head -1); flags: ${std_flags[*]} ${extra_flags[*]}; median of $runs"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'umbrella <tailbatch/tailbatch.hpp>:        %7d preprocessed lines (goal <= 120000: %s)\n' \
  "$umbrella_lines" "$(verdict "$umbrella_lines" 120000)"
printf 'standard headers the core needs (%2d):     %7d preprocessed lines\n' \
  "$(wc -l < "$work/std_headers.txt")" "$std_lines"
printf '%-44s wall %6.2f s  cpu %6.2f s  peak %5d MB\n' "compile: standard headers only" \
  "$std_wall" "$std_cpu" "$((std_mem / 1024))"
printf '%-44s wall %6.2f s  cpu %6.2f s  peak %5d MB\n' "compile: one Pipeline instantiated" \
  "$pipe_wall" "$pipe_cpu" "$((pipe_mem / 1024))"
echo "ratio (Pipeline / standard headers, cpu time): ${ratio}x (goal <= 3x: $(verdict "$ratio" 3))"
mini_ratio=$(awk -v a="$mini_cpu" -v b="$std_cpu" 'BEGIN { printf "%.2f", a / b }')
printf '%-44s wall %6.2f s  cpu %6.2f s  peak %5d MB\n' "compile: a minimal hand-written batcher" \
  "$mini_wall" "$mini_cpu" "$((mini_mem / 1024))"
echo "ratio (minimal batcher / standard headers, cpu time): ${mini_ratio}x (not tailbatch: the standard library's share of any batcher)"
# How much code each file generates: the functions defined in the object and their bytes,
# each counted once (a constructor's or destructor's complete and base-object symbols are
# often one body under two names: same section, same address). What the optimiser and code
# generator spend their time on.
code() {
  readelf -sW "$1" | awk '$4 == "FUNC" && $7 ~ /^[0-9]+$/ {
      k = $7 ":" $2; if (!(k in seen)) { seen[k] = 1; n++; b += $3 } }
    END { printf "%d functions, %d bytes", n, b }'
}
echo "code generated: Pipeline file $(code "$work/pipe.o"); minimal batcher $(code "$work/mini.o")"
printf '%-44s wall %6.2f s  cpu %6.2f s  peak %5d MB\n' "precompile the umbrella (once per build)" \
  "$pchb_wall" "$pchb_cpu" "$((pchb_mem / 1024))"
printf '%-44s wall %6.2f s  cpu %6.2f s  peak %5d MB\n' "compile: one Pipeline, umbrella precompiled" \
  "$pch_wall" "$pch_cpu" "$((pch_mem / 1024))"
pch_ratio=$(awk -v a="$pch_cpu" -v b="$std_cpu" 'BEGIN { printf "%.2f", a / b }')
echo "ratio (Pipeline with the precompiled umbrella / standard headers, cpu time): ${pch_ratio}x (for scale: the goal's file is the one without)"
