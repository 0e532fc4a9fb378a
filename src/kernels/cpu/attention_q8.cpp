// CPU attention over 8-bit caches (fp8_e4m3, fp8_e5m2, int8), per Highway
// target: the same work plan and split merge as the 16/32-bit kernel
// (attention_plan.h, attention_merge-inl.h), its own item loop. Codes are
// widened to f32 in registers (quantize-inl.h) and every sum is fp32.
//
// Scales: fp8's static per-head K scale (and e4m3's decode unit) is folded
// into the pre-scaled queries, the V scale into the output; int8's
// (token, head) scales multiply each score (K) and each probability (V).
//
// Per item (entry b, query rows, KV heads, KV tokens) the tokens go a chunk
// at a time (at most kChunk rows of one page) and within a chunk head by
// head, so each page is read in address order whatever the layout; per head
// up to kQ query vectors share each decoded K and V vector: scores (one
// reduction per token and query), an online softmax on the chunk's scores,
// then V accumulated into the query vectors' rows (kept in L1 scratch).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/kernel_common.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_q8.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
#include "kernels/cpu/attention_merge-inl.h"
#include "kernels/cpu/exp_scores-inl.h"
#include "kernels/cpu/quantize-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr std::uint32_t kChunk = 16;  // tokens per softmax step
constexpr std::uint32_t kQ = 4;       // query vectors per pass over a chunk

template <DType kType>
class Q8Runner {
  using DF = hn::ScalableTag<float>;
  using VF = hn::Vec<DF>;

 public:
  explicit Q8Runner(const AttentionCtx& c) : c_(c) {}

  // Runs one item; partial != null: writes its (max, sum, acc) partials.
  void run(const WorkItem& it, float* partial) {
    start(it);
    std::uint32_t t_end = it.t0;
    for (std::uint32_t v = 0; v < total_; ++v) t_end = std::max(t_end, limit_[v]);
    t_end = std::min(t_end, it.t1);
    for (std::uint32_t t = it.t0; t < t_end;) {
      const std::uint32_t row0 = t % c_.page;
      const std::uint32_t n = std::min({kChunk, c_.page - row0, t_end - t});
      const std::size_t block =
          std::size_t{c_.lookup[std::size_t{it.b} * c_.lookup_stride + t / c_.page]};
      const auto* kb = static_cast<const std::uint8_t*>(c_.k.blocks) + block * c_.k.block_stride;
      const auto* vb = static_cast<const std::uint8_t*>(c_.v.blocks) + block * c_.v.block_stride;
      for (std::uint32_t h = it.h0; h < it.h1; ++h) {
        for (std::uint32_t m0 = 0; m0 < per_head_; m0 += kQ) {
          const std::uint32_t first = (h - it.h0) * per_head_ + m0;
          chunk(first, std::min(kQ, per_head_ - m0), h, kb, vb, row0, t, n);
        }
      }
      t += n;
    }
    finish(it, partial);
  }

 private:
  // The item's query vectors pre-scaled (softmax scale, fp8 K scale, decode unit).
  void start(const WorkItem& it) {
    const std::uint32_t dim = c_.dim;
    per_head_ = (it.r1 - it.r0) * c_.group;
    total_ = (it.h1 - it.h0) * per_head_;
    q_.resize(std::size_t{total_} * dim);
    acc_.assign(std::size_t{total_} * dim, 0.0f);
    max_.assign(total_, -std::numeric_limits<float>::infinity());
    sum_.assign(total_, 0.0f);
    limit_.resize(total_);
    const std::size_t q_row = std::size_t{c_.n_q} * dim;
    for (std::uint32_t v = 0; v < total_; ++v) {
      const std::uint32_t h = it.h0 + v / per_head_, m = v % per_head_;
      const std::uint32_t r = it.r0 + m / c_.group, g = m % c_.group;
      limit_[v] = c_.cache_lengths[it.b] + (r - c_.row_offsets[it.b]) + 1;
      float f = c_.scale * kDecodeUnit<kType>;
      if constexpr (kType != DType::int8) f *= c_.k_head_scales[h];
      const float* src = c_.q + r * q_row + std::size_t{h * c_.group + g} * dim;
      for (std::uint32_t d = 0; d < dim; ++d) q_[std::size_t{v} * dim + d] = src[d] * f;
    }
  }

  // int8: the scale of (row, head) in the block at base.
  float row_scale(const std::uint8_t* base, std::uint32_t row, std::uint32_t h) const {
    float s;
    const std::size_t i = (std::size_t{row} * c_.token_stride + h * c_.head_stride) / c_.dim;
    std::memcpy(&s, base + c_.scales_offset + i * sizeof(float), sizeof(float));
    return s;
  }

