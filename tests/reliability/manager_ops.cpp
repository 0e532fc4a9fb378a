#include "reliability/manager_ops.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kvcache/kvcache.h"
#include "tier/memory_tier.h"

namespace kvcache::testing {
namespace {

constexpr std::uint32_t kLayers = 2, kHeads = 1, kDim = 2, kMaxSeq = 48, kMaxBatch = 6;

[[noreturn]] void fail(const std::string& what) { throw std::logic_error("manager_ops: " + what); }

// Value stored for token `pos` of a sequence whose token ids are `tokens`: a
// function of the whole prefix tokens[0..pos] (so a page shared through the
// prefix cache or a fork holds the same values), never zero, exact in float.
float pattern(const std::vector<std::uint32_t>& tokens, std::uint32_t pos, std::uint32_t layer,
              std::uint32_t kv, std::uint32_t d) {
  std::uint32_t h = 2166136261u;
  for (std::uint32_t i = 0; i <= pos; ++i) h = (h ^ tokens[i]) * 16777619u;
  return 1.0f + static_cast<float>(((h >> 8) & 0xfffffu) * 16 + layer * 4 + kv * 2 + d);
}

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::uint8_t> b) : b_(b) {}
  bool done() const { return i_ >= b_.size(); }
  std::uint8_t next() { return i_ < b_.size() ? b_[i_++] : 0; }

 private:
  std::span<const std::uint8_t> b_;
  std::size_t i_ = 0;
};

struct ModelSeq {
  std::vector<std::uint32_t> tokens;  // committed token ids; size() is the cache length
  std::vector<std::uint32_t> script;  // the prompt it was matched with: written first
  std::uint32_t loads_from = 0;       // tiers: the first page match_prefix loads
};

// The tier below the fourth manager and what its events said. The event
// callback must not throw: a broken property is kept in `bad` and raised
// after the op.
struct TierWatch {
  std::shared_ptr<MemoryTier> tier;
  std::uint32_t sentinel = 0;  // the pool's page count: the page of a tier eviction event
  std::set<std::pair<std::uint64_t, std::uint64_t>> stored;  // keys a tier event stored
  std::uint64_t evictions = 0;                               // tier evictions reported
  std::string bad;

  void on_event(const PageEvent& e) {
    if (e.medium == "device") return;
    const std::pair key{e.key.hi, e.key.lo};
    if (e.kind == PageEvent::Kind::stored) {
      stored.insert(key);
    } else if (e.page == sentinel) {  // the tier evicted it for room
      ++evictions;
      if (stored.count(key) == 0 && bad.empty()) bad = "a tier evicted a page never stored";
    }
  }
};

class Driver {
 public:
  explicit Driver(std::unique_ptr<KVCacheManager> m, TierWatch* tiers = nullptr)
      : m_(std::move(m)), tiers_(tiers) {
    if (m_->params().enable_prefix_caching) prefix_ = static_cast<PagedKVCacheManager*>(m_.get());
    const KVCacheParams& p = m_->params();
    const std::uint32_t page_size =
        p.cache_strategy == CacheStrategy::paged ? p.page_size : m_->max_seq_len();
    block_elements_ = std::size_t{2} * p.num_layers * page_size * p.n_kv_heads * p.head_dim;
    mirror_.assign(block_elements_ * m_->total_blocks(), 0.0f);
  }

  // A deferred tier must finish its tickets before the manager goes: the
  // manager's destructor waits for them (also when a property broke).
  ~Driver() {
    if (tiers_ != nullptr) tiers_->tier->complete_all();
  }

  void run(ByteReader& in) {
    const std::uint8_t ops = tiers_ != nullptr ? 14 : prefix_ != nullptr ? 11 : 8;
    while (!in.done()) {
      const std::uint8_t op = in.next() % ops;
      const ManagerSnapshot before = m_->snapshot();
      bool threw = false;
      try {
        apply(op, in);
      } catch (const Error&) {
        threw = true;
      }
      if (threw && m_->snapshot() != before)
        fail("a failing op " + std::to_string(op) + " changed state");
      if (tiers_ != nullptr) finish_loads();
      m_->check_invariants();
      verify();
    }
    if (tiers_ != nullptr) drain_tiers();
    for (const auto& [id, s] : model_) m_->release(id);
    if (tiers_ != nullptr) drain_tiers();  // loads of released sequences keep their pages
    m_->check_invariants();
    if (prefix_ != nullptr) prefix_->reset_prefix_cache();  // cached pages go back to the free list
    if (m_->free_blocks() != m_->total_blocks()) fail("blocks leaked after releasing everything");
  }

