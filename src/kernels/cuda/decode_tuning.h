// Internal (not installed, not part of the public API): knobs of the decode
// attention kernel for experiments (bench --sweep, tests). A
// default-constructed DecodeTuning is exactly what kvcache::cuda::attention
// runs; every 0 / nullptr field means "the kernel's normal choice".
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcache/cuda/kernels.h"
#include "kvcache/cuda/workspace.h"
#include "kvcache/dtype.h"
#include "kvcache/kv_cache.h"

namespace kvcache::cuda::detail {

struct DecodeTuning {
  // Query vectors per block (new rows x heads of one KV head): 1, 2, 4 or 8
  // (0: 8). Fewer vectors = more head tiles, each re-reading the KV head's
  // K/V (adjacent blocks, mostly from L2).
  std::uint32_t max_vectors = 0;
  // cp.async ring depth per warp, 2..4 (0: 3). Honoured for f16 / bf16 rows
  // of 9..16 16-byte vectors (head dim 72..128); other rows use 3.
  std::uint32_t stages = 0;
  // Lanes per token row: 8 = 8 lanes x 2 vectors for f16 / bf16 rows of
  // 9..16 vectors when a block has <= 4 query vectors (0: by the row: 16).
  std::uint32_t lanes = 0;
  // Split-KV plan: floor(split_waves x resident blocks / unsplit blocks)
  // splits (0: 1 wave), each split >= min_split_tokens (0: 256).
  std::uint32_t split_waves = 0;
  std::uint32_t min_split_tokens = 0;
  // Run the generic kernel even where the decode or prefill kernel would
  // (tests keep the generic kernel covered at every shape; bench comparisons).
  bool generic = false;
};

// kvcache::cuda::attention with decode-kernel knobs (the generic and prefill
// kernels ignore them, except `generic`); workspace as in attention (nullptr: none).
void attention_cuda_tuned(DType dtype, const CacheDesc& k, const CacheDesc& v,
                          std::span<const float> q, std::uint32_t n_q_heads,
                          std::span<const std::uint32_t> row_offsets, std::span<float> out,
                          const AttentionOptions& options, CUstream_st* stream,
                          AttentionWorkspace* workspace, const DecodeTuning& tuning);

}  // namespace kvcache::cuda::detail
