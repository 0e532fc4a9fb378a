// A byte-driven check of the memory math at the edges of uint32_t / size_t:
// KVCacheParams, both managers' estimated_memory_size, pages_for_memory,
// block_shape, the manager constructors and a view over the result.
// Shared by the libFuzzer target fuzz/sizes_fuzzer.cpp and the test suite.
//
// Every size field is drawn from edge values (0, 1, 2, 2^16, 2^31 - 1, 2^31,
// 2^32 - 1, ...) or a small random one. Properties: a product that does not
// fit 64 bits is refused with InvalidArgument (never a wrapped value); one
// that fits equals the exact 128-bit product; a manager whose pool fits a
// small budget is built, fetched to its limits and written at its last
// row of every layer (out-of-bounds writes show under ASan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvcache::testing {

// Returns normally when every property held; throws std::logic_error
// describing the first broken one.
void run_size_inputs(std::span<const std::uint8_t> bytes);

}  // namespace kvcache::testing
