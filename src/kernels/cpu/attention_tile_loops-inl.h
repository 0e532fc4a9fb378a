// The tile loops of the CPU attention kernel's decode item runner, per
// Highway target (included through attention_cpu-inl.h): for one tile of KV
// tokens and every KV head of an item, the scores (token-major or head by
// head), the online softmax and the PV accumulation, with the next_step_l1
// prefetches and the reports to the prefetch stream.
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_TILE_LOOPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_TILE_LOOPS_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_TILE_LOOPS_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_TILE_LOOPS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hwy/highway.h"
#include "kernels/cpu/attention_blocks-inl.h"
#include "kernels/cpu/attention_dot_bf16-inl.h"
#include "kernels/cpu/attention_loops-inl.h"
#include "kernels/cpu/attention_prefetch_stream-inl.h"
#include "kernels/cpu/attention_softmax-inl.h"
#include "kernels/cpu/kernel_common.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tokens per PV step of the token-major (NHD) loops: each head's (or head
// pair's) accumulators are loaded once per this many tokens of V rows, read
// token by token across the heads. Against 4, with the L2 stream from L2 (1
// thread): NHD MHA 1.09x, GQA 4 1.13x. In DRAM (2 threads) the A/B read
// 1.00-1.085x, inside the build-to-build noise.
// With next_step_l1 the steps are kPvTokensStepL1 tokens, the next step's V
// rows prefetched into L1, and the last step prefetches as many tokens of
// the next tile's K rows. Each step's prefetches go out at once, and a
// burst larger than the core's misses in flight stalls it: on Zen 3 (DRAM,
// 2 threads, NHD, 8 heads) 2 tokens (64 lines) read 1.26x of 4 tokens for
// MHA and 1.06x for GQA 4, with the next tile's first 2 tokens instead of 8
// another 1.12x for GQA 4.
constexpr std::uint32_t kPvTokens = 16;
constexpr std::uint32_t kPvTokensStepL1 = 2;
// With next_step_l1 and several query vectors per head (GQA on NHD pages,
// token-major), the arithmetic per row is several times MHA's, and 2-token
// steps cost it the accumulators' loads and stores every 2 tokens (from L3,
// 1 thread, GQA 4: 6.3-6.8 GB/s against 9.2-12.1 for 16-token steps without
// prefetches). These items take kPvTokensStepL1Gqa-token steps instead, and
// each head's prefetches go out just before that head's part of the step,
// kPrefetchTokensGqa tokens ahead, so that no burst is larger than one
// head's rows of one step.
constexpr std::uint32_t kPvTokensStepL1Gqa = 4;
constexpr std::uint32_t kPrefetchTokensGqa = 8;
// On NHD pages, query vectors per head from which the tile loops go head by
// head (a head's rows 256 bytes apart in a page, but its queries and
// accumulators stay in L1). DRAM, 2 threads, against token-major: GQA 8
// 1.09x, GQA 4 0.93-1.05x, MHA 0.93x.
constexpr std::uint32_t kNhdHeadMajorVectors = 8;

// The tile loops of the decode item runner: one tile of an item's KV tokens
// for every KV head of the item (scores, online softmax, PV), with the
// next_step_l1 prefetches and the reports to the prefetch stream.
// ItemRunner (attention_item_runner-inl.h) sets the per-item state
// (dot_, head_major_, step_l1_, the stream's pairs) and runs the tiles.
template <class T>
class TileRunner {
 protected:
  explicit TileRunner(const AttentionCtx& c) : c_(c), stream_(c) {}

  // What the loops report the lines they read through: the stream where this
  // pass drives it.
  LinesRead<T> stream_for(bool first_pass) const {
    return {&stream_, first_pass && stream_.active()};
  }

