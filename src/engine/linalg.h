// src/engine/linalg.h — the dense math of the model (fp32): BLAS matrix
// products, RMSNorm, rotary embeddings, SwiGLU. Internal to the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcache/kernels/rope_table.h"

namespace kvcache::engine {

// y[rows][out] (+)= x[rows][in] * W^T, W row-major [out][in] (HF layout).
void linear(const float* x, std::size_t rows, std::size_t in, const float* w, std::size_t out,
            float* y, bool accumulate = false);

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, row by row.
void rms_norm(const float* x, std::size_t rows, std::size_t dim, const float* weight, float eps,
              float* y);

// Rotate-half RoPE in place on [rows][heads][head_dim]; row r is at
// positions[r]. Pairs (d, d + head_dim/2) rotate by pos * theta^(-2d/head_dim),
// with the angles of `table` (positions past its end computed as it would)
// and the library's rotation (kernels/rope.h): bit for bit what store_kv's
// fused RoPE writes for K.
void apply_rope(float* x, std::size_t rows, std::uint32_t heads, std::uint32_t head_dim,
                std::span<const std::uint32_t> positions, const RopeTable& table);

// gate[i] = silu(gate[i]) * up[i].
void silu_mul(float* gate, const float* up, std::size_t n);

}  // namespace kvcache::engine
