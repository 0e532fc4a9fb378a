// kvcache_cuda_tests entry point: fails (never skips) without a CUDA device.
#include <gtest/gtest.h>

#include <cstdio>

#include "kvcache/cuda/device.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (kvcache::cuda::device_count() == 0) {
    std::fprintf(stderr,
                 "kvcache_cuda_tests: no CUDA device (cudaGetDeviceCount found none or no usable "
                 "driver). These tests need an NVIDIA GPU; failing instead of skipping.\n");
    return 1;
  }
  std::printf("kvcache_cuda_tests on %s\n", kvcache::cuda::device_description().c_str());
  return RUN_ALL_TESTS();
}