 private:
  SeqId pick(ByteReader& in) {
    const std::uint8_t x = in.next();
    if (model_.empty() || x >= 224) return x % 4 == 0 ? 1'000'000 + x : released_or(x);
    auto it = model_.begin();
    std::advance(it, x % model_.size());
    return it->first;
  }
  SeqId released_or(std::uint8_t x) {
    return released_.empty() ? 999'999 : released_[x % released_.size()];
  }

  void apply(std::uint8_t op, ByteReader& in) {
    switch (op) {
      case 0:
        claim(in.next() % 4);
        break;
      case 1:
      case 2:
        fetch_and_step(in, false);
        break;
      case 3:
        fetch_and_step(in, true);
        break;
      case 4:
        release(pick(in), in.next());
        break;
      case 5: {  // duplicate ids in one batch
        const SeqId id = pick(in);
        const std::vector<SeqId> ids{id, id};
        m_->fetch(ids, std::vector<std::uint32_t>{1, 1});
        fail("duplicate ids were accepted");
      }
      case 6: {  // absurd size
        const std::vector<SeqId> ids{pick(in)};
        m_->fetch(ids, std::vector<std::uint32_t>{0xffff0000u});
        fail("an absurd fetch was accepted");
      }
      case 8:
        match(in);
        break;
      case 9:
        fork(pick(in));
        break;
      case 10:
        truncate(pick(in), in.next() % 24);
        break;
      case 11:
        prefix_->poll_loads();
        break;
      case 12:
        tier_event(in.next());
        break;
      case 13:
        tiers_->tier->complete_all();  // a deferred tier finishes only when told
        if (in.next() % 2 == 0) {
          prefix_->wait_tiers();
        } else {
          prefix_->wait_loads(pick(in));
        }
        break;
      default: {  // zero steps / empty batch
        const std::vector<SeqId> ids{pick(in)};
        if (in.next() % 2) m_->fetch(ids, std::vector<std::uint32_t>{1}, 0);
        m_->step({}, {});
        fail("empty batch accepted");
      }
    }
  }

  void claim(std::uint32_t n) {
    const auto ids = m_->claim(n);
    for (SeqId id : ids) model_[id] = {};
  }

  // A fresh sequence attaches the cached prefix of one of four shared prompts.
  void match(ByteReader& in) {
    const SeqId id = m_->claim(1)[0];
    model_[id] = {};
    std::vector<std::uint32_t> prompt;
    const std::uint32_t shared = in.next() % 4, len = 1 + in.next() % 30;
    for (std::uint32_t i = 0; i < len; ++i) prompt.push_back(i < 20 ? shared * 100 + i : in.next());
    const std::uint64_t hits_before = prefix_->metrics().reused_tokens;
    const std::uint32_t reused = prefix_->match_prefix(id, prompt);
    if (reused >= prompt.size()) fail("match_prefix left no prompt token to compute");
    model_[id].tokens.assign(prompt.begin(), prompt.begin() + reused);
    model_[id].script = prompt;
    if (tiers_ == nullptr) return;
    // Device hits count at once, loaded pages when their loads finish.
    const std::uint64_t device = prefix_->metrics().reused_tokens - hits_before;
    model_[id].loads_from = static_cast<std::uint32_t>(device / m_->params().page_size);
    if (prefix_->has_pending_loads(id)) {
      loading_.insert(id);
    } else if (device != reused) {
      fail("match_prefix counted loads but none is pending");
    }
  }

  // ---- tiers (the fourth manager)
  // A fault or a completion in the tier.
  void tier_event(std::uint8_t x) {
    MemoryTier& t = *tiers_->tier;
    const std::vector<PageKey> keys = t.keys();
    switch (x % 5) {
      case 0:
      case 1:
        t.complete_all();
        break;
      case 2:
        t.fail_loads(1 + x / 5 % 2);
        break;
      case 3:
        if (!keys.empty()) t.corrupt(keys[x / 5 % keys.size()]);
        break;
      default:
        if (!keys.empty()) t.drop(keys[x / 5 % keys.size()]);
    }
  }

