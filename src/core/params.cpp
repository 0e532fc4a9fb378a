#include "kvcache/params.h"

#include <limits>
#include <string>

#include "kvcache/error.h"

namespace kvcache {

std::string_view strategy_name(CacheStrategy s) {
  return s == CacheStrategy::paged ? "paged" : "continuous";
}

CacheStrategy parse_strategy(std::string_view name) {
  if (name == "continuous") return CacheStrategy::continuous;
  if (name == "paged") return CacheStrategy::paged;
  throw InvalidArgument("unknown cache strategy '" + std::string(name) +
                        "': expected continuous or paged");
}

std::string_view layout_name(PageLayout l) { return l == PageLayout::hnd ? "hnd" : "nhd"; }

PageLayout parse_layout(std::string_view name) {
  if (name == "nhd") return PageLayout::nhd;
  if (name == "hnd") return PageLayout::hnd;
  throw InvalidArgument("unknown page layout '" + std::string(name) + "': expected nhd or hnd");
}

std::string_view arrangement_name(PoolArrangement a) {
  return a == PoolArrangement::per_layer ? "per_layer" : "interleaved";
}

PoolArrangement parse_arrangement(std::string_view name) {
  if (name == "interleaved") return PoolArrangement::interleaved;
  if (name == "per_layer" || name == "per-layer") return PoolArrangement::per_layer;
  throw InvalidArgument("unknown pool arrangement '" + std::string(name) +
                        "': expected interleaved or per_layer");
}

namespace {

// Bytes of in-page scale per (token, KV head) row: int8's float scale.
std::size_t scale_bytes(DType t) { return has_page_scales(t) ? sizeof(float) : 0; }

void require_positive(const char* field, std::uint32_t value) {
  if (value == 0) throw InvalidArgument(std::string(field) + " is 0: it must be at least 1");
}

// Decimal digits of a 128-bit count (std::to_string has no overload for it).
std::string u128_string(unsigned __int128 v) {
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return digits;
}

}  // namespace

void KVCacheParams::validate() const {
  require_positive("num_layers", num_layers);
  require_positive("n_kv_heads", n_kv_heads);
  require_positive("head_dim", head_dim);
  require_positive("n_devices", n_devices);
  if (!is_dtype(dtype)) {
    throw InvalidArgument("dtype value " + std::to_string(static_cast<int>(dtype)) +
                          " is not one of f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8");
  }
  if (has_page_scales(dtype) && head_dim % 4 != 0) {
    throw InvalidArgument("head_dim " + std::to_string(head_dim) +
                          " is not a multiple of 4: an int8 cache keeps float scales after "
                          "each block's values and needs them 4-byte aligned");
  }
  if (cache_strategy != CacheStrategy::continuous && cache_strategy != CacheStrategy::paged) {
    throw InvalidArgument("cache_strategy value " +
                          std::to_string(static_cast<int>(cache_strategy)) +
                          " is not continuous or paged");
  }
  if (page_layout != PageLayout::nhd && page_layout != PageLayout::hnd) {
    throw InvalidArgument("page_layout value " + std::to_string(static_cast<int>(page_layout)) +
                          " is not nhd or hnd");
  }
  if (pool_arrangement != PoolArrangement::interleaved &&
      pool_arrangement != PoolArrangement::per_layer) {
    throw InvalidArgument("pool_arrangement value " +
                          std::to_string(static_cast<int>(pool_arrangement)) +
                          " is not interleaved or per_layer");
  }
  if (cache_strategy == CacheStrategy::paged && page_size == 0) {
    throw InvalidArgument("page_size is 0: a paged cache needs page_size >= 1");
  }
  if (enable_prefix_caching && cache_strategy != CacheStrategy::paged) {
    throw InvalidArgument(
        "enable_prefix_caching is true but cache_strategy is continuous: prefix caching needs "
        "the paged strategy");
  }
  if (n_kv_heads % n_devices != 0) {
    throw InvalidArgument("n_devices " + std::to_string(n_devices) +
                          " does not divide n_kv_heads " + std::to_string(n_kv_heads));
  }
  // 2 * layers * heads * dim * 4 bytes must fit comfortably in 64 bits even
  // when multiplied by 2^32 tokens: keep one token under 2^31 bytes.
  const unsigned __int128 per_token = static_cast<unsigned __int128>(2) * num_layers * n_kv_heads *
                                      (head_dim * dtype_size(dtype) + scale_bytes(dtype));
  if (per_token > (static_cast<unsigned __int128>(1) << 31)) {
    throw InvalidArgument("one token needs " + u128_string(per_token) +
                          " bytes of K/V, more than the limit of 2147483648");
  }
}

std::size_t KVCacheParams::bytes_per_token() const {
  return 2 * std::size_t{num_layers} * n_kv_heads *
         (std::size_t{head_dim} * dtype_size(dtype) + scale_bytes(dtype));
}

std::size_t KVCacheParams::bytes_per_token_per_device() const {
  return bytes_per_token() / n_devices;
}

std::string KVCacheParams::to_string() const {
  std::string s = std::string(dtype_name(dtype)) + " L" + std::to_string(num_layers) + " kv" +
                  std::to_string(n_kv_heads) + " d" + std::to_string(head_dim) + " " +
                  std::string(strategy_name(cache_strategy));
  // Appended piece by piece: "/" + std::to_string(...) trips GCC 12's
  // -Wrestrict false positive inside std::string (GCC PR 105651).
  if (cache_strategy == CacheStrategy::paged) s.append("/").append(std::to_string(page_size));
  if (enable_prefix_caching) s += " +prefix";
  if (n_devices > 1) s.append(" x").append(std::to_string(n_devices)).append(" devices");
  if (page_layout == PageLayout::hnd) s += " hnd";
  if (pool_arrangement == PoolArrangement::per_layer) s += " per_layer";
  return s;
}

}  // namespace kvcache
