#include "prefix/prefix_store.h"

#include <algorithm>
#include <string>

#include "kvcache/error.h"

namespace kvcache::prefix {

namespace {
std::string str(std::uint64_t v) { return std::to_string(v); }
}  // namespace

PrefixStore::PrefixStore(memory::BlockPool& pool, std::uint32_t page_size, PrefixCacheConfig config)
    : pool_(pool),
      page_size_(page_size),
      config_(std::move(config)),
      index_(pool.num_blocks()),
      meta_(pool.num_blocks()),
      page_tokens_(std::size_t{pool.num_blocks()} * page_size) {
  if (!config_.hash) config_.hash = default_block_hash;
  policy_ = make_policy(config_, pool.num_blocks());
}

std::uint64_t PrefixStore::bytes_for(std::uint32_t num_pages, std::uint32_t page_size,
                                     const PrefixCacheConfig& config) {
  const std::uint64_t n = num_pages;
  return n * sizeof(PageMeta) + n * page_size * sizeof(std::uint32_t) +
         PageIndex::bytes_for(num_pages) + policy_bytes(config, num_pages);
}

void PrefixStore::emit(PageEvent::Kind kind, std::uint32_t page) const noexcept {
  if (!config_.on_event) return;
  const PageMeta& m = meta_[page];
  config_.on_event(PageEvent{kind, page, m.hash, m.parent_hash, m.extra_key, stored_tokens(page),
                             "device", m.key});
}

void PrefixStore::make_evictable(std::uint32_t page, ReuseHint hint) {
  if (meta_[page].pin > 0) {
    pinned_.emplace(meta_[page].pin, page);
  } else {
    policy_->insert(page, hint);
  }
}

void PrefixStore::make_unevictable(std::uint32_t page) {
  if (meta_[page].pin > 0) {
    pinned_.erase({meta_[page].pin, page});
  } else {
    policy_->erase(page);
  }
}

void PrefixStore::walk(std::span<const std::uint32_t> tokens, std::uint64_t extra_key,
                       std::uint32_t max_pages, std::vector<Match>& out) const {
  std::uint64_t parent_hash = 0;
  std::uint32_t parent = num_pages();
  for (std::uint32_t j = 0; j < max_pages; ++j) {
    const auto page_tokens_j = tokens.subspan(std::size_t{j} * page_size_, page_size_);
    const std::uint64_t h = hash(parent_hash, page_tokens_j, extra_key);
    const auto found = index_.find(h);
    if (!found) return;
    const PageMeta& m = meta_[*found];
    const bool same_parent =
        m.parent == parent && (parent == num_pages() || m.parent_gen == meta_[parent].gen);
    if (!same_parent || m.extra_key != extra_key || m.parent_hash != parent_hash ||
        !std::equal(page_tokens_j.begin(), page_tokens_j.end(), stored_tokens(*found).begin())) {
      return;  // hash collision: never trust it
    }
    out.push_back({*found, h});
    parent_hash = h;
    parent = *found;
  }
}

bool PrefixStore::publish(std::uint32_t page, std::uint32_t parent, std::uint64_t hash,
                          std::uint64_t parent_hash, std::uint64_t extra_key,
                          std::span<const std::uint32_t> tokens, bool extension, PageKey key) {
  if (!index_.insert(hash, page)) return false;  // duplicate content or a collision: stays private
  PageMeta& m = meta_[page];
  m.hash = hash;
  m.parent_hash = parent_hash;
  m.extra_key = extra_key;
  m.parent = parent;
  m.parent_gen = parent == num_pages() ? 0 : meta_[parent].gen;
  m.pin = 0;
  m.published = true;
  m.reused = false;
  m.key = key;
  std::copy(tokens.begin(), tokens.end(), page_tokens_.begin() + std::size_t{page} * page_size_);
  policy_->on_publish(page, hash, extension);
  ++counters_.pages_published;
  emit(PageEvent::Kind::stored, page);
  return true;
}

void PrefixStore::unpublish(std::uint32_t page) {
  emit(PageEvent::Kind::removed, page);
  policy_->on_unpublish(page);
  PageMeta& m = meta_[page];
  index_.erase(m.hash);
  if (m.pin > 0) --num_pinned_;
  m.published = false;
  m.pin = 0;
  ++m.gen;
}

std::uint32_t PrefixStore::take_page() {
  if (pool_.num_free() > 0) return pool_.allocate();
  std::uint32_t page;
  if (policy_->size() > 0) {
    page = policy_->evict();
  } else {
    page = pinned_.begin()->second;
    pinned_.erase(pinned_.begin());
  }
  if (evict_hook_) evict_hook_(page);
  unpublish(page);
  ++counters_.evictions;
  pool_.retain(page);  // 0 -> 1
  return page;
}

void PrefixStore::drop_ref(std::uint32_t page, ReuseHint hint) {
  if (meta_[page].published) {
    if (pool_.unref(page) == 0) make_evictable(page, hint);
  } else {
    pool_.release(page);
  }
}

void PrefixStore::attach(std::uint32_t page) {
  if (pool_.ref_count(page) == 0) make_unevictable(page);
  pool_.retain(page);
  meta_[page].reused = true;
  policy_->on_hit(page);
}

void PrefixStore::set_pin(std::uint32_t page, std::uint32_t priority) {
  const bool evictable = pool_.ref_count(page) == 0;
  if (evictable) make_unevictable(page);
  PageMeta& m = meta_[page];
  num_pinned_ += (priority > 0) - (m.pin > 0);
  m.pin = priority;
  if (evictable) make_evictable(page);
}

void PrefixStore::reset() {
  for (std::uint32_t page = 0; page < num_pages(); ++page) {
    if (!meta_[page].published) continue;
    const bool evictable = pool_.ref_count(page) == 0;
    if (evictable) make_unevictable(page);
    unpublish(page);
    if (evictable) pool_.free_unreferenced(page);
  }
}

void PrefixStore::snapshot(ManagerSnapshot& snap) const {
  for (std::uint32_t p = 0; p < num_pages(); ++p) {
    if (!meta_[p].published) continue;
    snap.cached_blocks.push_back(p);
    snap.cached_priorities.push_back(meta_[p].pin);
  }
}

void PrefixStore::check(std::span<const std::uint32_t> refs,
                        std::span<const std::uint8_t> on_free_list) const {
  std::uint32_t cached = 0, pinned = 0, published = 0;
  for (std::uint32_t p = 0; p < num_pages(); ++p) {
    const PageMeta& m = meta_[p];
    if (!m.published) continue;
    if (on_free_list[p]) throw Error("page " + str(p) + " is both free and cached");
    ++published;
    pinned += m.pin > 0;
    const auto found = index_.find(m.hash);
    if (!found || *found != p)
      throw Error("published page " + str(p) + " is not indexed under its hash");
    if (hash(m.parent_hash, stored_tokens(p), m.extra_key) != m.hash) {
      throw Error("page " + str(p) + " hash does not match its stored tokens");
    }
    const bool in_policy = policy_->contains(p);
    const bool in_pinned = pinned_.count({m.pin, p}) != 0;
    if (refs[p] == 0 && (m.pin > 0 ? !in_pinned || in_policy : !in_policy || in_pinned)) {
      throw Error("cached page " + str(p) + " is not evictable exactly once");
    }
    if (refs[p] != 0 && (in_policy || in_pinned))
      throw Error("page " + str(p) + " is in use and evictable");
    cached += refs[p] == 0;
  }
  if (index_.size() != published) {
    throw Error("hash index holds " + str(index_.size()) + " entries for " + str(published) +
                " published pages");
  }
  index_.for_each([&](std::uint64_t, std::uint32_t p) {
    if (p >= num_pages() || !meta_[p].published)
      throw Error("hash index maps to invalid page " + str(p));
  });
  if (num_evictable() != cached) {
    throw Error("evictable set holds " + str(num_evictable()) + " pages, " + str(cached) +
                " are cached with ref 0");
  }
  if (pinned != num_pinned_) throw Error("pinned page count is off");
}

}  // namespace kvcache::prefix
