// kvcache/params.h — the static shape of a KV cache and its memory math.
//
// `KVCacheParams` says what one token costs (dtype, layers, KV heads, head
// dim) and how the cache is organised (continuous slots or a paged pool).
// `validate()` refuses every inconsistent combination with an
// InvalidArgument that names the field and the limit; every manager calls it
// in its constructor, so a manager never holds invalid params.
//
// Plain value type: copy freely, no thread-safety concerns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvcache/dtype.h"

namespace kvcache {

// How sequences map to memory (MAX's KVCacheStrategy).
enum class CacheStrategy : std::uint8_t {
  continuous,  // one max_seq_len slot per sequence
  paged,       // a shared pool of fixed-size pages, one page table per sequence
};

std::string_view strategy_name(CacheStrategy s);
// "continuous" | "paged"; throws InvalidArgument otherwise.
CacheStrategy parse_strategy(std::string_view name);

// Order of the [page_size][n_kv_heads] dimensions inside a page / slot.
//  nhd: [tokens][n_kv_heads][head_dim], the seeds' layout: one token's heads
//       are contiguous (a token's new K row is one copy).
//  hnd: [n_kv_heads][tokens][head_dim]: one head's tokens are contiguous, so
//       the CPU attention goes head by head and reads each page in address
//       order; measured faster for decode than NHD on the Zen 5 machine of
//       docs/PERFORMANCE.md for MHA and GQA 8 (16-token pages,
//       from DRAM: MHA 1.12x, GQA 4 0.96x, GQA 8 1.13x of NHD). The views,
//       kernels, managers and Python arrays follow the layout; code that uses
//       view.ptr() / load() / store() works for both.
enum class PageLayout : std::uint8_t { nhd, hnd };

std::string_view layout_name(PageLayout l);
// "nhd" | "hnd"; throws InvalidArgument otherwise.
PageLayout parse_layout(std::string_view name);

// Where each layer's K and V blocks lie in the pool (DESIGN.md §2). One block
// id (page or slot) covers every layer's K and V in both.
//  interleaved: [blocks][2][num_layers][block] (MAX, the seeds): one block's
//               K/V of every layer are contiguous, consecutive blocks of one
//               layer are 2 * num_layers blocks apart.
//  per_layer:   [num_layers][2][blocks][block] (vLLM, FlashInfer, ferrum):
//               each layer's K and each layer's V is an array of its own,
//               `[num_blocks][page_size][n_kv_heads][head_dim]` (NHD) or
//               `[num_blocks][n_kv_heads][page_size][head_dim]` (HND, ferrum's
//               `[num_blocks, num_kv_heads, block_size, head_dim]`).
// `block` is one layer's K (or V) of one block: [page_size][n_kv_heads][head_dim]
// in NHD, [n_kv_heads][page_size][head_dim] in HND.
enum class PoolArrangement : std::uint8_t { interleaved, per_layer };

std::string_view arrangement_name(PoolArrangement a);
// "interleaved" | "per_layer" (also "per-layer"); throws InvalidArgument otherwise.
PoolArrangement parse_arrangement(std::string_view name);

struct KVCacheParams {
  DType dtype = DType::f32;
  std::uint32_t num_layers = 1;
  std::uint32_t n_kv_heads = 1;  // total KV heads of the model (all devices)
  std::uint32_t head_dim = 64;
  CacheStrategy cache_strategy = CacheStrategy::continuous;
  std::uint32_t page_size = 0;               // tokens per page; must be > 0 for paged
  bool enable_prefix_caching = false;        // paged only
  std::uint32_t n_devices = 1;               // KV heads are split evenly across devices
  PageLayout page_layout = PageLayout::nhd;  // order inside a page / slot (both strategies)
  PoolArrangement pool_arrangement = PoolArrangement::interleaved;  // where layers lie

  // Throws InvalidArgument on: zero num_layers / n_kv_heads / head_dim /
  // n_devices; int8 with head_dim not a multiple of 4 (its in-page scales
  // must stay 4-byte aligned); paged with page_size 0; continuous with page_size != 0 is
  // allowed and ignored; prefix caching with continuous; n_devices not
  // dividing n_kv_heads (MAX floors silently; we refuse); an enum value
  // outside its type; one token of K/V over 2^31 bytes (so a token count up
  // to 2^32 times it still fits 64 bits).
  void validate() const;

  // KV heads stored on each device.
  std::uint32_t n_kv_heads_per_device() const { return n_kv_heads / n_devices; }

  // Bytes of K and V for one token over all layers and all devices:
  // 2 * num_layers * n_kv_heads * (head_dim * dtype_size + scale bytes),
  // the scale bytes being 4 for int8 (its in-page (token, head) scale) and 0
  // otherwise (fp8's static scales live outside the pool: kv_scales.h).
  std::size_t bytes_per_token() const;

  // Same, for one device's shard.
  std::size_t bytes_per_token_per_device() const;

  // Human-readable one-liner, e.g. "bf16 L32 kv8 d128 paged/16" (" hnd"
  // appended for that layout, " per_layer" for that arrangement).
  std::string to_string() const;

  friend bool operator==(const KVCacheParams&, const KVCacheParams&) = default;
};

}  // namespace kvcache