  // Query vectors [first, first + nq) of head h over rows [row0, row0 + n)
  // of one block (tokens t, t + 1, ...).
  void chunk(std::uint32_t first, std::uint32_t nq, std::uint32_t h, const std::uint8_t* kb,
             const std::uint8_t* vb, std::uint32_t row0, std::uint32_t t, std::uint32_t n) {
    alignas(64) float s[kQ][kChunk];
    const std::uint8_t* k_rows[kChunk];
    const std::uint8_t* v_rows[kChunk];
    float k_scale[kChunk], v_scale[kChunk];
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::size_t at = std::size_t{row0 + i} * c_.token_stride + h * c_.head_stride;
      k_rows[i] = kb + at;
      v_rows[i] = vb + at;
      if constexpr (kType == DType::int8) {
        k_scale[i] = row_scale(kb, row0 + i, h);
        v_scale[i] = row_scale(vb, row0 + i, h);
      }
    }
    switch (nq) {
      case 1:
        scores<1>(first, k_rows, n, s);
        break;
      case 2:
        scores<2>(first, k_rows, n, s);
        break;
      case 3:
        scores<3>(first, k_rows, n, s);
        break;
      default:
        scores<4>(first, k_rows, n, s);
        break;
    }
    for (std::uint32_t q = 0; q < nq; ++q) {
      for (std::uint32_t i = 0; i < n; ++i) {
        if constexpr (kType == DType::int8) s[q][i] *= k_scale[i];
        if (t + i >= limit_[first + q]) s[q][i] = -std::numeric_limits<float>::infinity();
      }
      softmax(first + q, s[q], n, t);
      if constexpr (kType == DType::int8) {
        for (std::uint32_t i = 0; i < n; ++i) s[q][i] *= v_scale[i];
      }
    }
    switch (nq) {
      case 1:
        accumulate<1>(first, v_rows, n, s);
        break;
      case 2:
        accumulate<2>(first, v_rows, n, s);
        break;
      case 3:
        accumulate<3>(first, v_rows, n, s);
        break;
      default:
        accumulate<4>(first, v_rows, n, s);
        break;
    }
  }

  template <std::uint32_t kNQ>
  void scores(std::uint32_t first, const std::uint8_t* const* rows, std::uint32_t n,
              float (&s)[kQ][kChunk]) const {
    const DF df;
    const std::size_t kN = hn::Lanes(df);
    const std::uint32_t dim = c_.dim;
    const std::size_t vec_end = dim / kN * kN;
    const float* q = q_.data() + std::size_t{first} * dim;
    for (std::uint32_t i = 0; i < n; ++i) {
      VF a[kNQ];
      for (std::uint32_t j = 0; j < kNQ; ++j) a[j] = hn::Zero(df);
      for (std::size_t d = 0; d < vec_end; d += kN) {
        const VF k = DecodeQ8<kType>(df, rows[i] + d);
        for (std::uint32_t j = 0; j < kNQ; ++j)
          a[j] = hn::MulAdd(hn::LoadU(df, q + j * dim + d), k, a[j]);
      }
      for (std::uint32_t j = 0; j < kNQ; ++j) {
        float r = hn::GetLane(hn::SumOfLanes(df, a[j]));
        for (std::size_t d = vec_end; d < dim; ++d) {
          r += q[j * dim + d] * DecodeQ8Scalar<kType>(rows[i][d]);
        }
        s[j][i] = r;
      }
    }
  }

  // Online softmax step of query vector v over s[0, n): rescales its state
  // and turns s into the probabilities (unnormalised, 0 where masked).
  void softmax(std::uint32_t v, float* s, std::uint32_t n, std::uint32_t t) {
    float m = max_[v];
    for (std::uint32_t i = 0; i < n; ++i) m = std::max(m, s[i]);
    if (m == -std::numeric_limits<float>::infinity()) {
      std::fill(s, s + n, 0.0f);
      return;
    }
    if (m != max_[v]) {
      const float corr = std::exp(max_[v] - m);
      sum_[v] *= corr;
      float* a = acc_.data() + std::size_t{v} * c_.dim;
      for (std::uint32_t d = 0; d < c_.dim; ++d) a[d] *= corr;
      max_[v] = m;
    }
    const DF df;
    const std::size_t kN = hn::Lanes(df);
    for (std::uint32_t i = n; i < kChunk; ++i) s[i] = -std::numeric_limits<float>::infinity();
    const VF vm = hn::Set(df, m), floor = hn::Set(df, -88.0f);
    for (std::size_t i = 0; i < kChunk; i += kN) {
      const VF e = ExpScores(df, hn::Max(hn::Sub(hn::LoadU(df, s + i), vm), floor));
      hn::StoreU(e, df, s + i);
    }
    for (std::uint32_t i = 0; i < n; ++i) {
      if (t + i >= limit_[v]) s[i] = 0.0f;
      sum_[v] += s[i];
    }
  }

  template <std::uint32_t kNQ>
  void accumulate(std::uint32_t first, const std::uint8_t* const* rows, std::uint32_t n,
                  const float (&p)[kQ][kChunk]) {
    const DF df;
    const std::size_t kN = hn::Lanes(df);
    const std::uint32_t dim = c_.dim;
    const std::size_t vec_end = dim / kN * kN;
    float* acc = acc_.data() + std::size_t{first} * dim;
    for (std::size_t d = 0; d < vec_end; d += kN) {
      VF a[kNQ];
      for (std::uint32_t j = 0; j < kNQ; ++j) a[j] = hn::LoadU(df, acc + j * dim + d);
      for (std::uint32_t i = 0; i < n; ++i) {
        const VF v = DecodeQ8<kType>(df, rows[i] + d);
        for (std::uint32_t j = 0; j < kNQ; ++j) a[j] = hn::MulAdd(hn::Set(df, p[j][i]), v, a[j]);
      }
      for (std::uint32_t j = 0; j < kNQ; ++j) hn::StoreU(a[j], df, acc + j * dim + d);
    }
    for (std::size_t d = vec_end; d < dim; ++d) {
      for (std::uint32_t i = 0; i < n; ++i) {
        const float v = DecodeQ8Scalar<kType>(rows[i][d]);
        for (std::uint32_t j = 0; j < kNQ; ++j) acc[j * dim + d] += p[j][i] * v;
      }
    }
  }

  void finish(const WorkItem& it, float* partial) const {
    const std::uint32_t dim = c_.dim;
    const std::size_t q_row = std::size_t{c_.n_q} * dim;
    for (std::uint32_t v = 0; v < total_; ++v) {
      const std::uint32_t h = it.h0 + v / per_head_, m = v % per_head_;
      float f = kDecodeUnit<kType>;
      if constexpr (kType != DType::int8) f *= c_.v_head_scales[h];
      const float* a = acc_.data() + std::size_t{v} * dim;
      if (partial != nullptr) {
        partial[v] = max_[v];
        partial[total_ + v] = sum_[v];
        float* dst = partial + 2 * std::size_t{total_} + std::size_t{v} * dim;
        for (std::uint32_t d = 0; d < dim; ++d) dst[d] = a[d] * f;
        continue;
      }
      const std::uint32_t r = it.r0 + m / c_.group, g = m % c_.group;
      float* dst = c_.out + r * q_row + std::size_t{h * c_.group + g} * dim;
      const float inv = f / sum_[v];
      for (std::uint32_t d = 0; d < dim; ++d) dst[d] = a[d] * inv;
    }
  }

  const AttentionCtx& c_;
  std::uint32_t per_head_ = 0, total_ = 0;
  std::vector<float> q_, acc_, max_, sum_;
  std::vector<std::uint32_t> limit_;
};

