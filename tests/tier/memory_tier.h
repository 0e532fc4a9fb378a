// A Tier in a std::unordered_map, honouring kvcache/tier.h's contract: the
// reference tier of the manager's tests (and of the tier contract tests).
//
// Each value keeps a PageHeader (fingerprint digest, key, token count, page
// bytes, XXH3-64 checksum over the header with checksum 0, the token ids and
// the page bytes), the token ids and the bytes. A load verifies the header
// and the tokens (mismatch) and the checksum (corrupt: the value is dropped).
//
// Completion: `synchronous` (default) finishes every store / load inside the
// call; otherwise they wait in a queue until complete_all() (callable from
// any thread) performs them in order and finishes their tickets. Faults on
// demand: fail_loads(n) fails the next n loaded pages (I/O error),
// corrupt(key) damages a held value's bytes, drop(key) forgets a value,
// set_enabled(false) disables the tier. capacity_pages bounds the pages held
// (oldest stored first out; take_evicted reports them). Thread-safe (one
// mutex, and the eviction log's own).
#pragma once

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcache/error.h"
#include "kvcache/tier.h"
#include "tier/eviction_log.h"
#include "tier/ticket_state.h"

namespace kvcache::testing {

class MemoryTier final : public Tier {
 public:
  struct Options {
    std::string name = "host";
    bool synchronous = true;
    std::size_t capacity_pages = SIZE_MAX;
  };

  MemoryTier(TierFingerprint fingerprint, Options options)
      : fp_(std::move(fingerprint)),
        opt_(std::move(options)),
        digest_(fp_.digest()),
        synchronous_(opt_.synchronous) {}
  explicit MemoryTier(TierFingerprint fingerprint)
      : MemoryTier(std::move(fingerprint), Options{}) {}
  ~MemoryTier() override { complete_all_from_now_on(); }

  std::string_view name() const override { return opt_.name; }
  const TierFingerprint& fingerprint() const override { return fp_; }
  bool enabled() const override {
    std::lock_guard lock(mu_);
    return enabled_;
  }

  std::vector<std::uint8_t> contains(std::span<const PageKey> keys) override {
    std::lock_guard lock(mu_);
    std::vector<std::uint8_t> out(keys.size(), 0);
    for (std::size_t i = 0; i < keys.size(); ++i) out[i] = enabled_ && values_.count(keys[i]) != 0;
    stats_.lookups += keys.size();
    for (std::uint8_t h : out) stats_.hits += h;
    return out;
  }

  TierTicket store(std::span<const PageWrite> pages) override {
    for (const PageWrite& w : pages) check_sizes(w.token_ids.size(), w.bytes.size());
    auto state = TierTicket::State::for_stores(pages.size());
    std::vector<Op> ops;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      ops.push_back([this, state, i, w = pages[i]] { state->finish_store(i, do_store(w)); });
    }
    enqueue(std::move(ops));
    return TierTicket(state);
  }