  // pv_rows and score_block are forced inline into their loops (GCC 12 had
  // made them out-of-line clones): from L2, 1 thread, GQA 4 1.12x (HND) and
  // 1.10x (NHD), MHA 1.02-1.05x; DRAM, 2 threads, slow memory state, HND
  // GQA 4 0.975x, NHD GQA 4 0.99x, MHA 1.00x, inside the build-to-build
  // noise there.
  template <int kR, std::uint32_t kEvery = 1>
  HWY_INLINE void pv_rows(DF df, float* pr, float* acc, std::size_t dimp, const T* const* vp,
                          std::uint32_t nt, bool first_pass) const {
    const float* p[kR];
    float* a[kR];
    for (int r = 0; r < kR; ++r) {
      p[r] = pr + r * kTile;
      a[r] = acc + r * dimp;
    }
    if constexpr (kDotT) {
      if (dot_) {
        // pairs_ is indexed as probs_ is, two tokens a pair.
        const std::uint32_t* pp[kR];
        for (int r = 0; r < kR; ++r) pp[r] = pairs_ + (p[r] - probs_) / 2;
        return PvRowsDot<kR, kEvery>(pp, a, vp, nt, c_.dim, stream_for(first_pass));
      }
    }
    if (first_pass && stream_.active()) {
      PvRows<kR, kEvery>(df, p, a, vp, nt, c_.dim, stream_for(true));
    } else {
      PvRows<kR, kEvery>(df, p, a, vp, nt, c_.dim, NoLinesRead{});
    }
  }

  // One tile (tokens ta .. ta + rows.n) of KV heads [h0, h0 + nh) for the
  // item's m query vectors per head (state index hl * m + j). K and V are
  // read straight from the cache rows, token by token across the heads (a
  // few tokens' rows of every head before the next tokens), so the reads
  // walk each page in address order: on Zen 4 that let the hardware
  // prefetchers work beside the prefetch stream.
  void tile(const TileRows<T>& rows, const TileRows<T>* next, std::uint32_t ta, std::uint32_t h0,
            std::uint32_t nh, std::uint32_t m, std::uint32_t first_limit, Scratch& s) const {
    const DF df;
    const std::uint32_t nt = rows.n;
    // One streaming tile in kTimedTileEvery is timed (the TSC costs ~40 cycles
    // a read; timing every tile took MHA from L2 to 0.94x).
    const bool timed = stream_.time_this_tile();
    if (step_l1_ && next != nullptr) prefetch_segment_starts_l2(*next, h0);
    std::uint64_t t[3] = {};
    if (timed) t[0] = ticks();
    score_tile(df, rows, h0, nh, m, s);
    if (timed) t[1] = ticks();
    float* pr = s.probs.get();
    float* acc = s.acc.get();
    for (std::uint32_t hl = 0; hl < nh; ++hl) {
      // int8: the head's per-row K and V scales (RowScales).
      HWY_ALIGN float k_scales[kPageScales<T> ? kTile : 1];
      HWY_ALIGN float v_scales[kPageScales<T> ? kTile : 1];
      if constexpr (kPageScales<T>) {
        gather_scales(rows.scales.k, nt, h0 + hl, k_scales);
        gather_scales(rows.scales.v, nt, h0 + hl, v_scales);
      }
      for (std::uint32_t j = 0; j < m; ++j) {
        const std::size_t idx = std::size_t{hl} * m + j;
        const std::uint32_t limit = first_limit + j / c_.group;
        const std::uint32_t nvalid = limit <= ta ? 0 : std::min(nt, limit - ta);
        float* p = pr + idx * kTile;
        if constexpr (kPageScales<T>) {
          RowScales(df, p, k_scales);
          SoftmaxUpdate(df, p, nt, nvalid, s.mx[idx], s.lv.get() + idx * kN, acc + idx * s.dimp,
                        s.dimp);
          RowScales(df, p, v_scales);
        } else if (c_.bf16_inputs) {
          SoftmaxUpdate<true>(df, p, nt, nvalid, s.mx[idx], s.lv.get() + idx * kN,
                              acc + idx * s.dimp, s.dimp,
                              dot_ ? pairs_ + idx * kTile / 2 : nullptr);
        } else {
          SoftmaxUpdate(df, p, nt, nvalid, s.mx[idx], s.lv.get() + idx * kN, acc + idx * s.dimp,
                        s.dimp);
        }
        if (stream_.active()) stream_.issue(stream_.softmax_lines());
      }
    }
    if (timed) t[2] = ticks();
    if (head_major()) {
      pv_tile_head_major(df, rows, next, h0, nh, m, s);
    } else {
      pv_tile(df, rows, next, h0, nh, m, s);
    }
    if (timed) stream_.time_softmax(t[2] - t[1], ticks() - t[0]);
  }

