#include "prefix/eviction_policy.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "kvcache/error.h"
#include "prefix/adaptive_policy.h"
#include "prefix/basic_policies.h"
#include "prefix/page_index.h"

namespace kvcache::prefix {

PageLists::PageLists(std::uint32_t num_pages, std::uint8_t num_lists)
    : nil_(num_pages),
      prev_(num_pages, num_pages),
      next_(num_pages, num_pages),
      tag_(num_pages, kNone),
      lists_(num_lists, List{num_pages, num_pages, 0}) {}

void PageLists::push_back(std::uint8_t list, std::uint32_t page) {
  List& l = lists_[list];
  prev_[page] = l.tail;
  next_[page] = nil_;
  if (l.tail != nil_)
    next_[l.tail] = page;
  else
    l.head = page;
  l.tail = page;
  ++l.size;
  tag_[page] = list;
}

void PageLists::remove(std::uint32_t page) {
  List& l = lists_[tag_[page]];
  const std::uint32_t p = prev_[page], n = next_[page];
  if (p != nil_)
    next_[p] = n;
  else
    l.head = n;
  if (n != nil_)
    prev_[n] = p;
  else
    l.tail = p;
  --l.size;
  tag_[page] = kNone;
}

std::uint32_t PageLists::pop_front(std::uint8_t list) {
  const std::uint32_t page = lists_[list].head;
  remove(page);
  return page;
}

namespace {

// S3-FIFO (Yang et al., SOSP'23) adapted to pages that leave the queues while
// in use: a page that was never reused waits in the small probation FIFO; a
// page reused at least once (or re-published soon after its eviction, as the
// ghost FIFO of evicted hashes tells) lives in the main FIFO, where each hit
// buys a second chance (frequency saturates at 3). The small FIFO is evicted
// from while it holds more than small_fraction of the pool.
class S3FifoPolicy final : public EvictionPolicy {
 public:
  S3FifoPolicy(std::uint32_t n, double small_fraction, std::uint32_t ghost)
      : lists_(n, 2),
        freq_(n, 0),
        main_(n, 0),
        hash_(n, 0),
        small_target_(static_cast<std::uint32_t>(std::ceil(small_fraction * n))),
        ghost_ring_(std::max<std::uint32_t>(ghost, 1), 0),
        ghost_index_(std::max<std::uint32_t>(ghost, 1)) {}
  static std::uint64_t bytes(std::uint32_t n, std::uint32_t ghost) {
    const std::uint32_t g = std::max<std::uint32_t>(ghost, 1);
    return PageLists::bytes_for(n, 2) + std::uint64_t{n} * (2 + sizeof(std::uint64_t)) +
           std::uint64_t{g} * sizeof(std::uint64_t) + PageIndex::bytes_for(g);
  }

  void on_publish(std::uint32_t page, std::uint64_t hash, bool) override {
    freq_[page] = 0;
    hash_[page] = hash;
    main_[page] = ghost_index_.find(hash).has_value() ? 1 : 0;
  }
  void on_hit(std::uint32_t page) override {
    freq_[page] = static_cast<std::uint8_t>(std::min(3, freq_[page] + 1));
  }
  void insert(std::uint32_t page, ReuseHint) override {
    if (freq_[page] > 0) main_[page] = 1;
    lists_.push_back(main_[page] ? kMain : kSmall, page);
  }
  void erase(std::uint32_t page) override { lists_.remove(page); }
  std::uint32_t size() const override { return lists_.size(kSmall) + lists_.size(kMain); }
  bool contains(std::uint32_t page) const override {
    return lists_.list_of(page) != PageLists::kNone;
  }

  std::uint32_t evict() override {
    for (;;) {
      if (lists_.size(kMain) == 0 || lists_.size(kSmall) > small_target_) {
        const std::uint32_t page = lists_.pop_front(kSmall);
        if (freq_[page] > 0) {  // reused while on probation: promote
          freq_[page] = 0;
          main_[page] = 1;
          lists_.push_back(kMain, page);
          continue;
        }
        remember(hash_[page]);
        return page;
      }
      const std::uint32_t page = lists_.pop_front(kMain);
      if (freq_[page] > 0) {  // second chance
        --freq_[page];
        lists_.push_back(kMain, page);
        continue;
      }
      return page;
    }
  }

 private:
  static constexpr std::uint8_t kSmall = 0, kMain = 1;

