// Default chained block hash, policy and reuse-hint names (kvcache/prefix_cache.h).
#include <xxhash.h>

#include <string>

#include "kvcache/error.h"
#include "kvcache/prefix_cache.h"

namespace kvcache {

std::uint64_t default_block_hash(std::uint64_t parent, std::span<const std::uint32_t> tokens,
                                 std::uint64_t extra_key) {
  // Seed mixes parent and extra key; XXH3 over the token bytes.
  const std::uint64_t seed = parent ^ (extra_key * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL);
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), seed);
}

std::string_view policy_name(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::lru:
      return "lru";
    case EvictionPolicyKind::s3fifo:
      return "s3fifo";
    case EvictionPolicyKind::tiered:
      return "tiered";
    case EvictionPolicyKind::interval:
      return "interval";
    case EvictionPolicyKind::adaptive:
      return "adaptive";
  }
  return "?";
}

EvictionPolicyKind parse_policy(std::string_view name) {
  if (name == "lru") return EvictionPolicyKind::lru;
  if (name == "s3fifo") return EvictionPolicyKind::s3fifo;
  if (name == "tiered") return EvictionPolicyKind::tiered;
  if (name == "interval") return EvictionPolicyKind::interval;
  if (name == "adaptive") return EvictionPolicyKind::adaptive;
  throw InvalidArgument("unknown eviction policy '" + std::string(name) +
                        "' (known: lru, s3fifo, tiered, interval, adaptive)");
}

std::string_view reuse_hint_name(ReuseHint hint) {
  switch (hint) {
    case ReuseHint::unknown:
      return "unknown";
    case ReuseHint::unlikely:
      return "unlikely";
    case ReuseHint::likely:
      return "likely";
  }
  return "?";
}

ReuseHint parse_reuse_hint(std::string_view name) {
  if (name == "unknown") return ReuseHint::unknown;
  if (name == "unlikely") return ReuseHint::unlikely;
  if (name == "likely") return ReuseHint::likely;
  throw InvalidArgument("unknown reuse hint '" + std::string(name) +
                        "' (known: unknown, unlikely, likely)");
}

}  // namespace kvcache