  // Sequences whose loads the manager finished: the model learns how much
  // loaded (a failed page ends the hit there) and, as a pool kept apart
  // would, the mirror receives the loaded pages; verify() then checks their
  // K/V against the prompt's values.
  void finish_loads() {
    if (!tiers_->bad.empty()) fail(tiers_->bad);
    for (auto it = loading_.begin(); it != loading_.end();) {
      const SeqId id = *it;
      if (model_.count(id) != 0 && prefix_->has_pending_loads(id)) {
        const std::uint32_t one = 1;
        try {
          m_->fetch(std::span(&id, 1), std::span(&one, 1));
          fail("a fetch of a sequence with pending loads was accepted");
        } catch (const InvalidArgument&) {
        }
        ++it;
        continue;
      }
      if (model_.count(id) != 0) loaded(id);
      it = loading_.erase(it);
    }
  }

  void loaded(SeqId id) {
    ModelSeq& s = model_.at(id);
    const std::uint32_t length = m_->cache_length(id);
    if (length > s.tokens.size()) fail("finishing loads grew a sequence");
    s.tokens.resize(length);
    const std::uint32_t ps = m_->params().page_size;
    const KVCacheBatch batch = m_->fetch(std::span(&id, 1), std::vector<std::uint32_t>{0});
    const float* pool = static_cast<const float*>(batch.blocks());
    for (std::uint32_t j = s.loads_from; j < length / ps; ++j) {
      const std::size_t block = batch.lookup_table()[j];
      std::copy_n(pool + block * block_elements_, block_elements_,
                  mirror_.begin() + block * block_elements_);
    }
  }

  // Every ticket finished, every load finished, every eviction reported.
  void drain_tiers() {
    tiers_->tier->complete_all();
    prefix_->wait_tiers();
    finish_loads();
    if (tiers_->evictions != tiers_->tier->stats().evictions)
      fail("tier evictions reported " + std::to_string(tiers_->evictions) + " of " +
           std::to_string(tiers_->tier->stats().evictions));
  }

  void fork(SeqId parent) {
    const SeqId child = prefix_->fork(parent);
    model_[child] = model_.at(parent);
  }

  void truncate(SeqId id, std::uint32_t new_length) {
    prefix_->truncate(id, new_length);
    auto& tokens = model_.at(id).tokens;
    if (new_length > tokens.size()) fail("truncate past the length was accepted");
    tokens.resize(new_length);
  }

  // With prefix caching the byte also picks a reuse hint (values past
  // `likely` must throw and change nothing).
  void release(SeqId id, std::uint8_t hint) {
    if (prefix_) {
      prefix_->release(id, static_cast<ReuseHint>(hint % 4));
      if (hint % 4 == 3) fail("a bad reuse hint was accepted");
    } else {
      m_->release(id);
    }
    if (model_.erase(id) == 0) fail("released an id the model does not have");
    released_.push_back(id);
  }

