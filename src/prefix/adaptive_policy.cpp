#include "prefix/adaptive_policy.h"

#include <algorithm>

namespace kvcache::prefix {

AdaptivePolicy::AdaptivePolicy(std::uint32_t n, std::uint32_t ghost)
    : lru_(n),
      tiered_(n, ghost),
      hash_(n, 0),
      shadow_lru_(n, LruPolicy(n)),
      shadow_tiered_(n, TieredPolicy(n, ghost)),
      window_(std::uint64_t{kWindowPools} * std::max<std::uint32_t>(n, 1)) {}

std::uint64_t AdaptivePolicy::bytes(std::uint32_t n, std::uint32_t ghost) {
  const std::uint64_t lru = LruPolicy::bytes(n), tiered = TieredPolicy::bytes(n, ghost);
  return 2 * (lru + tiered + ShadowCache<LruPolicy>::bytes(n)) +
         std::uint64_t{n} * sizeof(std::uint64_t);
}

void AdaptivePolicy::observe(std::uint64_t hash, bool extension) {
  lru_hits_ += shadow_lru_.access(hash, extension);
  tiered_hits_ += shadow_tiered_.access(hash, extension);
  if (++uses_ == window_) {
    uses_ = 0;
    lru_hits_ /= 2;
    tiered_hits_ /= 2;
  }
}

void AdaptivePolicy::on_publish(std::uint32_t page, std::uint64_t hash, bool extension) {
  hash_[page] = hash;
  lru_.on_publish(page, hash, extension);
  tiered_.on_publish(page, hash, extension);
  observe(hash, extension);
}

void AdaptivePolicy::on_hit(std::uint32_t page) {
  lru_.on_hit(page);
  tiered_.on_hit(page);
  observe(hash_[page], false);
}

void AdaptivePolicy::insert(std::uint32_t page, ReuseHint hint) {
  lru_.insert(page, hint);
  tiered_.insert(page, hint);
  shadow_lru_.release(hash_[page], hint);
  shadow_tiered_.release(hash_[page], hint);
}

void AdaptivePolicy::erase(std::uint32_t page) {
  lru_.erase(page);
  tiered_.erase(page);
}

bool AdaptivePolicy::following_tiered() const {
  const double lead = static_cast<double>(tiered_hits_) - static_cast<double>(lru_hits_);
  return lead > 0 && lead * lead > static_cast<double>(tiered_hits_ + lru_hits_);
}

std::uint32_t AdaptivePolicy::evict() {
  if (following_tiered()) {
    const std::uint32_t page = tiered_.evict();
    lru_.erase(page);
    return page;
  }
  const std::uint32_t page = lru_.evict();
  tiered_.forget(page);
  return page;
}

void AdaptivePolicy::on_unpublish(std::uint32_t page) {
  shadow_lru_.release(hash_[page], ReuseHint::unknown);
  shadow_tiered_.release(hash_[page], ReuseHint::unknown);
}

}  // namespace kvcache::prefix
