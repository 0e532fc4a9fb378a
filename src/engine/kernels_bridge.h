// src/engine/kernels_bridge.h — the ONE place the engine calls cache kernels.
//
// Writes this step's K/V rows of `layer` into the cache with `store` (the
// model passes RoPE on K there, so K is rotated on the way in) and runs
// causal GQA attention of q over history + new tokens, with the fast kernels
// (kvcache::store_kv / kvcache::attention, kernels/attention.h) on the
// calling thread, on the batch's per-layer descriptors (any dtype, either
// strategy).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/batch.h"
#include "kvcache/kernels/attention.h"

namespace kvcache::engine {

void store_and_attend(const KVCacheBatch& batch, std::uint32_t layer, std::span<const float> k,
                      std::span<const float> v, const StoreOptions& store, std::span<const float> q,
                      std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                      std::span<float> out);

}  // namespace kvcache::engine