  void fetch_and_step(ByteReader& in, bool multistep) {
    const std::uint32_t n = 1 + in.next() % 3;
    std::vector<SeqId> ids;
    std::vector<std::uint32_t> news;
    for (std::uint32_t i = 0; i < n; ++i) {
      ids.push_back(pick(in));
      news.push_back(in.next() % 20);
    }
    const std::uint32_t steps = multistep ? 1 + in.next() % 3 : 1;
    KVCacheBatch batch = m_->fetch(ids, news, steps);
    // What a caller with its own pool (a GPU's) does after a fetch.
    for (const BlockCopy& c : batch.block_copies()) {
      std::copy_n(mirror_.begin() + c.src * block_elements_, block_elements_,
                  mirror_.begin() + c.dst * block_elements_);
    }
    // Passed validation: every id is known and distinct. Choose the tokens to write.
    std::vector<std::vector<std::uint32_t>> pending(ids.size());
    for (std::size_t b = 0; b < ids.size(); ++b) {
      if (batch.cache_lengths()[b] != model_.at(ids[b]).tokens.size())
        fail("fetch cache_length differs from model");
      const ModelSeq& seq = model_.at(ids[b]);
      pending[b] = seq.tokens;
      for (std::uint32_t i = 0; i < news[b] + steps - 1; ++i) {
        const std::size_t pos = pending[b].size();
        pending[b].push_back(pos < seq.script.size() ? seq.script[pos] : in.next() % 8);
      }
    }
    write(batch, news, pending);
    std::vector<std::uint32_t> valid = news;
    for (std::uint32_t s = 1; s < steps; ++s) {  // multistep decode, one token per step
      std::vector<std::uint32_t> offsets{0};
      for (std::uint32_t v : (s == 1 ? news : std::vector<std::uint32_t>(ids.size(), 1)))
        offsets.push_back(offsets.back() + v);
      batch.increment_cache_lengths(offsets);
      write(batch, std::vector<std::uint32_t>(ids.size(), 1), pending);
      for (auto& v : valid) ++v;
    }
    const std::uint8_t cut = in.next() % 4;  // sometimes commit less than written
    for (auto& v : valid) v = cut == 0 && v > 0 ? v - 1 : v;
    std::vector<std::uint32_t> committed;
    for (std::size_t b = 0; b < ids.size(); ++b) {
      const std::size_t from = model_.at(ids[b]).tokens.size();
      committed.insert(committed.end(), pending[b].begin() + from,
                       pending[b].begin() + from + valid[b]);
    }
    if (prefix_ != nullptr)
      prefix_->step(ids, valid, committed);
    else
      m_->step(ids, valid);
    for (std::size_t b = 0; b < ids.size(); ++b) {
      auto& tokens = model_.at(ids[b]).tokens;
      tokens.assign(pending[b].begin(), pending[b].begin() + tokens.size() + valid[b]);
    }
  }

  void write(const KVCacheBatch& batch, const std::vector<std::uint32_t>& news,
             const std::vector<std::vector<std::uint32_t>>& tokens) {
    auto put = [&](auto coll) {
      for (std::uint32_t l = 0; l < kLayers; ++l) {
        auto k = coll.get_key_cache(l), v = coll.get_value_cache(l);
        for (std::uint32_t b = 0; b < batch.batch_size(); ++b)
          for (std::uint32_t i = 0; i < news[b]; ++i)
            for (std::uint32_t d = 0; d < kDim; ++d) {
              const std::uint32_t pos = coll.cache_length(b) + i;
              *k.ptr(b, 0, pos, d) = pattern(tokens[b], pos, l, 0, d);
              *v.ptr(b, 0, pos, d) = pattern(tokens[b], pos, l, 1, d);
              *mirrored(batch, k.ptr(b, 0, pos, d)) = *k.ptr(b, 0, pos, d);
              *mirrored(batch, v.ptr(b, 0, pos, d)) = *v.ptr(b, 0, pos, d);
            }
      }
    };
    if (batch.strategy() == CacheStrategy::paged)
      put(batch.paged<float>());
    else
      put(batch.continuous<float>());
  }

  void verify() {
    if (model_.empty()) return;
    std::vector<SeqId> ids;
    for (const auto& [id, s] : model_) {
      if (m_->cache_length(id) != s.tokens.size()) fail("cache_length differs from model");
      if (loading_.count(id) == 0) ids.push_back(id);  // pending loads: refused (finish_loads)
    }
    if (ids.empty()) return;
    // A zero-token fetch reserves nothing new: read committed tokens through it.
    KVCacheBatch batch = m_->fetch(ids, std::vector<std::uint32_t>(ids.size(), 0));
    auto check = [&](auto coll) {
      for (std::uint32_t l = 0; l < kLayers; ++l) {
        auto k = coll.get_key_cache(l), v = coll.get_value_cache(l);
        for (std::uint32_t b = 0; b < batch.batch_size(); ++b)
          for (std::uint32_t pos = 0; pos < coll.cache_length(b); ++pos)
            for (std::uint32_t d = 0; d < kDim; ++d)
              if (*k.ptr(b, 0, pos, d) != pattern(model_.at(ids[b]).tokens, pos, l, 0, d) ||
                  *v.ptr(b, 0, pos, d) != pattern(model_.at(ids[b]).tokens, pos, l, 1, d))
                fail("K/V of seq " + std::to_string(ids[b]) + " token " + std::to_string(pos) +
                     " was corrupted");
              else if (*mirrored(batch, k.ptr(b, 0, pos, d)) != *k.ptr(b, 0, pos, d) ||
                       *mirrored(batch, v.ptr(b, 0, pos, d)) != *v.ptr(b, 0, pos, d))
                fail("the mirror pool (writes + block_copies) differs for seq " +
                     std::to_string(ids[b]) + " token " + std::to_string(pos));
      }
    };
    if (batch.strategy() == CacheStrategy::paged)
      check(batch.paged<float>());
    else
      check(batch.continuous<float>());
  }

