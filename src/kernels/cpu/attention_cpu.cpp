// Fast CPU attention (Highway, runtime dispatch). See kvcache/kernels/attention.h
// for the contract and kernels/cpu/attention_plan.h for the work split.
//
// Per work item: query vectors are pre-scaled into scratch; KV tokens are
// walked in tiles of at most kTile tokens that never cross a page; for each
// KV head of the item, the scores of all its query vectors against the tile
// are computed (kM query vectors x kT tokens per register block, so one
// K load feeds kM FMAs), an online softmax updates max / sum, and the tile's
// V rows are accumulated (two query vectors x 4 vectors of head_dim per V
// load). The next tile's rows of that head are prefetched from the page table
// meanwhile. Split items write (max, sum, acc) partials merged afterwards.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/kernel_common.h"
#include "kvcache/error.h"
#include "kvcache/kernels/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr std::uint32_t kTile = 32;  // max KV tokens per tile (multiple of any lane count)

HWY_INLINE VF LoadF(DF df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE VF LoadF(DF df, const hwy::bfloat16_t* p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, p));
}
HWY_INLINE VF LoadF(DF df, const hwy::float16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, p));
}

HWY_INLINE float ToF(float x) { return x; }
HWY_INLINE float ToF(hwy::bfloat16_t x) { return hwy::F32FromBF16(x); }
HWY_INLINE float ToF(hwy::float16_t x) {
  Half h;
  std::memcpy(&h, &x, sizeof(h));
  return to_float(h);
}

HWY_INLINE float ReduceSum(DF df, VF v) { return hn::GetLane(hn::SumOfLanes(df, v)); }