  // int8: head h's scales of the tile's rows sp[0, nt) into out[0, kTile),
  // 0 past the rows.
  void gather_scales(const float* const* sp, std::uint32_t nt, std::uint32_t h, float* out) const {
    const std::size_t off = std::size_t{h} * (c_.head_stride / c_.dim);
    for (std::uint32_t t = 0; t < nt; ++t) std::memcpy(out + t, sp[t] + off, sizeof(float));
    std::fill(out + nt, out + kTile, 0.0f);
  }

  // p[0, kTile) *= scales[0, kTile): int8's per-row scales on a tile's
  // scores (K) before the softmax and on its probabilities (V) after it (the
  // denominator sums the probabilities unscaled).
  static HWY_INLINE void RowScales(DF df, float* p, const float* scales) {
    for (std::size_t g = 0; g < kTile; g += kN)
      hn::Store(hn::Mul(hn::Load(df, p + g), hn::Load(df, scales + g)), df, p + g);
  }

  // Query blocks of 4 where m allows (each K load feeds 4 queries), else 2;
  // one query per head takes (token, head) pairs.
  void score_tile(DF df, const TileRows<T>& rows, std::uint32_t h0, std::uint32_t nh,
                  std::uint32_t m, Scratch& s) const {
    if constexpr (kN >= 4) {
      if (m % 4 == 0) return score_heads<4>(df, rows, h0, nh, m, s);
    }
    if constexpr (kN >= 2) {
      if (m % 2 == 0) return score_heads<2>(df, rows, h0, nh, m, s);
    }
    if (m == 1 && !head_major()) return score_pairs(df, rows, h0, nh, s);
    score_heads<1>(df, rows, h0, nh, m, s);
  }

  // Scores of every head's m query vectors (m a multiple of kQ) against the
  // tile, kT tokens at a time: token-major (for each block of tokens, every
  // head in turn) for NHD pages, head-major (every block of one head, then
  // the next head) where a head's rows are adjacent (HND).
  template <int kQ>
  void score_heads(DF df, const TileRows<T>& rows, std::uint32_t h0, std::uint32_t nh,
                   std::uint32_t m, Scratch& s) const {
    constexpr std::uint32_t kT = kN / kQ;
    const std::uint32_t nt = rows.n;
    if (head_major()) {
      for (std::uint32_t hl = 0; hl < nh; ++hl) {
        for (std::uint32_t tb = 0; tb < nt; tb += kT) {
          if (step_l1_) prefetch_next_score_block_head_major(rows, tb + kT, h0, hl, nh);
          score_block<kQ>(df, rows, tb, h0, hl, m, s);
        }
      }
      return;
    }
    for (std::uint32_t tb = 0; tb < nt; tb += kT) {
      for (std::uint32_t hl = 0; hl < nh; ++hl) {
        // Head hl's K rows kPrefetchTokensGqa tokens on, past the tile's
        // end its first V rows.
        if (step_l1_) {
          prefetch_head_ahead_l1(rows.k, nt, rows.v, nt, tb + kPrefetchTokensGqa, kT, h0 + hl);
        }
        score_block<kQ>(df, rows, tb, h0, hl, m, s);
      }
    }
  }

  // Scores of head h0 + hl's m query vectors against tokens [tb, tb + kT)
  // of the tile (rows past the tile repeat its last row; their scores land
  // in the probs padding).
  template <int kQ>
  HWY_INLINE void score_block(DF df, const TileRows<T>& rows, std::uint32_t tb, std::uint32_t h0,
                              std::uint32_t hl, std::uint32_t m, Scratch& s) const {
    constexpr int kT = static_cast<int>(kN) / kQ;
    const std::uint32_t nt = rows.n;
    const std::size_t dimp = s.dimp;
    const std::size_t off = std::size_t{h0 + hl} * c_.head_stride;
    const T* kr[kT];
    for (int u = 0; u < kT; ++u) kr[u] = rows.k[std::min<std::uint32_t>(tb + u, nt - 1)] + off;
    HWY_ALIGN float out[kN];
    float* pr = s.probs.get();
    for (std::uint32_t j = 0; j < m; j += kQ) {
      const std::size_t idx = std::size_t{hl} * m + j;
      VF scores;
      if constexpr (kDotT) {
        if (dot_) {
          scores = ScoreBlockDot<kQ, kT>(df, s.qb.get() + idx * dimp / 2, dimp / 2, kr, c_.dim,
                                         stream_for(j == 0));
        }
      }
      if (!dot_) {
        const SharedQuery q{s.qs.get() + idx * dimp};
        // Unswitched on the stream (NoLinesRead): with the flag tested
        // inside, GCC 12 kept the AVX2 4-query loop's counter and query
        // vectors on the stack (8 stores and 5 stack operands a chunk).
        if (j == 0 && stream_.active()) {
          scores = ScoreBlock<kQ, kT>(df, q, dimp, kr, c_.dim, stream_for(true));
        } else {
          scores = ScoreBlock<kQ, kT>(df, q, dimp, kr, c_.dim, NoLinesRead{});
        }
      }
      hn::Store(scores, df, out);
      for (int jj = 0; jj < kQ; ++jj)
        std::memcpy(pr + (idx + jj) * kTile + tb, out + jj * kT, kT * sizeof(float));
    }
  }

