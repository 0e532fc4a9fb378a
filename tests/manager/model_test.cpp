// Randomised model check of both managers: long random sequences of
// claim / fetch (+ write) / step / release / bad calls, compared after every
// operation with a tiny model (lengths, free blocks, active sequences), K/V
// content verified through views, check_invariants() after every op.
// Deterministic: fixed seeds; a failure names the seed and the op index.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

struct Model {
  std::map<SeqId, std::uint32_t> length;  // committed tokens
};

std::uint32_t ceil_div(std::uint32_t a, std::uint32_t b) { return (a + b - 1) / b; }

template <class Coll>
void write_tokens(const Coll& coll, std::uint32_t b, SeqId id, std::uint32_t from,
                  std::uint32_t to) {
  for (std::uint32_t l = 0; l < coll.num_layers(); ++l)
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      const auto c = kv ? coll.get_value_cache(l) : coll.get_key_cache(l);
      for (std::uint32_t t = from; t < to; ++t)
        for (std::uint32_t h = 0; h < c.n_kv_heads(); ++h)
          for (std::uint32_t d = 0; d < c.head_dim(); ++d)
            *c.ptr(b, h, t, d) = kvtest::pattern_value(id, l, kv, h, t, d);
    }
}

template <class Coll>
bool verify_tokens(const Coll& coll, std::uint32_t b, SeqId id, std::uint32_t to) {
  for (std::uint32_t l = 0; l < coll.num_layers(); ++l)
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      const auto c = kv ? coll.get_value_cache(l) : coll.get_key_cache(l);
      for (std::uint32_t t = 0; t < to; ++t)
        for (std::uint32_t h = 0; h < c.n_kv_heads(); ++h)
          for (std::uint32_t d = 0; d < c.head_dim(); ++d)
            if (*c.ptr(b, h, t, d) != kvtest::pattern_value(id, l, kv, h, t, d)) return false;
    }
  return true;
}