  TierTicket load(std::span<const PageRead> pages) override {
    for (const PageRead& r : pages) check_sizes(r.token_ids.size(), r.bytes.size());
    auto state = TierTicket::State::for_loads(pages.size());
    std::vector<Op> ops;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      ops.push_back([this, state, i, r = pages[i]] { state->finish_load(i, do_load(r)); });
    }
    enqueue(std::move(ops));
    return TierTicket(state);
  }

  TierStats stats() const override {
    std::lock_guard lock(mu_);
    TierStats s = stats_;
    s.pages_held = values_.size();
    s.bytes_held = values_.size() * fp_.page_bytes();
    s.capacity_bytes =
        opt_.capacity_pages == SIZE_MAX ? UINT64_MAX : opt_.capacity_pages * fp_.page_bytes();
    s.enabled = enabled_;
    return s;
  }

  void take_evicted(std::vector<PageKey>& out) override { evicted_.take(out); }

  // ---- test controls
  // Performs every queued store and load, in order; returns how many.
  std::size_t complete_all() {
    std::deque<Op> ops;
    {
      std::lock_guard lock(mu_);
      ops.swap(queue_);
    }
    for (Op& op : ops) op();
    return ops.size();
  }
  // complete_all(), and from then on every store / load finishes inside
  // its call (a test's last step before the manager's destructor, which
  // hands the tier what is still staged and waits for it).
  void complete_all_from_now_on() {
    {
      std::lock_guard lock(mu_);
      synchronous_ = true;
    }
    complete_all();
  }
  std::size_t queued() const {
    std::lock_guard lock(mu_);
    return queue_.size();
  }
  void fail_loads(std::size_t n) {
    std::lock_guard lock(mu_);
    fail_loads_ = n;
  }
  bool corrupt(const PageKey& key) {
    std::lock_guard lock(mu_);
    auto it = values_.find(key);
    if (it == values_.end()) return false;
    it->second.bytes[it->second.bytes.size() / 2] ^= std::byte{0x5a};
    return true;
  }
  bool drop(const PageKey& key) {
    std::lock_guard lock(mu_);
    return values_.erase(key) != 0;
  }
  void set_enabled(bool on) {
    std::lock_guard lock(mu_);
    enabled_ = on;
  }
  std::vector<PageKey> keys() const {
    std::lock_guard lock(mu_);
    std::vector<PageKey> out;
    for (const auto& [k, v] : values_) out.push_back(k);
    return out;
  }

 private:
  using Op = std::function<void()>;
  struct KeyHash {
    std::size_t operator()(const PageKey& k) const { return k.hi ^ (k.lo * 0x9e3779b97f4a7c15ull); }
  };
  struct Value {
    PageHeader header;
    std::vector<std::uint32_t> tokens;
    std::vector<std::byte> bytes;
  };

  void check_sizes(std::size_t tokens, std::size_t bytes) const {
    if (tokens != fp_.page_size || bytes != fp_.page_bytes()) {
      throw InvalidArgument("memory tier: a page of " + std::to_string(tokens) + " tokens and " +
                            std::to_string(bytes) + " bytes; this tier's are " +
                            std::to_string(fp_.page_size) + " and " +
                            std::to_string(fp_.page_bytes()));
    }
  }
  void enqueue(std::vector<Op> ops) {
    {
      std::lock_guard lock(mu_);
      if (!synchronous_) {
        for (Op& op : ops) queue_.push_back(std::move(op));
        return;
      }
    }
    for (Op& op : ops) op();
  }

  static std::uint64_t checksum(const Value& v) {
    PageHeader h = v.header;
    h.checksum = 0;
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    XXH3_64bits_update(&state, &h, sizeof h);
    XXH3_64bits_update(&state, v.tokens.data(), v.tokens.size() * sizeof(std::uint32_t));
    XXH3_64bits_update(&state, v.bytes.data(), v.bytes.size());
    return XXH3_64bits_digest(&state);
  }

  StoreResult do_store(const PageWrite& w) {
    std::lock_guard lock(mu_);
    if (!enabled_) return StoreResult::failed;
    if (values_.count(w.key) != 0) return StoreResult::present;
    if (opt_.capacity_pages == 0) {
      ++stats_.rejected;
      return StoreResult::rejected;
    }
    while (values_.size() >= opt_.capacity_pages) {
      values_.erase(order_.front());
      evicted_.record(order_.front());
      order_.pop_front();
      ++stats_.evictions;
    }
    Value v;
    v.header.fingerprint = digest_;
    v.header.key = w.key;
    v.header.num_tokens = static_cast<std::uint32_t>(w.token_ids.size());
    v.header.page_bytes = w.bytes.size();
    v.tokens.assign(w.token_ids.begin(), w.token_ids.end());
    v.bytes.assign(w.bytes.begin(), w.bytes.end());
    v.header.checksum = checksum(v);
    values_.emplace(w.key, std::move(v));
    order_.push_back(w.key);
    ++stats_.pages_stored;
    stats_.bytes_stored += w.bytes.size();
    return StoreResult::stored;
  }

  LoadResult do_load(const PageRead& r) {
    const auto start = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    if (fail_loads_ > 0) {
      --fail_loads_;
      ++stats_.io_errors;
      return LoadResult::failed;
    }
    auto it = enabled_ ? values_.find(r.key) : values_.end();
    if (it == values_.end()) return LoadResult::missing;
    const Value& v = it->second;
    if (v.header.magic != PageHeader::kMagic || v.header.fingerprint != digest_ ||
        !(v.header.key == r.key) ||
        !std::equal(r.token_ids.begin(), r.token_ids.end(), v.tokens.begin(), v.tokens.end())) {
      return LoadResult::mismatch;
    }
    if (checksum(v) != v.header.checksum) {
      ++stats_.corrupt;
      values_.erase(it);
      std::erase(order_, r.key);
      return LoadResult::corrupt;
    }
    std::memcpy(r.bytes.data(), v.bytes.data(), v.bytes.size());
    ++stats_.pages_loaded;
    stats_.bytes_loaded += v.bytes.size();
    stats_.load_nanoseconds +=
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now() - start)
                                       .count());
    return LoadResult::loaded;
  }

  const TierFingerprint fp_;
  const Options opt_;
  const std::uint64_t digest_;
  bool synchronous_;  // under mu_
  mutable std::mutex mu_;
  std::unordered_map<PageKey, Value, KeyHash> values_;
  std::deque<PageKey> order_;  // store order: the oldest goes first when full
  std::deque<Op> queue_;       // deferred mode
  TierStats stats_;
  tier::EvictionLog evicted_;
  std::size_t fail_loads_ = 0;
  bool enabled_ = true;
};

}  // namespace kvcache::testing
