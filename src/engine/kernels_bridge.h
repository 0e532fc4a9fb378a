// src/engine/kernels_bridge.h — the ONE place the engine calls cache kernels.
//
// Writes this step's K/V rows of `layer` into the cache (RoPE already applied
// to K by the model) and runs causal GQA attention of q over history + new
// tokens. Today it calls the scalar reference kernels (kernels/reference.h);
// switching to the fast kvcache::store_kv / kvcache::attention is a one-line
// change in kernels_bridge.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/batch.h"

namespace kvcache::engine {

void store_and_attend(const KVCacheBatch& batch, std::uint32_t layer, std::span<const float> k,
                      std::span<const float> v, std::span<const float> q, std::uint32_t n_q_heads,
                      std::span<const std::uint32_t> row_offsets, std::span<float> out);

}  // namespace kvcache::engine
