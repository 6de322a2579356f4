// One record() per call, compiled into a shared library; TAILBATCH_BENCH_RECORD_NAME picks
// the exported name so that two builds of this file (two TLS models) can be linked at once.
#include "histogram_shared_recorder.hpp"

void TAILBATCH_BENCH_RECORD_NAME(tailbatch::LatencyHistogram& h, std::chrono::nanoseconds v) noexcept {
  h.record(v);
}