  // Ghost FIFO: the hashes of the last n pages evicted from probation.
  void remember(std::uint64_t hash) {
    if (ghost_index_.find(hash)) return;
    if (ghost_size_ == ghost_ring_.size()) {
      ghost_index_.erase(ghost_ring_[ghost_head_]);
      ghost_head_ = (ghost_head_ + 1) % ghost_ring_.size();
      --ghost_size_;
    }
    const std::size_t slot = (ghost_head_ + ghost_size_) % ghost_ring_.size();
    ghost_ring_[slot] = hash;
    ghost_index_.insert(hash, static_cast<std::uint32_t>(slot));
    ++ghost_size_;
  }

  PageLists lists_;
  std::vector<std::uint8_t> freq_, main_;
  std::vector<std::uint64_t> hash_;
  std::uint32_t small_target_;
  std::vector<std::uint64_t> ghost_ring_;
  std::size_t ghost_head_ = 0, ghost_size_ = 0;
  PageIndex ghost_index_;
};

// Inter-arrival ("interval"): predicts how soon a page's content will be used
// again from that content's own history and evicts the page whose next use
// looks farthest away.
//
// Clock: pages released into the evictable set so far (page traffic, so ages
// compare with the pool size whatever the request sizes). Per content hash
// the policy keeps first use, last use and the number of uses (publish or
// prefix hit: one per request); the stats of published pages live in
// per-page arrays, those of evicted pages in a ghost FIFO of
// ghost_factor x pool hashes, so content that comes back resumes its history.
// Predicted interval g: the mean gap (last - first) / (uses - 1) for content
// used at least twice; content used once gets kFreshIntervals x pool pages
// (a first reuse is rare within a pool's worth of traffic, and far away:
// such pages go before any page with a short measured interval).
// Eviction score = 2 x age + g, age = clock ticks since the page became
// evictable: a page overdue relative to its own interval goes first. Pages
// wait in LRU lists by bucket floor(log2(g + 1)) (g rounded down to a power
// of two); the oldest page of a list has its largest score, so evict()
// compares only the list heads: O(kBuckets). Pages are released tail first
// and an ancestor is used whenever its descendants are, so descendants score
// at least as high as their ancestors and chains are trimmed from the tail.
class IntervalPolicy final : public EvictionPolicy {
 public:
  static constexpr std::uint8_t kBuckets = 48;
  static constexpr std::uint32_t kFreshIntervals = 64;

  IntervalPolicy(std::uint32_t n, std::uint32_t ghost)
      : lists_(n, kBuckets),
        hash_(n, 0),
        stats_(n),
        since_(n, 0),
        fresh_gap_(std::uint64_t{kFreshIntervals} * std::max<std::uint32_t>(n, 1)),
        ghost_(std::max<std::uint32_t>(ghost, 1)),
        ghost_index_(std::max<std::uint32_t>(ghost, 1)) {}
  static std::uint64_t bytes(std::uint32_t n, std::uint32_t ghost) {
    const std::uint32_t g = std::max<std::uint32_t>(ghost, 1);
    return PageLists::bytes_for(n, kBuckets) +
           std::uint64_t{n} * (2 * sizeof(std::uint64_t) + sizeof(Stats)) +
           std::uint64_t{g} * sizeof(GhostEntry) + PageIndex::bytes_for(g);
  }

  void on_publish(std::uint32_t page, std::uint64_t hash, bool) override {
    hash_[page] = hash;
    const auto slot = ghost_index_.find(hash);
    stats_[page] = slot ? ghost_[*slot].stats : Stats{clock_, clock_, 0};
    use(page);
  }
  void on_hit(std::uint32_t page) override { use(page); }
  void insert(std::uint32_t page, ReuseHint) override {
    since_[page] = clock_++;
    lists_.push_back(bucket(interval(stats_[page])), page);
    ++size_;
  }
  void erase(std::uint32_t page) override {
    lists_.remove(page);
    --size_;
  }
  std::uint32_t evict() override {
    std::uint8_t best = 0;
    std::uint64_t best_score = 0;
    for (std::uint8_t b = kBuckets; b-- > 0;) {
      if (lists_.size(b) == 0) continue;
      const std::uint64_t score = 2 * (clock_ - since_[lists_.front(b)]) + (std::uint64_t{1} << b);
      if (score > best_score) best = b, best_score = score;
    }
    const std::uint32_t page = lists_.pop_front(best);
    --size_;
    remember(hash_[page], stats_[page]);
    return page;
  }
  std::uint32_t size() const override { return size_; }
  bool contains(std::uint32_t page) const override {
    return lists_.list_of(page) != PageLists::kNone;
  }

 private:
  struct Stats {
    std::uint64_t first, last;
    std::uint32_t uses;
  };
  struct GhostEntry {
    std::uint64_t hash = 0;
    Stats stats{0, 0, 0};
  };

