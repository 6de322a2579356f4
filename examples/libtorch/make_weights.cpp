// libtorch_make_weights: writes the example encoder's weights with torch::save, drawn from
// a seed. The build runs it (target libtorch_weights) to make the file the serving code
// loads; nothing is downloaded.
//
//   libtorch_make_weights OUT [SEED]     (SEED: 7)
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "encoder.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: libtorch_make_weights OUT [SEED]\n");
    return 2;
  }
  try {
    const std::uint64_t seed = argc == 3 ? std::stoull(argv[2]) : 7;
    const tailbatch_libtorch::EncoderConfig config;
    const tailbatch_libtorch::Encoder model = tailbatch_libtorch::make_encoder(config, seed);
    tailbatch_libtorch::save_encoder(model, argv[1]);
    std::printf("wrote %s (seed %llu, %lld parameters)\n", argv[1],
                static_cast<unsigned long long>(seed), static_cast<long long>([&] {
                  std::int64_t n = 0;
                  for (const auto& p : model->parameters()) n += p.numel();
                  return n;
                }()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_make_weights: %s\n", e.what());
    return 1;
  }
  return 0;
}