template <DType kType>
void RunAttentionQ8(const AttentionCtx& c) {
  const AttentionPlan& plan = *c.plan;
  const std::size_t n_items = plan.items.size();
  std::size_t max_total = 0;
  for (std::size_t i = 0; i < plan.split_items; ++i) {
    const WorkItem& it = plan.items[i];
    max_total =
        std::max<std::size_t>(max_total, std::size_t{it.h1 - it.h0} * (it.r1 - it.r0) * c.group);
  }
  const std::size_t stride = max_total * (c.dim + 2);
  std::vector<float> partials(plan.split_items * stride);
  std::atomic<std::size_t> next{0};
  OnWorkers(c.pool, n_items, [&](std::size_t) {
    Q8Runner<kType> runner(c);
    for (std::size_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) {
      runner.run(plan.items[i], i < plan.split_items ? partials.data() + i * stride : nullptr);
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

void AttentionE4M3(const AttentionCtx& c) { RunAttentionQ8<DType::fp8_e4m3>(c); }
void AttentionE5M2(const AttentionCtx& c) { RunAttentionQ8<DType::fp8_e5m2>(c); }
void AttentionI8(const AttentionCtx& c) { RunAttentionQ8<DType::int8>(c); }

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::kernels {
HWY_EXPORT(AttentionE4M3);
HWY_EXPORT(AttentionE5M2);
HWY_EXPORT(AttentionI8);

void attention_q8(DType dtype, const AttentionCtx& c) {
  switch (dtype) {
    case DType::fp8_e4m3:
      HWY_DYNAMIC_DISPATCH(AttentionE4M3)(c);
      break;
    case DType::fp8_e5m2:
      HWY_DYNAMIC_DISPATCH(AttentionE5M2)(c);
      break;
    default:
      HWY_DYNAMIC_DISPATCH(AttentionI8)(c);
      break;
  }
}
}  // namespace kvcache::kernels
#endif  // HWY_ONCE
