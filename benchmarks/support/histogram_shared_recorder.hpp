// Record entry points compiled into -fPIC shared libraries (see benchmarks/histogram.cmake),
// so that bench_histogram can show what the histogram's thread_local costs there.
#pragma once

#include <chrono>

#include <tailbatch/latency_histogram.hpp>

// Built with the default TLS model (general dynamic: a __tls_get_addr call per access).
void tailbatch_bench_record_pic(tailbatch::LatencyHistogram& h, std::chrono::nanoseconds v) noexcept;
// Built with TAILBATCH_HISTOGRAM_TLS_MODEL=[[gnu::tls_model("initial-exec")]].
void tailbatch_bench_record_pic_initial_exec(tailbatch::LatencyHistogram& h, std::chrono::nanoseconds v) noexcept;