template <class T>
HWY_INLINE void PrefetchRow(const T* p, std::size_t bytes) {
  const char* c = reinterpret_cast<const char*>(p);
  for (std::size_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

// scores[j * kTile + u] = q_j . k_u for kM query vectors and kT tokens.
template <int kM, int kT, class T>
HWY_INLINE void Dot(DF df, const float* q, std::uint32_t dim, const T* const* kp, float* scores) {
  const std::size_t n = hn::Lanes(df);
  VF a[kM][kT];
  for (int j = 0; j < kM; ++j)
    for (int u = 0; u < kT; ++u) a[j][u] = hn::Zero(df);
  std::size_t d = 0;
  for (; d + n <= dim; d += n) {
    VF kv[kT];
    for (int u = 0; u < kT; ++u) kv[u] = LoadF(df, kp[u] + d);
    for (int j = 0; j < kM; ++j) {
      const VF qv = hn::LoadU(df, q + j * dim + d);
      for (int u = 0; u < kT; ++u) a[j][u] = hn::MulAdd(qv, kv[u], a[j][u]);
    }
  }
  for (int j = 0; j < kM; ++j) {
    for (int u = 0; u < kT; ++u) {
      float s = ReduceSum(df, a[j][u]);
      for (std::size_t e = d; e < dim; ++e) s += q[j * dim + e] * ToF(kp[u][e]);
      scores[j * kTile + u] = s;
    }
  }
}

template <int kM, class T>
HWY_INLINE void DotTile(DF df, const float* q, std::uint32_t dim, const T* kb, std::size_t ts,
                        std::uint32_t nt, float* scores) {
  constexpr int kT = kM <= 2 ? 4 : 2;
  std::uint32_t t = 0;
  for (; t + kT <= nt; t += kT) {
    const T* kp[kT];
    for (int u = 0; u < kT; ++u) kp[u] = kb + (t + u) * ts;
    Dot<kM, kT>(df, q, dim, kp, scores + t);
  }
  for (; t < nt; ++t) {
    const T* kp[1] = {kb + t * ts};
    Dot<kM, 1>(df, q, dim, kp, scores + t);
  }
}

// acc_r += sum_t p_r[t] * v_t for kR query vectors; kV vectors of head_dim
// per register block, so each V load feeds kR FMAs.
template <int kR, int kV, class T>
HWY_INLINE void PvRows(DF df, const float* const* p, float* const* acc, const T* vb,
                       std::size_t ts, std::uint32_t nt, std::uint32_t dim) {
  const std::size_t n = hn::Lanes(df);
  std::size_t d = 0;
  for (; d + kV * n <= dim; d += kV * n) {
    VF a[kR][kV];
    for (int r = 0; r < kR; ++r)
      for (int i = 0; i < kV; ++i) a[r][i] = hn::LoadU(df, acc[r] + d + i * n);
    for (std::uint32_t t = 0; t < nt; ++t) {
      const T* v = vb + t * ts + d;
      VF vv[kV];
      for (int i = 0; i < kV; ++i) vv[i] = LoadF(df, v + i * n);
      for (int r = 0; r < kR; ++r) {
        const VF pr = hn::Set(df, p[r][t]);
        for (int i = 0; i < kV; ++i) a[r][i] = hn::MulAdd(pr, vv[i], a[r][i]);
      }
    }
    for (int r = 0; r < kR; ++r)
      for (int i = 0; i < kV; ++i) hn::StoreU(a[r][i], df, acc[r] + d + i * n);
  }
  for (; d + n <= dim; d += n) {
    VF a[kR];
    for (int r = 0; r < kR; ++r) a[r] = hn::LoadU(df, acc[r] + d);
    for (std::uint32_t t = 0; t < nt; ++t) {
      const VF vv = LoadF(df, vb + t * ts + d);
      for (int r = 0; r < kR; ++r) a[r] = hn::MulAdd(hn::Set(df, p[r][t]), vv, a[r]);
    }
    for (int r = 0; r < kR; ++r) hn::StoreU(a[r], df, acc[r] + d);
  }
  for (; d < dim; ++d) {
    for (std::uint32_t t = 0; t < nt; ++t) {
      const float v = ToF(vb[t * ts + d]);
      for (int r = 0; r < kR; ++r) acc[r][d] += p[r][t] * v;
    }
  }
}

struct Scratch {
  std::vector<float> qs, mx, l, acc, scores;
  void ensure(std::size_t total, std::size_t dim) {
    if (qs.size() < total * dim) {
      qs.resize(total * dim);
      acc.resize(total * dim);
    }
    if (mx.size() < total) {
      mx.resize(total);
      l.resize(total);
    }
    if (scores.size() < total * kTile) scores.resize(total * kTile);
  }
};

// Online-softmax update of one query vector's state from its tile scores
// (nvalid visible tokens); turns the scores into probabilities in place.
HWY_INLINE void SoftmaxUpdate(DF df, float* s, std::uint32_t nvalid, std::uint32_t nt, float& mx,
                              float& l, float* acc, std::uint32_t dim) {
  const std::size_t n = hn::Lanes(df);
  if (nvalid == 0) {
    std::fill(s, s + nt, 0.0f);
    return;
  }
  const std::uint32_t padded = static_cast<std::uint32_t>((nt + n - 1) / n * n);
  std::fill(s + nvalid, s + padded, -std::numeric_limits<float>::infinity());
  VF vmax = hn::Set(df, -std::numeric_limits<float>::infinity());
  for (std::uint32_t t = 0; t < padded; t += n) vmax = hn::Max(vmax, hn::LoadU(df, s + t));
  const float tile_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  const float m_new = std::max(mx, tile_max);
  const VF vm = hn::Set(df, m_new);
  VF vsum = hn::Zero(df);
  for (std::uint32_t t = 0; t < padded; t += n) {
    const VF p = hn::Exp(df, hn::Sub(hn::LoadU(df, s + t), vm));
    hn::StoreU(p, df, s + t);
    vsum = hn::Add(vsum, p);
  }
  const float sum = ReduceSum(df, vsum);
  if (m_new > mx && l != 0.0f) {
    const float alpha = std::exp(mx - m_new);
    l = l * alpha + sum;
    const VF va = hn::Set(df, alpha);
    std::size_t d = 0;
    for (; d + n <= dim; d += n) hn::StoreU(hn::Mul(va, hn::LoadU(df, acc + d)), df, acc + d);
    for (; d < dim; ++d) acc[d] *= alpha;
  } else {
    l += sum;
  }
  mx = m_new;
}

template <class T>
class ItemRunner {
 public:
  ItemRunner(const AttentionCtx& c) : c_(c) {}

  void run(const WorkItem& it, Scratch& s, float* partial) {
    const std::uint32_t dim = c_.dim;
    const std::uint32_t nrows = it.r1 - it.r0;
    const std::uint32_t m_per_head = nrows * c_.group;
    const std::uint32_t nh = it.h1 - it.h0;
    const std::size_t total = std::size_t{nh} * m_per_head;
    s.ensure(total, dim);
    load_queries(it, s);
    std::fill(s.mx.begin(), s.mx.begin() + total, -std::numeric_limits<float>::infinity());
    std::fill(s.l.begin(), s.l.begin() + total, 0.0f);
    std::fill(s.acc.begin(), s.acc.begin() + total * dim, 0.0f);
    // Row i (local) of the item sees tokens < first_limit + i.
    const std::uint32_t first_limit =
        c_.cache_lengths[it.b] + (it.r0 - c_.row_offsets[it.b]) + 1;
    std::uint32_t ta = it.t0;
    while (ta < it.t1) {
      const std::uint32_t tb = tile_end(ta, it.t1);
      const std::uint32_t next_end = tb < it.t1 ? tile_end(tb, it.t1) : tb;
      for (std::uint32_t hl = 0; hl < nh; ++hl) {
        const std::uint32_t h = it.h0 + hl;
        if (next_end > tb) prefetch_tile(it.b, tb, next_end, h);
        tile(it.b, ta, tb, h, hl * m_per_head, m_per_head, first_limit, s);
      }
      ta = tb;
    }
    if (partial == nullptr) {
      write_output(it, s);
    } else {
      std::copy_n(s.mx.begin(), total, partial);
      std::copy_n(s.l.begin(), total, partial + total);
      std::copy_n(s.acc.begin(), total * dim, partial + 2 * total);
    }
  }

 private:
  std::uint32_t tile_end(std::uint32_t ta, std::uint32_t t1) const {
    const std::uint64_t page_end = (std::uint64_t{ta} / c_.page + 1) * c_.page;
    return static_cast<std::uint32_t>(
        std::min<std::uint64_t>({std::uint64_t{t1}, page_end, std::uint64_t{ta} + kTile}));
  }

  const T* row(const LayerRef& ref, std::uint32_t b, std::uint32_t tok, std::uint32_t h) const {
    const std::uint32_t block = c_.lookup[std::size_t{b} * c_.lookup_stride + tok / c_.page];
    return static_cast<const T*>(ref.blocks) + std::size_t{block} * ref.block_stride +
           std::size_t{tok % c_.page} * c_.token_stride + std::size_t{h} * c_.dim;
  }

  void prefetch_tile(std::uint32_t b, std::uint32_t ta, std::uint32_t tb, std::uint32_t h) const {
    const T* kb = row(c_.k, b, ta, h);
    const T* vb = row(c_.v, b, ta, h);
    const std::size_t bytes = std::size_t{c_.dim} * sizeof(T);
    for (std::uint32_t t = 0; t < tb - ta; ++t) {
      PrefetchRow(kb + t * c_.token_stride, bytes);
      PrefetchRow(vb + t * c_.token_stride, bytes);
    }
  }

  void load_queries(const WorkItem& it, Scratch& s) const {
    const std::uint32_t dim = c_.dim;
    const std::size_t q_row = std::size_t{c_.n_q} * dim;
    std::size_t idx = 0;
    for (std::uint32_t h = it.h0; h < it.h1; ++h) {
      for (std::uint32_t r = it.r0; r < it.r1; ++r) {
        for (std::uint32_t g = 0; g < c_.group; ++g, ++idx) {
          const float* src = c_.q + r * q_row + std::size_t{h * c_.group + g} * dim;
          float* dst = s.qs.data() + idx * dim;
          for (std::uint32_t d = 0; d < dim; ++d) dst[d] = src[d] * c_.scale;
        }
      }
    }
  }

  void write_output(const WorkItem& it, const Scratch& s) const {
    const std::uint32_t dim = c_.dim;
    const std::size_t q_row = std::size_t{c_.n_q} * dim;
    std::size_t idx = 0;
    for (std::uint32_t h = it.h0; h < it.h1; ++h) {
      for (std::uint32_t r = it.r0; r < it.r1; ++r) {
        for (std::uint32_t g = 0; g < c_.group; ++g, ++idx) {
          float* dst = c_.out + r * q_row + std::size_t{h * c_.group + g} * dim;
          const float inv = 1.0f / s.l[idx];
          const float* a = s.acc.data() + idx * dim;
          for (std::uint32_t d = 0; d < dim; ++d) dst[d] = a[d] * inv;
        }
      }
    }
  }

  // One tile [ta, tb) of one KV head h for the item's m query vectors
  // starting at state index base.
  void tile(std::uint32_t b, std::uint32_t ta, std::uint32_t tb, std::uint32_t h,
            std::size_t base, std::uint32_t m, std::uint32_t first_limit, Scratch& s) const {
    const DF df;
    const std::uint32_t dim = c_.dim;
    const std::uint32_t nt = tb - ta;
    const std::size_t ts = c_.token_stride;
    const T* kb = row(c_.k, b, ta, h);
    const T* vb = row(c_.v, b, ta, h);
    const float* q = s.qs.data() + base * dim;
    float* sc = s.scores.data();
    std::uint32_t j = 0;
    for (; j + 4 <= m; j += 4) DotTile<4>(df, q + j * dim, dim, kb, ts, nt, sc + j * kTile);
    switch (m - j) {
      case 3: DotTile<3>(df, q + j * dim, dim, kb, ts, nt, sc + j * kTile); break;
      case 2: DotTile<2>(df, q + j * dim, dim, kb, ts, nt, sc + j * kTile); break;
      case 1: DotTile<1>(df, q + j * dim, dim, kb, ts, nt, sc + j * kTile); break;
      default: break;
    }
    for (std::uint32_t i = 0; i < m; ++i) {
      const std::uint32_t limit = first_limit + i / c_.group;
      const std::uint32_t nvalid = limit <= ta ? 0 : std::min(nt, limit - ta);
      SoftmaxUpdate(df, sc + i * kTile, nvalid, nt, s.mx[base + i], s.l[base + i],
                    s.acc.data() + (base + i) * dim, dim);
    }
    std::uint32_t i = 0;
    for (; i + 4 <= m; i += 4) {
      const float* p[4];
      float* a[4];
      for (int r = 0; r < 4; ++r) {
        p[r] = sc + (i + r) * kTile;
        a[r] = s.acc.data() + (base + i + r) * dim;
      }
      PvRows<4, 2>(df, p, a, vb, ts, nt, dim);
    }
    for (; i + 2 <= m; i += 2) {
      const float* p[2] = {sc + i * kTile, sc + (i + 1) * kTile};
      float* a[2] = {s.acc.data() + (base + i) * dim, s.acc.data() + (base + i + 1) * dim};
      PvRows<2, 4>(df, p, a, vb, ts, nt, dim);
    }
    if (i < m) {
      const float* p[1] = {sc + i * kTile};
      float* a[1] = {s.acc.data() + (base + i) * dim};
      PvRows<1, 4>(df, p, a, vb, ts, nt, dim);
    }
  }

  const AttentionCtx& c_;
};

// Combines a group's partials (max, sum, acc per query vector) into out.
void MergeGroupOutput(const AttentionCtx& c, const MergeGroup& g, const float* partials,
                      std::size_t stride) {
  const WorkItem& it = c.plan->items[g.first];
  const std::uint32_t dim = c.dim;
  const std::size_t total = std::size_t{it.h1 - it.h0} * (it.r1 - it.r0) * c.group;
  const std::size_t q_row = std::size_t{c.n_q} * dim;
  std::size_t idx = 0;
  for (std::uint32_t h = it.h0; h < it.h1; ++h) {
    for (std::uint32_t r = it.r0; r < it.r1; ++r) {
      for (std::uint32_t gq = 0; gq < c.group; ++gq, ++idx) {
        float m = -std::numeric_limits<float>::infinity();
        for (std::uint32_t s = 0; s < g.count; ++s)
          m = std::max(m, partials[(g.first + s) * stride + idx]);
        float* dst = c.out + r * q_row + std::size_t{h * c.group + gq} * dim;
        std::fill(dst, dst + dim, 0.0f);
        float l = 0.0f;
        for (std::uint32_t s = 0; s < g.count; ++s) {
          const float* p = partials + (g.first + s) * stride;
          if (p[idx] == -std::numeric_limits<float>::infinity()) continue;
          const float w = std::exp(p[idx] - m);
          l += w * p[total + idx];
          const float* a = p + 2 * total + idx * dim;
          for (std::uint32_t d = 0; d < dim; ++d) dst[d] += w * a[d];
        }
        const float inv = 1.0f / l;
        for (std::uint32_t d = 0; d < dim; ++d) dst[d] *= inv;
      }
    }
  }
}

// Runs fn(worker) on up to `want` workers of the pool (or inline).
template <class F>
void OnWorkers(ThreadPool* pool, std::size_t want, const F& fn) {
  const std::size_t workers = pool == nullptr ? 1 : std::min(pool->num_threads(), want);
  if (workers <= 1) {
    fn(0);
    return;
  }
  pool->parallel_for(workers, fn);
}

template <class T>
void RunAttention(const AttentionCtx& c) {
  const AttentionPlan& plan = *c.plan;
  const std::size_t n_items = plan.items.size();
  std::size_t max_total = 0;
  for (std::size_t i = 0; i < plan.split_items; ++i) {
    const WorkItem& it = plan.items[i];
    max_total = std::max<std::size_t>(max_total,
                                      std::size_t{it.h1 - it.h0} * (it.r1 - it.r0) * c.group);
  }
  const std::size_t stride = max_total * (c.dim + 2);
  std::vector<float> partials(plan.split_items * stride);
  std::atomic<std::size_t> next{0};
  OnWorkers(c.pool, n_items, [&](std::size_t) {
    Scratch s;
    ItemRunner<T> runner(c);
    for (std::size_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) {
      runner.run(plan.items[i], s, i < plan.split_items ? partials.data() + i * stride : nullptr);
    }
  });
  if (plan.groups.empty()) return;
  std::atomic<std::size_t> next_group{0};
  OnWorkers(c.pool, plan.groups.size(), [&](std::size_t) {
    for (std::size_t g = next_group.fetch_add(1); g < plan.groups.size();
         g = next_group.fetch_add(1)) {
      MergeGroupOutput(c, plan.groups[g], partials.data(), stride);
    }
  });
}

void AttentionF32(const AttentionCtx& c) { RunAttention<float>(c); }
void AttentionF16(const AttentionCtx& c) { RunAttention<hwy::float16_t>(c); }
void AttentionBF16(const AttentionCtx& c) { RunAttention<hwy::bfloat16_t>(c); }

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache {
namespace kernels {
HWY_EXPORT(AttentionF32);
HWY_EXPORT(AttentionF16);
HWY_EXPORT(AttentionBF16);

namespace {
void check_same_shape(const LayerCacheDesc<float>& k, const LayerCacheDesc<float>& v) {
  if (k.batch_size != v.batch_size || k.n_kv_heads != v.n_kv_heads ||
      k.head_dim != v.head_dim || k.block_tokens != v.block_tokens ||
      k.cache_lengths != v.cache_lengths || k.lookup_table != v.lookup_table) {
    throw InvalidArgument("key and value caches differ in shape or batch (batch " +
                          std::to_string(k.batch_size) + " vs " + std::to_string(v.batch_size) +
                          ", heads " + std::to_string(k.n_kv_heads) + " vs " +
                          std::to_string(v.n_kv_heads) + ", head_dim " +
                          std::to_string(k.head_dim) + " vs " + std::to_string(v.head_dim) + ")");
  }
  if (k.blocks == nullptr || v.blocks == nullptr || k.head_dim == 0 || k.n_kv_heads == 0 ||
      k.block_tokens == 0) {
    throw InvalidArgument("cache view is empty (null blocks or zero head_dim / heads / page size)");
  }
}
}  // namespace

// Checks that each entry's new rows fit in the view: cache_length + new
// tokens within max_context_length and within the page table.
void check_rows_fit(const LayerCacheDesc<float>& k, std::span<const std::uint32_t> row_offsets) {
  detail::check_row_offsets(row_offsets, k.batch_size);
  const std::uint64_t table_tokens = std::uint64_t{k.lookup_stride} * k.block_tokens;
  for (std::uint32_t b = 0; b < k.batch_size; ++b) {
    const std::uint64_t end =
        std::uint64_t{k.cache_lengths[b]} + (row_offsets[b + 1] - row_offsets[b]);
    if (end > k.max_cache_length || end > table_tokens) {
      throw InvalidArgument("row_offsets give entry " + std::to_string(b) + " " +
                            std::to_string(row_offsets[b + 1] - row_offsets[b]) +
                            " new tokens after " + std::to_string(k.cache_lengths[b]) +
                            " cached: " + std::to_string(end) + " exceeds the view's limit " +
                            std::to_string(std::min<std::uint64_t>(k.max_cache_length,
                                                                   table_tokens)));
    }
  }
}

void check_shapes(const LayerCacheDesc<float>& k, const LayerCacheDesc<float>& v,
                  std::span<const std::uint32_t> row_offsets) {
  check_same_shape(k, v);
  check_rows_fit(k, row_offsets);
}
}  // namespace kernels

namespace detail {

void attention_cpu(DType dtype, const LayerCacheDesc<float>& k, const LayerCacheDesc<float>& v,
                   std::span<const float> q, std::uint32_t n_q_heads,
                   std::span<const std::uint32_t> row_offsets, std::span<float> out,
                   const AttentionOptions& options, ThreadPool* pool) {
  kernels::check_shapes(k, v, row_offsets);
  if (n_q_heads == 0 || n_q_heads % k.n_kv_heads != 0) {
    throw InvalidArgument("n_q_heads " + std::to_string(n_q_heads) +
                          " must be a positive multiple of n_kv_heads " +
                          std::to_string(k.n_kv_heads));
  }
  const std::size_t q_row = std::size_t{n_q_heads} * k.head_dim;
  check_size("q", q.size(), row_offsets[k.batch_size] * q_row);
  check_size("out", out.size(), row_offsets[k.batch_size] * q_row);
  if (row_offsets[k.batch_size] == 0) return;

  kernels::AttentionShape shape{k.batch_size, k.n_kv_heads, n_q_heads / k.n_kv_heads, k.head_dim,
                                k.block_tokens};
  const kernels::AttentionPlan plan = kernels::make_attention_plan(
      shape, k.cache_lengths, row_offsets, pool == nullptr ? 1 : pool->num_threads());
  kernels::AttentionCtx c;
  c.k = {k.blocks, k.block_stride};
  c.v = {v.blocks, v.block_stride};
  c.cache_lengths = k.cache_lengths;
  c.lookup = k.lookup_table;
  c.lookup_stride = k.lookup_stride;
  c.page = k.block_tokens;
  c.n_kv = k.n_kv_heads;
  c.group = shape.group;
  c.dim = k.head_dim;
  c.token_stride = std::size_t{k.n_kv_heads} * k.head_dim;
  c.q = q.data();
  c.out = out.data();
  c.n_q = n_q_heads;
  c.scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(float(k.head_dim));
  c.row_offsets = row_offsets.data();
  c.plan = &plan;
  c.pool = pool;
  switch (dtype) {
    case DType::f32: HWY_DYNAMIC_DISPATCH(kernels::AttentionF32)(c); break;
    case DType::f16: HWY_DYNAMIC_DISPATCH(kernels::AttentionF16)(c); break;
    case DType::bf16: HWY_DYNAMIC_DISPATCH(kernels::AttentionBF16)(c); break;
  }
}

}  // namespace detail
}  // namespace kvcache
#endif  // HWY_ONCE
