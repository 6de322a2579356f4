// The classifier example on CUDA lanes (falling back to host lanes where no GPU can be
// used): the same program as examples/classifier_pipeline.cpp, compiled by nvcc.
#include "../classifier_pipeline.cpp"
