// libFuzzer target: bytes -> KVCacheParams and manager sizes at the edges of
// uint32_t / size_t, checked by tests/reliability/size_inputs.h (exact memory
// math or InvalidArgument; a manager that fits is written at its limits).
// Build and run: `make fuzz` (clang, ASan+UBSan, corpus in fuzz/corpus/sizes).
#include <cstddef>
#include <cstdint>

#include "reliability/size_inputs.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvcache::testing::run_size_inputs({data, size});
  return 0;
}