  // The element of the mirror pool at the same offset as `p` in the manager's.
  float* mirrored(const KVCacheBatch& batch, const float* p) {
    return mirror_.data() + (p - static_cast<const float*>(batch.blocks()));
  }

  std::unique_ptr<KVCacheManager> m_;
  PagedKVCacheManager* prefix_ = nullptr;  // set when prefix caching is on
  // A second pool kept only by this driver's writes and the copies each fetch
  // reports (KVCacheBatch::block_copies), as a GPU pool is.
  std::size_t block_elements_ = 0;
  std::vector<float> mirror_;
  std::map<SeqId, ModelSeq> model_;
  std::vector<SeqId> released_;
  TierWatch* tiers_ = nullptr;  // the fourth manager's tier
  std::set<SeqId> loading_;     // sequences match_prefix left with pending loads
};

KVCacheParams params(CacheStrategy s) {
  KVCacheParams p;
  p.num_layers = kLayers;
  p.n_kv_heads = kHeads;
  p.head_dim = kDim;
  p.cache_strategy = s;
  p.page_size = s == CacheStrategy::paged ? 4 : 0;
  return p;
}

// A prefix-caching manager of 16 pages over a 16-page MemoryTier (completing
// at once, or only when an op tells it to): a pool small enough that pages
// go down and come back.
void run_with_tier(std::span<const std::uint8_t> bytes, bool synchronous,
                   ManagerOpsFigures& figures) {
  KVCacheParams p = params(CacheStrategy::paged);
  p.enable_prefix_caching = true;
  constexpr std::uint32_t kPages = 16;
  TierWatch watch;
  watch.sentinel = kPages;
  watch.tier = std::make_shared<MemoryTier>(
      TierFingerprint::of(p, "ops"),
      MemoryTier::Options{.synchronous = synchronous, .capacity_pages = 16});
  PrefixCacheConfig config;
  config.on_event = [&watch](const PageEvent& e) { watch.on_event(e); };
  config.tiers.tiers = {watch.tier};
  config.tiers.model_id = "ops";
  config.tiers.staging_pages = 6;  // small: some write-backs are dropped
  config.tiers.offload_batch = 1;  // the model expects each call's write-backs at once
  ByteReader in(bytes);
  {
    Driver(std::make_unique<PagedKVCacheManager>(p, kPages, kMaxBatch, kMaxSeq, config), &watch)
        .run(in);
  }
  const TierStats s = watch.tier->stats();
  figures.pages_stored += s.pages_stored;
  figures.pages_loaded += s.pages_loaded;
  figures.tier_evictions += watch.evictions;
  figures.load_faults += s.io_errors + s.corrupt;
}

}  // namespace

ManagerOpsFigures run_manager_ops(std::span<const std::uint8_t> bytes) {
  ManagerOpsFigures figures;
  {
    ByteReader in(bytes);
    Driver(std::make_unique<ContinuousBatchingKVCacheManager>(params(CacheStrategy::continuous),
                                                              kMaxBatch, kMaxSeq))
        .run(in);
  }
  {
    ByteReader in(bytes);
    Driver(
        std::make_unique<PagedKVCacheManager>(params(CacheStrategy::paged), 40, kMaxBatch, kMaxSeq))
        .run(in);
  }
  {
    ByteReader in(bytes);
    KVCacheParams p = params(CacheStrategy::paged);
    p.enable_prefix_caching = true;
    Driver(std::make_unique<PagedKVCacheManager>(p, 24, kMaxBatch, kMaxSeq)).run(in);
  }
  for (const bool synchronous : {true, false}) run_with_tier(bytes, synchronous, figures);
  return figures;
}

}  // namespace kvcache::testing