void run_model(bool paged, std::uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed) + (paged ? " paged" : " continuous"));
  std::mt19937_64 rng(seed);
  const std::uint32_t page_size = 1 + static_cast<std::uint32_t>(rng() % 5);
  const std::uint32_t max_batch = 2 + static_cast<std::uint32_t>(rng() % 5);
  const std::uint32_t max_seq = 8 + static_cast<std::uint32_t>(rng() % 24);
  const std::uint32_t pages = 2 + static_cast<std::uint32_t>(rng() % 20);
  std::unique_ptr<KVCacheManager> mgr;
  if (paged) {
    mgr = std::make_unique<PagedKVCacheManager>(kvtest::paged_params(2, 1, 2, page_size), pages,
                                                max_batch, max_seq);
  } else {
    mgr = std::make_unique<ContinuousBatchingKVCacheManager>(kvtest::continuous_params(2, 1, 2),
                                                             max_batch, max_seq);
  }
  Model model;
  std::set<SeqId> ever;
  auto used_blocks = [&] {
    if (!paged) return static_cast<std::uint32_t>(model.length.size());
    std::uint32_t n = 0;
    for (const auto& [id, len] : model.length) n += ceil_div(len, page_size);
    return n;
  };
  auto pick = [&]() -> SeqId {
    auto it = model.length.begin();
    std::advance(it, static_cast<long>(rng() % model.length.size()));
    return it->first;
  };

  for (int op = 0; op < 120; ++op) {
    SCOPED_TRACE("op " + std::to_string(op));
    const int kind = static_cast<int>(rng() % 10);
    if (kind <= 1 || model.length.empty()) {  // claim
      const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % 3);
      if (model.length.size() + n > max_batch) {
        const auto snap = mgr->snapshot();
        EXPECT_THROW(mgr->claim(n), CapacityExceeded);
        EXPECT_EQ(mgr->snapshot(), snap);
      } else {
        const Ids ids = mgr->claim(n);
        ASSERT_EQ(ids.size(), n);
        for (SeqId id : ids) {
          EXPECT_TRUE(ever.insert(id).second) << "id " << id << " reused";
          model.length[id] = 0;
        }
      }
    } else if (kind <= 6) {  // fetch + write + step a random subset
      Ids ids;
      for (const auto& [id, len] : model.length)
        if (rng() % 2) ids.push_back(id);
      if (ids.empty()) ids.push_back(pick());
      std::shuffle(ids.begin(), ids.end(), rng);
      const std::uint32_t steps = rng() % 4 == 0 ? 2 : 1;
      U32 news;
      bool too_long = false;
      std::uint32_t need_pages = 0;
      for (SeqId id : ids) {
        const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % 6);
        news.push_back(n);
        const std::uint32_t target = model.length[id] + n + steps - 1;
        too_long |= target > max_seq;
        need_pages += ceil_div(target, page_size) - ceil_div(model.length[id], page_size);
      }
      const bool no_pages = paged && need_pages > pages - used_blocks();
      if (too_long || no_pages) {
        const auto snap = mgr->snapshot();
        try {
          mgr->fetch(ids, news, steps);
          ADD_FAILURE() << "fetch should have thrown";
        } catch (const CapacityExceeded&) {
          EXPECT_TRUE(too_long);
        } catch (const OutOfPages&) {
          EXPECT_TRUE(no_pages);
        }
        EXPECT_EQ(mgr->snapshot(), snap);
      } else {
        KVCacheBatch batch = mgr->fetch(ids, news, steps);
        for (std::uint32_t b = 0; b < ids.size(); ++b) {
          const std::uint32_t len = model.length[ids[b]];
          ASSERT_EQ(batch.cache_lengths()[b], len);
          // Paged: what was asked for; continuous: the whole slot.
          ASSERT_EQ(batch.reserved_lengths()[b], paged ? len + news[b] + steps - 1 : max_seq);
          const std::uint32_t end = len + news[b] + steps - 1;
          if (paged) {
            auto c = batch.paged<float>();
            EXPECT_TRUE(verify_tokens(c, b, ids[b], len)) << "history of seq " << ids[b];
            write_tokens(c, b, ids[b], len, end);
          } else {
            auto c = batch.continuous<float>();
            EXPECT_TRUE(verify_tokens(c, b, ids[b], len)) << "history of seq " << ids[b];
            write_tokens(c, b, ids[b], len, end);
          }
        }
        if (steps == 2) {
          batch.increment_cache_lengths(kvtest::offsets_of(news));
          if (paged) {  // a third step passes the room fetched for two
            EXPECT_THROW(batch.increment_cache_lengths(kvtest::offsets_of(U32(ids.size(), 1))),
                         CapacityExceeded);
          }
        }
        U32 commit = news;
        for (auto& c : commit) c += steps - 1;
        mgr->step(ids, commit);
        for (std::uint32_t b = 0; b < ids.size(); ++b) model.length[ids[b]] += commit[b];
      }
    } else if (kind <= 8) {  // release
      const SeqId id = pick();
      mgr->release(id);
      model.length.erase(id);
      EXPECT_FALSE(mgr->contains(id));
    } else {  // a bad call that must change nothing
      const auto snap = mgr->snapshot();
      const SeqId id = pick();
      switch (rng() % 4) {
        case 0:
          // Duplicate ids are malformed; when the sequence is also full (or
          // the pool empty) which check fires first is unspecified.
          if (model.length[id] + 2 <= max_seq && (!paged || pages - used_blocks() >= 2))
            EXPECT_THROW(mgr->fetch(Ids{id, id}, U32{1, 1}), InvalidArgument);
          else
            EXPECT_THROW(mgr->fetch(Ids{id, id}, U32{1, 1}), Error);
          break;
        case 1:
          EXPECT_THROW(mgr->release(100000 + rng() % 100), UnknownSequence);
          break;
        case 2:
          EXPECT_THROW(mgr->step(Ids{id}, U32{max_seq + 1}), CapacityExceeded);
          break;
        default:
          EXPECT_THROW(mgr->fetch(Ids{id}, U32{1}, 0), InvalidArgument);
          break;
      }
      EXPECT_EQ(mgr->snapshot(), snap);
    }
    // Compare with the model.
    ASSERT_NO_THROW(mgr->check_invariants());
    ASSERT_EQ(mgr->num_active_sequences(), model.length.size());
    ASSERT_EQ(mgr->used_blocks(), used_blocks());
    for (const auto& [id, len] : model.length) {
      ASSERT_TRUE(mgr->contains(id));
      ASSERT_EQ(mgr->cache_length(id), len);
    }
    const auto snap = mgr->snapshot();
    ASSERT_EQ(snap.sequences.size(), model.length.size());
    for (const auto& s : snap.sequences) {
      ASSERT_EQ(s.cache_length, model.length.at(s.id));
      ASSERT_EQ(s.blocks.size(), paged ? ceil_div(s.cache_length, page_size) : 1u);
    }
  }
  for (const auto& [id, len] : model.length) mgr->release(id);
  EXPECT_EQ(mgr->free_blocks(), mgr->total_blocks());
  mgr->check_invariants();
}

TEST(ManagerModel, PagedRandomOps) {
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    run_model(true, seed);
    if (HasFatalFailure()) return;
  }
}

TEST(ManagerModel, ContinuousRandomOps) {
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    run_model(false, seed);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
