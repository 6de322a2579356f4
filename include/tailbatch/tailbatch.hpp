// tailbatch: the umbrella header, exactly the core a server links (tailbatch::tailbatch).
//
// Not included here, each on purpose:
//   <tailbatch/cuda.hpp>               the CUDA subtree (stream pool, fallback lanes, RAII
//                                      handles), for code that opts in to <cuda_runtime.h>;
//   <tailbatch/tools/...>              planner, Little's-law check, simulator, load generator,
//                                      load profiles, SVG plots (tailbatch::tools);
//   <tailbatch/reference/...>          the reference classifier and generator used by the
//                                      examples, tests and benchmarks (tailbatch::reference).
#pragma once

#include <tailbatch/version.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/admission.hpp>
#include <tailbatch/limit_algorithms.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/littles_law.hpp>
#include <tailbatch/load.hpp>
#include <tailbatch/autoscaler.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/policy_variant.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/queue_policy.hpp>
#include <tailbatch/tenants.hpp>
#include <tailbatch/pipeline_config.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/token_streamer.hpp>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/result_cache.hpp>
#include <tailbatch/warmup.hpp>
#include <tailbatch/serving.hpp>