  // AttentionPrefetch::next_step_l1, head-major score loop: the K rows of
  // the block starting at token tb of head h0 + hl, or at the head's end the
  // next head's first block, or after the last head the first V rows.
  void prefetch_next_score_block_head_major(const TileRows<T>& rows, std::uint32_t tb,
                                            std::uint32_t h0, std::uint32_t hl,
                                            std::uint32_t nh) const {
    const std::uint32_t nt = rows.n;
    constexpr auto kBlock = static_cast<std::uint32_t>(kN);
    if (tb < nt) return prefetch_tokens_l1(rows.k, tb, std::min(nt, tb + kBlock), h0 + hl, 1);
    if (hl + 1 < nh) return prefetch_tokens_l1(rows.k, 0, std::min(nt, kBlock), h0 + hl + 1, 1);
    prefetch_tokens_l1(rows.v, 0, std::min(nt, kBlock), h0, 1);
  }

  // One query vector per head (m == 1): kN (token, head) pairs per score
  // block in token-major order, each with its head's query.
  void score_pairs(DF df, const TileRows<T>& rows, std::uint32_t h0, std::uint32_t nh,
                   Scratch& s) const {
    constexpr int kT = static_cast<int>(kN);
    constexpr std::uint32_t kSkip = ~0u;
    const std::uint32_t pairs = rows.n * nh;
    float* pr = s.probs.get();
    HWY_ALIGN float out[kN];
    std::uint32_t tn = 0, hn_ = 0;  // the next pair to assign
    for (std::uint32_t p0 = 0; p0 < pairs; p0 += kT) {
      if (step_l1_) {
        if (p0 + kT < pairs) {
          const std::uint32_t last = std::min(pairs, p0 + 2 * kT) - 1;
          prefetch_tokens_l1(rows.k, (p0 + kT) / nh, last / nh + 1, h0, nh);
        } else {
          prefetch_tokens_l1(rows.v, 0, std::min(rows.n, kPvTokensStepL1), h0, nh);
        }
      }
      const T* kr[kT];
      const float* qp[kT];
      std::uint32_t slot[kT];
      for (int u = 0; u < kT; ++u) {
        if (p0 + u < pairs) {
          kr[u] = rows.k[tn] + std::size_t{h0 + hn_} * c_.head_stride;
          qp[u] = s.qs.get() + std::size_t{hn_} * s.dimp;
          slot[u] = hn_ * kTile + tn;
          if (++hn_ == nh) {
            hn_ = 0;
            ++tn;
          }
        } else {  // past the last pair (u >= 1 here): repeat it, drop the score
          // The guard is for GCC's -Warray-bounds, which cannot see that
          // u >= 1 here and warned of kr[-1] for kT == 1.
          const int prev = u > 0 ? u - 1 : 0;
          kr[u] = kr[prev];
          qp[u] = qp[prev];
          slot[u] = kSkip;
        }
      }
      const QueryPerRow q{qp};
      const VF scores = stream_.active()
                            ? ScoreBlock<1, kT>(df, q, s.dimp, kr, c_.dim, stream_for(true))
                            : ScoreBlock<1, kT>(df, q, s.dimp, kr, c_.dim, NoLinesRead{});
      hn::Store(scores, df, out);
      for (int u = 0; u < kT; ++u) {
        if (slot[u] != kSkip) pr[slot[u]] = out[u];
      }
    }
  }

