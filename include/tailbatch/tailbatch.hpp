// tailbatch: the umbrella header. Everything but the CUDA subtree, which CUDA users
// include on its own as <tailbatch/cuda.hpp>.
#pragma once

#include <tailbatch/version.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/admission.hpp>
#include <tailbatch/limit_algorithms.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/token_streamer.hpp>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/reference/tokenizer.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/classifier_model.hpp>
#include <tailbatch/reference/generator.hpp>
#include <tailbatch/planner.hpp>
#include <tailbatch/svg_plot.hpp>
#include <tailbatch/load_profile.hpp>
#include <tailbatch/load_generator.hpp>
#include <tailbatch/simulator.hpp>
