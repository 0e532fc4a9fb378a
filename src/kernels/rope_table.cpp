// RopeTable: rope_cos_sin for every (position, pair), computed once.
#include "kvcache/kernels/rope_table.h"

#include <new>
#include <stdexcept>
#include <string>

#include "kvcache/error.h"
#include "kvcache/kernels/rope.h"

namespace kvcache {

namespace {

std::string too_large(std::uint32_t max_positions, std::size_t floats) {
  return "RopeTable of " + std::to_string(max_positions) + " positions needs " +
         std::to_string(floats) + " floats, which could not be allocated";
}

}  // namespace

RopeTable::RopeTable(const RopeOptions& rope, std::uint32_t head_dim, std::uint32_t max_positions)
    : theta_(rope.theta),
      rotary_dim_(rope_rotary_dim(rope, head_dim)),
      max_positions_(max_positions) {
  if (head_dim == 0) throw InvalidArgument("RopeTable head_dim 0 must be at least 1");
  if (max_positions == 0) throw InvalidArgument("RopeTable max_positions 0 must be at least 1");
  const std::size_t floats = std::size_t{max_positions} * rotary_dim_;
  try {
    values_.resize(floats);
  } catch (const std::length_error&) {
    throw OutOfMemory(too_large(max_positions, floats));
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(too_large(max_positions, floats));
  }
  const std::uint32_t half = rotary_dim_ / 2;
  const std::vector<float> inv_freq = rope_inv_freqs(rotary_dim_, theta_);
  for (std::uint32_t pos = 0; pos < max_positions; ++pos) {
    float* row = values_.data() + std::size_t{pos} * rotary_dim_;
    for (std::uint32_t i = 0; i < half; ++i) rope_cos_sin(pos, inv_freq[i], row[i], row[half + i]);
  }
}

std::span<const float> RopeTable::cos_sin(std::uint32_t pos) const {
  if (pos >= max_positions_) {
    throw InvalidArgument("RopeTable position " + std::to_string(pos) + " is past max_positions " +
                          std::to_string(max_positions_));
  }
  return {values_.data() + std::size_t{pos} * rotary_dim_, rotary_dim_};
}

bool RopeTable::matches(const RopeOptions& rope, std::uint32_t head_dim) const {
  return rope.theta == theta_ && rope_rotary_dim(rope, head_dim) == rotary_dim_;
}

void check_store_rope(const StoreOptions& options, std::uint32_t head_dim) {
  const RopeOptions& rope = options.rope_k;
  const RopeTable* table = options.rope_table;
  if (!rope.enabled) {
    if (table != nullptr) {
      throw InvalidArgument("StoreOptions::rope_table is set but rope_k.enabled is false");
    }
    return;
  }
  const std::uint32_t rotary_dim = rope_rotary_dim(rope, head_dim);
  if (table != nullptr && !table->matches(rope, head_dim)) {
    throw InvalidArgument("StoreOptions::rope_table (theta " + std::to_string(table->theta()) +
                          ", rotary_dim " + std::to_string(table->rotary_dim()) +
                          ") does not match rope_k (theta " + std::to_string(rope.theta) +
                          ", rotary_dim " + std::to_string(rotary_dim) + ")");
  }
}

}  // namespace kvcache