  // acc += p . V over the tile kPvTokens (with next_step_l1
  // kPvTokensStepL1, or kPvTokensStepL1Gqa for m > 1) tokens at a time: for
  // each group of tokens, every head in turn (accumulators reloaded per
  // group).
  void pv_tile(DF df, const TileRows<T>& rows, const TileRows<T>* next, std::uint32_t h0,
               std::uint32_t nh, std::uint32_t m, Scratch& s) const {
    if (step_l1_) {
      if (m > 1) {
        return pv_tile_steps<kPvTokensStepL1Gqa, StepPrefetch::per_head>(df, rows, next, h0, nh, m,
                                                                         s);
      }
      return pv_tile_steps<kPvTokensStepL1, StepPrefetch::whole_step>(df, rows, next, h0, nh, m, s);
    }
    pv_tile_steps<kPvTokens, StepPrefetch::none>(df, rows, next, h0, nh, m, s);
  }

  // How the PV steps of next_step_l1 prefetch: none (other strategies); the
  // next step's V rows of every head at the step's start (past the tile's
  // end the next tile's first K rows), MHA; or head by head, each head's V
  // rows kPrefetchTokensGqa tokens on just before its part of the step
  // (past the tile's end the next tile's K rows), items with m > 1 query
  // vectors per head (see kPvTokensStepL1Gqa).
  enum class StepPrefetch { none, whole_step, per_head };

  template <std::uint32_t kStep, StepPrefetch kPrefetch>
  void pv_tile_steps(DF df, const TileRows<T>& rows, const TileRows<T>* next, std::uint32_t h0,
                     std::uint32_t nh, std::uint32_t m, Scratch& s) const {
    const std::uint32_t nt = rows.n;
    const std::size_t dimp = s.dimp;
    const T* const* next_k = next != nullptr ? next->k : nullptr;
    const std::uint32_t next_n = next != nullptr ? next->n : 0;
    for (std::uint32_t tg = 0; tg < nt; tg += kStep) {
      const std::uint32_t n = std::min(kStep, nt - tg);
      if constexpr (kPrefetch == StepPrefetch::whole_step) {
        if (tg + kStep < nt) {
          prefetch_tokens_l1(rows.v, tg + kStep, std::min(nt, tg + 2 * kStep), h0, nh);
        } else if (next != nullptr) {
          prefetch_tokens_l1(next->k, 0, std::min(next->n, kStep), h0, nh);
        }
      }
      std::uint32_t hl = 0;
      if (m == 1 && c_.dim % kC == 0) {
        for (; hl + 2 <= nh; hl += 2) pv_head_pair(df, rows, tg, n, h0, hl, s);
      }
      for (; hl < nh; ++hl) {
        if constexpr (kPrefetch == StepPrefetch::per_head) {
          prefetch_head_ahead_l1(rows.v, nt, next_k, next_n, tg + kPrefetchTokensGqa, kStep,
                                 h0 + hl);
        }
        const std::size_t off = std::size_t{h0 + hl} * c_.head_stride;
        const T* vp[kStep];
        for (std::uint32_t i = 0; i < n; ++i) vp[i] = rows.v[tg + i] + off;
        pv_head(df, s.probs.get() + std::size_t{hl} * m * kTile + tg,
                s.acc.get() + std::size_t{hl} * m * dimp, dimp, vp, n, m);
      }
    }
  }

  // Into L1: head h's rows of tokens [a, a + n) of the sequence made of
  // `first` (tokens [0, nfirst)) followed by `then` (tokens [0, nthen);
  // null: none).
  void prefetch_head_ahead_l1(const T* const* first, std::uint32_t nfirst, const T* const* then,
                              std::uint32_t nthen, std::uint32_t a, std::uint32_t n,
                              std::uint32_t h) const {
    const std::uint32_t b = a + n;
    if (a < nfirst) prefetch_tokens_l1(first, a, std::min(b, nfirst), h, 1);
    if (b > nfirst && then != nullptr) {
      const std::uint32_t ta = a > nfirst ? a - nfirst : 0;
      prefetch_tokens_l1(then, std::min(ta, nthen), std::min(b - nfirst, nthen), h, 1);
    }
  }

