// kvcache/kernels/rope_table.h — the cos/sin of the RoPE angles, computed
// once per position, for the fused-RoPE store.
//
// store_kv with StoreOptions::rope_k computes rotary_dim/2 cos/sin pairs in
// double precision for every token it writes (rope_cos_sin in
// kernels/rope.h). That trigonometry costs more than moving the token's
// rows does. A RopeTable computes the pairs
// of positions [0, max_positions) once, with the same function, so a store
// given one (StoreOptions::rope_table) writes bit-identical results without
// the trigonometry. Positions at or past max_positions are computed per
// token as without a table. Engines keep one table per model (vLLM's
// cos_sin_cache is the same idea).
//
// Memory: max_positions * rotary_dim floats (32768 positions at rotary_dim
// 128: 16 MiB). Building it costs what storing max_positions tokens with
// rope_k and no table spends on cos/sin (about 10 ms for 32768 positions).
//
// Ownership and thread-safety: a value type that owns its storage. It is
// immutable once built, so any number of threads may read it (and stores
// may use it) concurrently. The caller keeps it alive for every store_kv
// call whose StoreOptions point at it.
//
// Throws InvalidArgument for an odd rotary_dim or one larger than head_dim,
// a theta that is not positive (as rope_rotary_dim does), head_dim 0 or
// max_positions 0,
// and, from cos_sin, a position at or past max_positions; OutOfMemory when
// the table cannot be allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/kernels/attention.h"

namespace kvcache {

class RopeTable {
 public:
  // Angles of `rope` (theta, rotary_dim; `enabled` is not consulted) for a
  // head of head_dim elements, positions 0 .. max_positions - 1.
  RopeTable(const RopeOptions& rope, std::uint32_t head_dim, std::uint32_t max_positions);

  float theta() const noexcept { return theta_; }
  // rotary_dim in effect (RopeOptions::rotary_dim 0 resolved to head_dim).
  std::uint32_t rotary_dim() const noexcept { return rotary_dim_; }
  std::uint32_t max_positions() const noexcept { return max_positions_; }
  std::size_t memory_bytes() const noexcept { return values_.size() * sizeof(float); }

  // rotary_dim floats for position pos: the cos of pairs 0 .. rotary_dim/2 - 1,
  // then their sin; exactly what rope_cos_sin returns for each pair.
  std::span<const float> cos_sin(std::uint32_t pos) const;

  // Whether this table holds the angles of `rope` for head_dim (same theta,
  // same rotary_dim in effect): what store_kv requires of StoreOptions::rope_table.
  bool matches(const RopeOptions& rope, std::uint32_t head_dim) const;

 private:
  float theta_;
  std::uint32_t rotary_dim_;
  std::uint32_t max_positions_;
  std::vector<float> values_;  // [max_positions][rotary_dim]: cos half, then sin half
};

// Checks StoreOptions' RoPE fields for a cache of head_dim: with rope_k
// enabled, its theta and rotary_dim (rope_rotary_dim) and that rope_table, if
// set, matches them; with rope_k disabled, that no rope_table is set. Throws
// InvalidArgument naming the values. What store_kv checks before writing.
void check_store_rope(const StoreOptions& options, std::uint32_t head_dim);

}  // namespace kvcache
