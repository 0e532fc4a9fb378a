// libFuzzer target: bytes -> a program of manager operations, checked after
// every step against a model (see tests/reliability/manager_ops.h).
// Build and run: `make fuzz` (clang, ASan+UBSan, corpus in fuzz/corpus/manager).
#include <cstddef>
#include <cstdint>

#include "reliability/manager_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvcache::testing::run_manager_ops({data, size});
  return 0;
}