  // acc += p . V over the tile head by head: a head's rows are adjacent in
  // an HND page, so each head's V is read in address order.
  void pv_tile_head_major(DF df, const TileRows<T>& rows, const TileRows<T>* next, std::uint32_t h0,
                          std::uint32_t nh, std::uint32_t m, Scratch& s) const {
    const std::uint32_t nt = rows.n;
    const std::size_t dimp = s.dimp;
    const T* vp[kTile];
    for (std::uint32_t hl = 0; hl < nh; ++hl) {
      if (step_l1_) {
        if (hl + 1 < nh) {
          prefetch_tokens_l1(rows.v, 0, std::min<std::uint32_t>(nt, kN), h0 + hl + 1, 1);
        } else if (next != nullptr) {
          prefetch_tokens_l1(next->k, 0, std::min<std::uint32_t>(next->n, kN), h0, 1);
        }
      }
      const std::size_t off = std::size_t{h0 + hl} * c_.head_stride;
      for (std::uint32_t i = 0; i < nt; ++i) vp[i] = rows.v[i] + off;
      // Blocks of up to four query vectors keep their accumulators in
      // registers over the whole tile, each block reading the tile's V rows
      // (from L1 after the first). From L2, against 4-token groups: GQA 4
      // 1.12x; GQA 8 1.23x of 8 query vectors per V load (DRAM, 2 threads:
      // HND 1.15x, NHD 1.07x).
      pv_head(df, s.probs.get() + std::size_t{hl} * m * kTile,
              s.acc.get() + std::size_t{hl} * m * dimp, dimp, vp, nt, m);
    }
  }

  // One head's m query vectors (probabilities pr, stride kTile; accumulators
  // acc, stride dimp) over its V rows vp[0, n): up to 4 query vectors per V
  // load.
  void pv_head(DF df, float* pr, float* acc, std::size_t dimp, const T* const* vp, std::uint32_t n,
               std::uint32_t m) const {
    std::uint32_t i = 0;
    // The first block is the one that drives the stream (first_pass); on HND
    // heads with many query vectors it reports every kPvRowsPerReportMany rows.
    if (m >= kPvManyQueries && !heads_contiguous()) {
      pv_rows<4, kPvRowsPerReportMany>(df, pr, acc, dimp, vp, n, true);
      i = 4;
    }
    for (; i + 4 <= m; i += 4) pv_rows<4>(df, pr + i * kTile, acc + i * dimp, dimp, vp, n, i == 0);
    for (; i + 2 <= m; i += 2) pv_rows<2>(df, pr + i * kTile, acc + i * dimp, dimp, vp, n, i == 0);
    for (; i < m; ++i) pv_rows<1>(df, pr + i * kTile, acc + i * dimp, dimp, vp, n, i == 0);
  }

  // One query per head (m == 1), dim a multiple of kC: heads hl and hl + 1
  // (local) over tokens [tg, tg + n) of the tile, each token's two rows read
  // side by side; the accumulators of both heads stay in registers.
  void pv_head_pair(DF df, const TileRows<T>& rows, std::uint32_t tg, std::uint32_t n,
                    std::uint32_t h0, std::uint32_t hl, Scratch& s) const {
    constexpr int kH = 2;
    const T* vp[kH][kPvTokens];
    const T* const* vr[kH];
    const float* p[kH];
    float* acc[kH];
    for (int h = 0; h < kH; ++h) {
      const std::size_t off = std::size_t{h0 + hl + h} * c_.head_stride;
      for (std::uint32_t i = 0; i < n; ++i) vp[h][i] = rows.v[tg + i] + off;
      vr[h] = vp[h];
      p[h] = s.probs.get() + std::size_t{hl + h} * kTile + tg;
      acc[h] = s.acc.get() + std::size_t{hl + h} * s.dimp;
    }
    if (stream_.active()) {
      pv_heads_blocks<kH>(df, p, acc, vr, n, stream_for(true));
    } else {
      pv_heads_blocks<kH>(df, p, acc, vr, n, NoLinesRead{});
    }
  }

