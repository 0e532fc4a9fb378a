// Random operations on a prefix-caching manager of one or two devices with a
// tier below it (the reference MemoryTier, one per device shard, completing
// at once or when told, with faults in any shard):
// after every operation check_invariants holds, refused calls change
// nothing, lengths follow the model, and every page a sequence holds, from
// the device index or loaded back from the tier (its own load or one it
// attached: matches of prompts sharing a prefix with a loading sequence's),
// holds exactly its own prefix's K/V.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <map>

#include "prefix/prefix_test_util.h"
#include "tier/memory_tier.h"

namespace kvcache {
namespace {

using testing::MemoryTier;

// A value in [lo, hi), uniform at every size (rc::gen::inRange scales the
// range with the size: small cases would hold a one-page tier and claim only).
template <class T>
T in_range(T lo, T hi) {
  return *rc::gen::resize(100, rc::gen::inRange<T>(lo, hi));
}

std::vector<std::uint32_t> gen_tokens(std::uint32_t n) {
  const auto stem = in_range<std::uint32_t>(0, 3);  // shared stems: prefixes repeat
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = stem * 100 + i;
  if (in_range(0, 3) == 0 && n > 0) t[in_range<std::uint32_t>(0, n)] = 7;
  return t;
}

// Position pos's element (kv, layer, dim) of entry 0 on `device` (its one head).
float* element_on(const KVCacheBatch& batch, std::uint32_t pos, std::uint32_t kv,
                  std::uint32_t layer, std::uint32_t d, std::uint32_t device) {
  const KVCacheParams& p = batch.params();
  const std::uint32_t ps = p.page_size;
  const std::uint32_t page = batch.lookup_table()[pos / ps];
  const std::size_t off = ((((std::size_t{page} * 2 + kv) * p.num_layers + layer) * ps + pos % ps) *
                           p.n_kv_heads_per_device()) *
                              p.head_dim +
                          d;
  return static_cast<float*>(batch.blocks(device)) + off;
}

// The value device `device` holds for a prefix hash: each device its own.
float value_on(std::uint64_t h, std::uint32_t kv, std::uint32_t layer, std::uint32_t d,
               std::uint32_t device) {
  return testing::kv_value(h + device * 0x9e3779b97f4a7c15ull, kv, layer, d);
}

void write_all(const KVCacheBatch& batch, std::span<const std::uint32_t> tokens, std::uint32_t from,
               std::uint32_t to) {
  const auto h = testing::prefix_hashes(tokens);
  const KVCacheParams& p = batch.params();
  for (std::uint32_t dev = 0; dev < p.n_devices; ++dev)
    for (std::uint32_t pos = from; pos < to; ++pos)
      for (std::uint32_t kv = 0; kv < 2; ++kv)
        for (std::uint32_t l = 0; l < p.num_layers; ++l)
          for (std::uint32_t d = 0; d < p.head_dim; ++d)
            *element_on(batch, pos, kv, l, d, dev) = value_on(h[pos], kv, l, d, dev);
}

// Every device's K/V of seq's committed tokens are those written for them.
bool matches_all(PagedKVCacheManager& m, SeqId s, std::span<const std::uint32_t> tokens) {
  const std::uint32_t zero = 0;
  const KVCacheBatch batch = m.fetch(std::span(&s, 1), std::span(&zero, 1));
  const auto h = testing::prefix_hashes(tokens);
  const KVCacheParams& p = batch.params();
  for (std::uint32_t dev = 0; dev < p.n_devices; ++dev)
    for (std::uint32_t pos = 0; pos < tokens.size(); ++pos)
      for (std::uint32_t kv = 0; kv < 2; ++kv)
        for (std::uint32_t l = 0; l < p.num_layers; ++l)
          for (std::uint32_t d = 0; d < p.head_dim; ++d)
            if (*element_on(batch, pos, kv, l, d, dev) != value_on(h[pos], kv, l, d, dev))
              return false;
  return true;
}

struct Model {
  std::map<SeqId, std::vector<std::uint32_t>> tokens;   // committed, loads finished
  std::map<SeqId, std::vector<std::uint32_t>> loading;  // prompt, while loads are pending
};

// Computes and commits the rest of `prompt` for a sequence holding `have` of it.
void complete_prompt(PagedKVCacheManager& m, Model& model, SeqId id,
                     const std::vector<std::uint32_t>& prompt) {
  const std::uint32_t have = m.cache_length(id);
  RC_ASSERT(matches_all(m, id, std::span(prompt).first(have)));
  const std::uint32_t rest = static_cast<std::uint32_t>(prompt.size()) - have;
  KVCacheBatch batch;
  try {
    batch = m.fetch(std::span(&id, 1), std::span(&rest, 1));
  } catch (const OutOfPages&) {
    model.tokens[id] = std::vector<std::uint32_t>(prompt.begin(), prompt.begin() + have);
    return;
  }
  write_all(batch, prompt, have, static_cast<std::uint32_t>(prompt.size()));
  m.step(std::span(&id, 1), std::span(&rest, 1), std::span(prompt).subspan(have));
  model.tokens[id] = prompt;
}

void finish_ready(PagedKVCacheManager& m, Model& model, const std::vector<SeqId>& ready) {
  for (SeqId id : ready) {
    RC_ASSERT(model.loading.count(id) == 1u);
    const std::vector<std::uint32_t> prompt = model.loading[id];
    model.loading.erase(id);
    RC_ASSERT(!m.has_pending_loads(id));
    complete_prompt(m, model, id, prompt);
  }
}

// Every loading sequence whose loads the manager finished (poll_loads
// reports those it finished; wait_loads finishes others on its way).
void finish_unpended(PagedKVCacheManager& m, Model& model) {
  std::vector<SeqId> done;
  for (const auto& [id, prompt] : model.loading)
    if (!m.has_pending_loads(id)) done.push_back(id);
  finish_ready(m, model, done);
}

void check_all(PagedKVCacheManager& m, const Model& model) {
  m.check_invariants();
  for (const auto& [id, toks] : model.tokens) {
    RC_ASSERT(!m.has_pending_loads(id));
    RC_ASSERT(m.cache_length(id) == toks.size());
  }
  for (const auto& [id, prompt] : model.loading) {
    RC_ASSERT(m.has_pending_loads(id));
    const ManagerSnapshot before = m.snapshot();
    const std::uint32_t one = 1;
    RC_ASSERT_THROWS_AS(m.fetch(std::span(&id, 1), std::span(&one, 1)), InvalidArgument);
    RC_ASSERT(m.snapshot() == before);
  }
}

RC_GTEST_PROP(TierManagerProperty, RandomOperationsKeepInvariantsAndData, ()) {
  const std::uint32_t ps = *rc::gen::element(1u, 2u, 4u);
  KVCacheParams params = testing::tiny_params(ps);
  params.n_devices = params.n_kv_heads = *rc::gen::element(1u, 2u);  // a head a device
  const bool synchronous = *rc::gen::arbitrary<bool>();
  const auto capacity = in_range<std::size_t>(1, 40);
  PrefixCacheConfig cfg;
  std::vector<std::shared_ptr<MemoryTier>> shards;
  for (std::uint32_t d = 0; d < params.n_devices; ++d) {
    shards.push_back(std::make_shared<MemoryTier>(
        cfg.tiers.fingerprint(params, d),
        MemoryTier::Options{.synchronous = synchronous, .capacity_pages = capacity}));
    cfg.tiers.tiers.push_back(shards.back());
  }
  cfg.tiers.staging_pages = in_range(1u, 6u);
  cfg.tiers.offload_batch = in_range(1u, 5u);  // write-backs wait for a batch
  if (in_range(0, 2) == 0) cfg.tiers.offload_delay = std::chrono::seconds{1};
  if (in_range(0, 4) == 0) cfg.tiers.admission = OffloadAdmission::reused;
  const std::uint32_t pages = in_range(3u, 9u);
  PagedKVCacheManager m(params, pages, 6, 32, cfg);
  // The manager's destructor waits for its tickets: a deferred tier must
  // finish them first, also when an assertion throws.
  struct Drain {
    std::vector<std::shared_ptr<MemoryTier>>& shards;
    void operator()() const {
      for (const auto& t : shards) t->complete_all_from_now_on();
    }
    ~Drain() { (*this)(); }
  } drain{shards};
  Model model;
  // A new sequence matching `prompt`: loading, or computing the rest now.
  // Returns whether it is loading.
  auto start = [&](const std::vector<std::uint32_t>& prompt) {
    const SeqId id = m.claim(1)[0];
    const std::uint32_t reused = m.match_prefix(id, prompt);
    RC_ASSERT(reused < prompt.size());
    RC_ASSERT(reused % ps == 0);
    if (m.has_pending_loads(id)) {
      model.loading[id] = prompt;
      return true;
    }
    complete_prompt(m, model, id, prompt);
    return false;
  };
  bool beside = false;  // a match started loading beside a loading sequence of a shared prefix
  // The stems' prompts computed, then evicted to the tier (a synchronous
  // one: wait_tiers hands it what is staged and waits for the stores).
  if (synchronous && *rc::gen::arbitrary<bool>()) {
    for (std::uint32_t stem = 0; stem < 3; ++stem) {
      std::vector<std::uint32_t> prompt(std::min<std::uint32_t>(13, pages * ps));
      for (std::uint32_t i = 0; i < prompt.size(); ++i) prompt[i] = stem * 100 + i;
      const SeqId id = m.claim(1)[0];
      complete_prompt(m, model, id, prompt);
      m.release(id);
      model.tokens.erase(id);
    }
    const SeqId filler = m.claim(1)[0];
    std::vector<std::uint32_t> all(std::min<std::uint32_t>(pages * ps, 32));
    for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = 5000 + i;
    complete_prompt(m, model, filler, all);
    m.release(filler);
    model.tokens.erase(filler);
    m.wait_tiers();
    check_all(m, model);
  }
  const int num_ops = in_range(1, 80);
  for (int op = 0; op < num_ops; ++op) {
    const int kind = std::min(in_range(0, 10), 8);
    auto pick = [&](auto& map) {
      auto it = map.begin();
      std::advance(it, in_range<std::size_t>(0, map.size()));
      return it->first;
    };
    if (kind <= 1 || (model.tokens.empty() && model.loading.empty())) {
      if (model.tokens.size() + model.loading.size() >= 6) continue;
      start(gen_tokens(in_range(2u, 14u)));
    } else if (kind == 8) {  // a prompt sharing a prefix with one loading (or computed)
      if (model.tokens.size() + model.loading.size() >= 6) continue;
      const bool of_loading = !model.loading.empty();
      std::vector<std::uint32_t> prompt =
          of_loading ? model.loading[pick(model.loading)] : model.tokens[pick(model.tokens)];
      while (prompt.size() < 2) prompt.push_back(1);  // a computed one may have lost pages
      const int shape = in_range(0, 3);               // the same, cut short, or longer
      if (shape == 1 && prompt.size() > 2) prompt.resize(in_range<std::size_t>(2, prompt.size()));
      if (shape == 2)
        for (std::uint32_t i = in_range(1u, 8u); i > 0 && prompt.size() < 20; --i)
          prompt.push_back(prompt.back() + 1);
      beside = (start(prompt) && of_loading) || beside;
    } else if (kind == 2) {
      finish_ready(m, model, m.poll_loads());
    } else if (kind == 3) {
      drain();
    } else if (kind == 4) {  // release anything, loading or not
      if (!model.tokens.empty() && (model.loading.empty() || *rc::gen::arbitrary<bool>())) {
        const SeqId id = pick(model.tokens);
        m.release(id);
        model.tokens.erase(id);
      } else if (!model.loading.empty()) {
        const SeqId id = pick(model.loading);
        m.release(id);
        model.loading.erase(id);
      }
    } else if (kind == 5) {  // a fault in one shard's tier
      MemoryTier* tier = shards[*rc::gen::inRange<std::size_t>(0, shards.size())].get();
      const std::vector<PageKey> keys = tier->keys();
      const int fault = in_range(0, 3);
      if (fault == 0) tier->fail_loads(1);
      if (fault == 1 && !keys.empty()) tier->corrupt(keys[in_range<std::size_t>(0, keys.size())]);
      if (fault == 2 && !keys.empty()) tier->drop(keys[in_range<std::size_t>(0, keys.size())]);
    } else if (kind == 6 && !model.loading.empty()) {  // wait for one sequence's loads
      const SeqId id = pick(model.loading);
      drain();  // a deferred tier finishes only when told
      m.wait_loads(id);
      RC_ASSERT(!m.has_pending_loads(id));
      finish_unpended(m, model);
    } else if (kind == 7 && !model.tokens.empty()) {  // a shared prefix is reused
      const SeqId id = pick(model.tokens);
      m.release(id);
      model.tokens.erase(id);
    }
    check_all(m, model);
  }
  drain();  // the tiers finish at once from now on: wait_tiers hands them what is staged
  m.wait_tiers();
  finish_unpended(m, model);
  check_all(m, model);
  for (const auto& [id, toks] : model.tokens) RC_ASSERT(matches_all(m, id, toks));
  const TierFigures f = m.stats().tiers.at(0);
  RC_CLASSIFY(f.pages_onboarded > 0, "onboarded");
  RC_CLASSIFY(f.load_failures > 0, "a load failed");
  RC_CLASSIFY(params.n_devices > 1, "two devices");
  RC_CLASSIFY(beside, "loading beside a shared prefix's loads");
}

}  // namespace
}  // namespace kvcache