  void use(std::uint32_t page) {
    Stats& s = stats_[page];
    s.last = clock_;
    if (s.uses < UINT32_MAX) ++s.uses;
  }
  std::uint64_t interval(const Stats& s) const {
    return s.uses < 2 ? fresh_gap_ : (s.last - s.first) / (s.uses - 1);
  }
  static std::uint8_t bucket(std::uint64_t gap) {
    const int b = std::bit_width(gap + 1) - 1;  // floor(log2(gap + 1)); gap < 2^64 - 1
    return static_cast<std::uint8_t>(std::min<int>(b, kBuckets - 1));
  }
  // Ghost FIFO of evicted contents' stats; a hash already there is updated in place.
  void remember(std::uint64_t hash, const Stats& stats) {
    if (const auto slot = ghost_index_.find(hash)) {
      ghost_[*slot].stats = stats;
      return;
    }
    if (ghost_size_ == ghost_.size()) {
      ghost_index_.erase(ghost_[ghost_head_].hash);
      ghost_head_ = (ghost_head_ + 1) % ghost_.size();
      --ghost_size_;
    }
    const std::size_t slot = (ghost_head_ + ghost_size_) % ghost_.size();
    ghost_[slot] = GhostEntry{hash, stats};
    ghost_index_.insert(hash, static_cast<std::uint32_t>(slot));
    ++ghost_size_;
  }

  PageLists lists_;
  std::vector<std::uint64_t> hash_;
  std::vector<Stats> stats_;
  std::vector<std::uint64_t> since_;
  std::uint64_t clock_ = 0;
  std::uint32_t size_ = 0;
  std::uint64_t fresh_gap_;
  std::vector<GhostEntry> ghost_;
  std::size_t ghost_head_ = 0, ghost_size_ = 0;
  PageIndex ghost_index_;
};

}  // namespace

std::uint32_t ghost_length(const PrefixCacheConfig& config, std::uint32_t num_pages) {
  return static_cast<std::uint32_t>(
      std::min<double>(config.ghost_factor * num_pages, kMaxGhostEntries));
}

namespace {

// Every field is checked whichever policy reads it: a value out of range is
// a mistake even where the chosen policy ignores it.
void validate(const PrefixCacheConfig& config) {
  if (!(config.ghost_factor >= 0.0 && config.ghost_factor <= 64.0)) {
    throw InvalidArgument("ghost_factor " + std::to_string(config.ghost_factor) +
                          " must lie in [0, 64]");
  }
  if (!(config.s3fifo_small_fraction > 0.0 && config.s3fifo_small_fraction < 1.0)) {
    throw InvalidArgument("s3fifo_small_fraction " + std::to_string(config.s3fifo_small_fraction) +
                          " must lie in (0, 1)");
  }
}
}  // namespace

std::unique_ptr<EvictionPolicy> make_policy(const PrefixCacheConfig& config,
                                            std::uint32_t num_pages) {
  validate(config);
  switch (config.policy) {
    case EvictionPolicyKind::lru:
      return std::make_unique<LruPolicy>(num_pages);
    case EvictionPolicyKind::tiered:
      return std::make_unique<TieredPolicy>(num_pages, ghost_length(config, num_pages));
    case EvictionPolicyKind::interval:
      return std::make_unique<IntervalPolicy>(num_pages, ghost_length(config, num_pages));
    case EvictionPolicyKind::s3fifo:
      return std::make_unique<S3FifoPolicy>(num_pages, config.s3fifo_small_fraction,
                                            ghost_length(config, num_pages));
    case EvictionPolicyKind::adaptive:
      return std::make_unique<AdaptivePolicy>(num_pages, ghost_length(config, num_pages));
  }
  throw InvalidArgument("unknown eviction policy " +
                        std::to_string(static_cast<int>(config.policy)));
}

std::uint64_t policy_bytes(const PrefixCacheConfig& config, std::uint32_t num_pages) {
  validate(config);
  const std::uint32_t ghost = ghost_length(config, num_pages);
  switch (config.policy) {
    case EvictionPolicyKind::lru:
      return LruPolicy::bytes(num_pages);
    case EvictionPolicyKind::tiered:
      return TieredPolicy::bytes(num_pages, ghost);
    case EvictionPolicyKind::interval:
      return IntervalPolicy::bytes(num_pages, ghost);
    case EvictionPolicyKind::s3fifo:
      return S3FifoPolicy::bytes(num_pages, ghost);
    case EvictionPolicyKind::adaptive:
      return AdaptivePolicy::bytes(num_pages, ghost);
  }
  throw InvalidArgument("unknown eviction policy " +
                        std::to_string(static_cast<int>(config.policy)));
}

}  // namespace kvcache::prefix