  // PvHeads over the whole row in register blocks as wide as the
  // accumulator budget allows, then narrower ones.
  template <int kH, class Stream>
  HWY_INLINE void pv_heads_blocks(DF df, const float* const* p, float* const* acc,
                                  const T* const* const* vr, std::uint32_t n,
                                  const Stream& stream) const {
    constexpr int kChMax = kAccRegs / (2 * kH) > 0 ? kAccRegs / (2 * kH) : 1;
    const std::size_t full = c_.dim;
    std::size_t d = PvHeads<kH, kChMax>(df, p, acc, vr, n, 0, full, stream);
    if constexpr (kChMax > 2) d = PvHeads<kH, 2>(df, p, acc, vr, n, d, full, stream);
    if constexpr (kChMax > 1) d = PvHeads<kH, 1>(df, p, acc, vr, n, d, full, stream);
  }

  // AttentionPrefetch::next_step_l1: the first lines of each page segment
  // of the next tile (K and V, from head h0 on) into L2, a tile ahead: the
  // step prefetches reach one block ahead, which leaves the first reads of
  // a shuffled page, where the hardware prefetcher has no stream to follow,
  // waiting a full memory latency. At most 16 lines of K and of V a tile.
  // Zen 3, DRAM, 2 threads, NHD, 10 alternated rounds: paged over
  // continuous 0.954 -> 0.968 (MHA), 0.963 -> 0.977 (GQA 4); fraction of
  // stream 0.605 -> 0.625, 0.47 -> 0.48.
  void prefetch_segment_starts_l2(const TileRows<T>& rows, std::uint32_t h0) const {
    const std::uint32_t lines = std::max<std::uint32_t>(1, 16 / rows.nseg);
    for (std::uint32_t j = 0; j < rows.nseg; ++j) {
      const std::uint32_t t = rows.seg[j];
      const char* k = reinterpret_cast<const char*>(rows.k[t] + std::size_t{h0} * c_.head_stride);
      const char* v = reinterpret_cast<const char*>(rows.v[t] + std::size_t{h0} * c_.head_stride);
      for (std::uint32_t l = 0; l < lines; ++l) {
        prefetch_l2(k + 64 * l);
        prefetch_l2(v + 64 * l);
      }
    }
  }

  // AttentionPrefetch::next_step_l1: tokens [t0, t1) of heads [h0, h0 + nh)
  // into L1 (rows are head-0 pointers).
  void prefetch_tokens_l1(const T* const* rows, std::uint32_t t0, std::uint32_t t1,
                          std::uint32_t h0, std::uint32_t nh) const {
    const std::size_t bytes = std::size_t{c_.dim} * sizeof(T);
    for (std::uint32_t t = t0; t < t1; ++t) {
      for (std::uint32_t hl = 0; hl < nh; ++hl)
        prefetch_range_l1(rows[t] + std::size_t{h0 + hl} * c_.head_stride, bytes);
    }
  }

  // NHD: a token's heads are one contiguous run; HND: one run per head.
  bool heads_contiguous() const { return c_.head_stride == c_.dim; }
  // Whether the tile loops go head by head rather than token-major: where a
  // head's rows are adjacent (HND), and on NHD pages from
  // kNhdHeadMajorVectors query vectors per head on, or when the probe found
  // the item's rows in the caches (token-major order only helps the hardware
  // prefetchers fetch from DRAM). DRAM, 2 threads, against token-major on the
  // same HND pages: MHA 1.30x, GQA 2 1.28x, GQA 4 1.08x; GQA 8 1.12x of NHD.
  bool head_major() const { return head_major_; }

  // Whether bf16 pair products can serve this element type.
  static constexpr bool kDotT = kHaveDotBF16 && std::is_same_v<T, hwy::bfloat16_t>;
  const AttentionCtx& c_;
  // AttentionPrecision::bf16 by pair products (vdpbf16ps), see kHaveDotBF16:
  // chosen for the current item.
  bool dot_ = false;
  // The worker's probability rows and their packed pairs (Scratch).
  const float* probs_ = nullptr;
  std::uint32_t* pairs_ = nullptr;
  mutable PrefetchStream<T> stream_;
  // Per item; read in the inlined loops.
  bool head_major_ = false;
  bool step_l1_ = false;  // AttentionPrefetch::next_step_l1 for this item
};

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_TILE_LOOPS_INL_H_ (per target)
