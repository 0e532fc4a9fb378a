// Property test: random claim / match_prefix / fetch / step / fork /
// truncate / release / pin / reset sequences against a reference model (the
// committed tokens of every live sequence). After every operation the
// manager's invariants hold, every live sequence's K/V is exactly the data
// written for its tokens (so reused, forked and copied pages are right), in
// the manager's pool and in a mirror pool that sees only the caller's writes
// and the copies fetch reports (as a GPU pool does), and a call that throws
// leaves snapshot() unchanged.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <map>

#include "prefix/prefix_test_util.h"

namespace kvcache {
namespace {

using testing::tiny_params;

struct Model {
  std::map<SeqId, std::vector<std::uint32_t>> tokens;  // committed tokens per live sequence
  testing::MirrorPool mirror;                          // kept by block_copies + writes alone
};

// What a caller with its own pool does after a fetch: make the fetch's
// copies, then write the new tokens into both pools.
void write_both(Model& model, const KVCacheBatch& batch, std::span<const std::uint32_t> tokens,
                std::uint32_t from, std::uint32_t to) {
  model.mirror.apply(batch);
  testing::write_kv(batch, 0, tokens, from, to);
  testing::write_kv(batch, 0, tokens, from, to, model.mirror.blocks());
}

std::vector<std::uint32_t> gen_tokens(std::uint32_t n) {
  // Small alphabet and shared stems so prefixes repeat.
  const auto stem = *rc::gen::inRange<std::uint32_t>(0, 3);
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = stem * 100 + i;
  if (*rc::gen::inRange(0, 3) == 0 && n > 0) t[*rc::gen::inRange<std::uint32_t>(0, n)] = 7;
  return t;
}

// Runs op and checks that a throw changed nothing.
template <class F>
bool strong(PagedKVCacheManager& m, F&& op) {
  const ManagerSnapshot before = m.snapshot();
  try {
    op();
    return true;
  } catch (const Error&) {
    RC_ASSERT(m.snapshot() == before);
    return false;
  }
}

void check_all(PagedKVCacheManager& m, Model& model) {
  m.check_invariants();
  for (const auto& [id, toks] : model.tokens) {
    RC_ASSERT(m.cache_length(id) == toks.size());
    const std::uint32_t zero = 0;
    // fetch(0) needs no pages, and the sequence writes nothing.
    const KVCacheBatch batch = m.fetch(std::span(&id, 1), std::span(&zero, 1));
    RC_ASSERT(batch.block_copies().empty());
    RC_ASSERT(testing::kv_matches(batch, 0, toks));
    RC_ASSERT(testing::kv_matches(batch, 0, toks, model.mirror.blocks()));
  }
}

void add_tokens(PagedKVCacheManager& m, Model& model, SeqId id, std::uint32_t n) {
  std::vector<std::uint32_t> full = model.tokens[id];
  const std::uint32_t from = static_cast<std::uint32_t>(full.size());
  const std::vector<std::uint32_t> extra = gen_tokens(from + n);
  full.insert(full.end(), extra.begin() + from, extra.end());
  KVCacheBatch batch;
  if (!strong(m, [&] { batch = m.fetch(std::span(&id, 1), std::span(&n, 1)); })) return;
  write_both(model, batch, full, from, from + n);
  m.step(std::span(&id, 1), std::span(&n, 1), std::span(full).subspan(from));
  model.tokens[id] = std::move(full);
}

RC_GTEST_PROP(PrefixCacheProperty, RandomOperationsKeepInvariantsAndData, ()) {
  PrefixCacheConfig cfg;
  cfg.policy = *rc::gen::element(EvictionPolicyKind::lru, EvictionPolicyKind::s3fifo,
                                 EvictionPolicyKind::tiered, EvictionPolicyKind::interval,
                                 EvictionPolicyKind::adaptive);
  if (*rc::gen::inRange(0, 4) == 0) {  // weak hash: collisions everywhere
    cfg.hash = [](std::uint64_t parent, std::span<const std::uint32_t> t, std::uint64_t) {
      return (parent + t[0]) % 5;
    };
  }
  const std::uint32_t ps = *rc::gen::element(1u, 2u, 4u);
  const std::uint32_t pages = *rc::gen::inRange(4u, 24u);
  PagedKVCacheManager m(tiny_params(ps), pages, 6, 32, cfg);
  Model model{.tokens = {}, .mirror = testing::MirrorPool(tiny_params(ps), pages)};
  const int num_ops = *rc::gen::inRange(1, 40);
  for (int op = 0; op < num_ops; ++op) {
    const int kind = *rc::gen::inRange(0, 8);
    const bool have = !model.tokens.empty();
    auto pick = [&] {
      auto it = model.tokens.begin();
      std::advance(it, *rc::gen::inRange<std::size_t>(0, model.tokens.size()));
      return it->first;
    };
    if (kind == 0 || !have) {  // claim + match_prefix + prefill
      std::vector<SeqId> ids;
      if (!strong(m, [&] { ids = m.claim(1); })) continue;
      const std::vector<std::uint32_t> prompt = gen_tokens(*rc::gen::inRange(1u, 14u));
      const std::uint32_t reused = m.match_prefix(ids[0], prompt);
      RC_ASSERT(reused < prompt.size());
      RC_ASSERT(reused % ps == 0);
      model.tokens[ids[0]] = std::vector<std::uint32_t>(prompt.begin(), prompt.begin() + reused);
      const std::uint32_t rest = static_cast<std::uint32_t>(prompt.size()) - reused;
      KVCacheBatch batch;
      if (strong(m, [&] { batch = m.fetch(std::span(ids), std::span(&rest, 1)); })) {
        write_both(model, batch, prompt, reused, static_cast<std::uint32_t>(prompt.size()));
        m.step(std::span(ids), std::span(&rest, 1), std::span(prompt).subspan(reused));
        model.tokens[ids[0]] = prompt;
      }
    } else if (kind <= 2) {
      add_tokens(m, model, pick(), *rc::gen::inRange(1u, 6u));
    } else if (kind == 3) {
      const SeqId id = pick();
      SeqId child = 0;
      if (strong(m, [&] { child = m.fork(id); })) model.tokens[child] = model.tokens[id];
    } else if (kind == 4) {
      const SeqId id = pick();
      const auto len = static_cast<std::uint32_t>(model.tokens[id].size());
      const std::uint32_t n = *rc::gen::inRange(0u, len + 2);
      if (strong(m, [&] { m.truncate(id, n); }))
        model.tokens[id].resize(n);
      else
        RC_ASSERT(n > len);
    } else if (kind == 5) {
      const SeqId id = pick();
      m.release(id, *rc::gen::element(ReuseHint::unknown, ReuseHint::unlikely, ReuseHint::likely));
      model.tokens.erase(id);
    } else if (kind == 6) {
      m.pin_prefix(gen_tokens(*rc::gen::inRange(1u, 10u)), *rc::gen::inRange(0u, 3u));
    } else if (*rc::gen::inRange(0, 4) == 0) {
      m.reset_prefix_cache();
    }
    check_all(m, model);
    const PrefixCacheMetrics mm = m.metrics();
    RC_ASSERT(mm.pages_free + mm.pages_used + mm.pages_cached == mm.pages_total);
  }
  for (const auto& [id, toks] : model.tokens) m.release(id);
  m.check_invariants();
  m.reset_prefix_cache();
  RC_ASSERT(m.free_blocks() == m.total_blocks());
}

}  // namespace
}  // namespace kvcache
