// The decode item runner of the CPU attention kernel, per Highway target
// (included through attention_cpu-inl.h): one work item's queries, its
// tiles in flight (the residency probe, the page-table walk, the prefetch
// stream running one tile ahead and on into the next item), and its output
// or split partials.
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_ITEM_RUNNER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_ITEM_RUNNER_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_ITEM_RUNNER_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_ITEM_RUNNER_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "kernels/cpu/attention_blocks-inl.h"
#include "kernels/cpu/attention_dot_bf16-inl.h"
#include "kernels/cpu/attention_prefetch_stream-inl.h"
#include "kernels/cpu/attention_softmax-inl.h"
#include "kernels/cpu/attention_tile_loops-inl.h"
#include "kernels/cpu/kernel_common.h"
#include "kernels/cpu/round_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tiles whose row pointers are kept: the current one and those ahead.
constexpr std::uint32_t kRing = kPrefetchTilesAhead + 2;

// Runs decode work items (and prefill items the query-lanes path does not
// take) on one worker: loads the item's queries, walks its KV tokens a tile
// at a time through TileRunner, keeps the prefetch stream running one tile
// ahead (into the next item past the last tile), and writes the output or
// the item's (max, sum, acc) partials.
template <class T>
class ItemRunner : private TileRunner<T> {
  using Base = TileRunner<T>;
  using Base::c_;
  using Base::dot_;
  using Base::head_major_;
  using Base::heads_contiguous;
  using Base::kDotT;
  using Base::pairs_;
  using Base::probs_;
  using Base::step_l1_;
  using Base::stream_;
  using Base::tile;

 public:
 public:
  explicit ItemRunner(const AttentionCtx& c)
      : Base(c), dot_capable_(kDotT && c.bf16_inputs && c.dim % kC == 0 && cpu_has_avx512_bf16()) {}

  // Runs one item. `claim_next()` is called at most once, when the stream
  // runs out of the item's tiles: it returns the item this runner will run
  // next, or null, and the stream goes on into that item's first tiles so that
  // memory does not idle across the boundary (only decode items over the
  // same heads qualify).
  template <class ClaimNext>
  void run(const WorkItem& it, Scratch& s, float* partial, ClaimNext&& claim_next) {
    const std::uint32_t dim = c_.dim;
    const std::uint32_t nrows = it.r1 - it.r0;
    const std::uint32_t m_per_head = nrows * c_.group;
    const std::uint32_t nh = it.h1 - it.h0;
    const std::size_t total = std::size_t{nh} * m_per_head;
    const std::uint32_t tiles = (it.t1 - it.t0 + kTile - 1) / kTile;
    const bool resident = rows_resident(it, tiles);
    // Rows already in the caches need no prefetcher-friendly walk: NHD items
    // go head by head there too (as HND ones do; see head_major()).
    head_major_ = !heads_contiguous() || m_per_head >= kNhdHeadMajorVectors || resident;
    // Rows the probe found cached run without prefetches either way.
    step_l1_ = c_.prefetch == AttentionPrefetch::next_step_l1 && !resident;
    // NHD rows hold only the item's heads when it has them all (decode).
    stream_.set_pairs(heads_contiguous() && std::size_t{nh} * dim != c_.token_stride);
    // The pair products only where each K/V row serves several query vectors
    // and the loops are not streaming rows in from memory; the f32 loops
    // compute the same rounded products. Cached, 2 threads: GQA 2 1.09-1.12x,
    // GQA 4 1.13-1.18x, GQA 8 1.15x, but MHA 0.95-0.97x; streamed from DRAM
    // they only made the wait longer (HND GQA 4 0.92-0.94x in the slow
    // memory state).
    dot_ = dot_capable_ && m_per_head >= 2 && (!stream_chosen() || resident);
    s.ensure(total, dim);
    probs_ = s.probs.get();
    pairs_ = s.pairs.get();
    load_queries(it, s);
    std::fill(s.mx.begin(), s.mx.begin() + total, -std::numeric_limits<float>::infinity());
    std::fill(s.lv.get(), s.lv.get() + total * kN, 0.0f);
    std::fill(s.acc.get(), s.acc.get() + total * s.dimp, 0.0f);
    // Row i (local) of the item sees tokens < first_limit + i.
    const std::uint32_t first_limit = c_.cache_lengths[it.b] + (it.r0 - c_.row_offsets[it.b]) + 1;
    // Row pointers (KV head 0) of the tiles in flight: [k % kRing] is tile k;
    // head h's row is the pointer + h * head_stride. One page-table walk per tile.
    TileRows<T> ring[kRing];
    const bool streaming = stream_chosen() && !resident;
    const std::uint32_t ahead = streaming ? kPrefetchTilesAhead : 1;
    for (std::uint32_t k = 0; k <= ahead && k < tiles; ++k) fill_tile(it, k, ring[k]);
    const WorkItem* following = nullptr;  // the runner's next item, once claimed
    bool claimed = false;
    for (std::uint32_t k = 0; k < tiles; ++k) {
      const TileRows<T>& cur = ring[k % kRing];
      const std::uint32_t ta = it.t0 + k * kTile;  // tile k's first token
      const TileRows<T>* next = k + 1 < tiles ? &ring[(k + 1) % kRing] : nullptr;
      const TileRows<T>* far = k + ahead < tiles ? &ring[(k + ahead) % kRing] : nullptr;
      if (streaming && far == nullptr) {
        // Past the item's end: the tile k + ahead - tiles of the next item.
        if (!claimed) {
          claimed = true;
          following = claim_next();
          if (following != nullptr && !continues_stream(it, *following)) following = nullptr;
        }
        const std::uint32_t j = k + ahead - tiles;
        if (following != nullptr && std::uint64_t{j} * kTile < following->t1 - following->t0) {
          fill_tile(*following, j, carry_);
          far = &carry_;
        }
      }
      if (streaming && far != nullptr) {
        // The rows of the tile `ahead` tiles on, into L2, issued from inside
        // the score and PV loops as they consume this tile's rows.
        stream_.start(*far, it.h0, nh, nh * m_per_head);
      }
      tile(cur, next, ta, it.h0, nh, m_per_head, first_limit, s);
      stream_.finish();
      if (k + ahead + 1 < tiles) fill_tile(it, k + ahead + 1, ring[(k + ahead + 1) % kRing]);
    }
    const DF df;
    for (std::size_t i = 0; i < total; ++i)
      s.l[i] = ReduceSum(df, hn::Load(df, s.lv.get() + i * kN));
    if (partial == nullptr) {
      write_output(it, s);
    } else {
      std::copy_n(s.mx.begin(), total, partial);
      std::copy_n(s.l.begin(), total, partial + total);
      for (std::size_t i = 0; i < total; ++i) {
        const auto h = static_cast<std::uint32_t>(it.h0 + i / m_per_head);
        unlayout(s.acc.get() + i * s.dimp, output_factor(h), partial + 2 * total + i * dim);
      }
    }
  }

 private:
  // Whether the stream may run on from item `it` into `following`: a decode
  // item over the same heads, so that the walk's unit is the same.
  static bool continues_stream(const WorkItem& it, const WorkItem& following) {
    return !following.prefill && following.h0 == it.h0 && following.h1 == it.h1;
  }

  // Whether the probe (AttentionCtx::probe_residency) finds a decode item's
  // rows in the caches: the first line of kProbeRows K and V rows spread
  // over its tokens (never its last token, which a store has just written).
  // Items under kProbeMinTiles tiles and prefill items are not probed (they
  // stream). Once a probe finds rows outside the caches, the runner streams the
  // call's later items without probing them: a probe of rows in DRAM stalls
  // for about one memory latency, one of cached rows takes ~0.1 us.
  bool rows_resident(const WorkItem& it, std::uint32_t tiles) {
    if (!c_.probe_residency || it.prefill || tiles < kProbeMinTiles || !maybe_resident_) {
      return false;
    }
    const void* lines[kProbeRows];
    const std::uint32_t n = it.t1 - it.t0;
    for (std::uint32_t i = 0; i < kProbeRows; ++i) {
      const auto tok =
          it.t0 + static_cast<std::uint32_t>((std::uint64_t{2 * i + 1} * n) / (2 * kProbeRows));
      lines[i] = row(i % 2 == 0 ? c_.k : c_.v, it.b, tok, it.h0);
    }
    maybe_resident_ = lines_resident(lines, kProbeRows);
    return maybe_resident_;
  }

  // Tiles may span pages (rows are addressed one by one).
  static std::uint32_t tile_end(std::uint32_t ta, std::uint32_t t1) {
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(t1, std::uint64_t{ta} + kTile));
  }

  // rows = the K/V rows of tile k: tokens [t0 + k * kTile, + kTile) of the item.
  void fill_tile(const WorkItem& it, std::uint32_t k, TileRows<T>& rows) const {
    rows.n = 0;
    rows.nseg = 0;
    const std::uint32_t ta = it.t0 + k * kTile;
    append_rows(it.b, ta, tile_end(ta, it.t1), rows);
    if constexpr (kPageScales<T>) prefetch_scales(rows, it.h0, it.h1);
  }

  // int8: the lines of the item's scales (heads [h0, h1)) of each page
  // segment of the tile into L2: the prefetch stream and the hardware
  // prefetchers follow the value rows, and the scales lie apart from them.
  void prefetch_scales(const TileRows<T>& rows, std::uint32_t h0, std::uint32_t h1) const {
    const std::size_t hs = c_.head_stride / c_.dim;
    const bool one_run = heads_contiguous();  // NHD: every head of a row side by side
    for (std::uint32_t j = 0; j < rows.nseg; ++j) {
      const std::uint32_t a = rows.seg[j], z = rows.seg[j + 1] - 1;
      for (std::uint32_t h = h0; h < (one_run ? h0 + 1 : h1); ++h) {
        const std::size_t first = h * hs, last = one_run ? (h1 - 1) * hs : h * hs;
        prefetch_span_l2(rows.scales.k[a] + first, rows.scales.k[z] + last);
        prefetch_span_l2(rows.scales.v[a] + first, rows.scales.v[z] + last);
      }
    }
  }

  // The lines of [first, last] into L2.
  static void prefetch_span_l2(const float* first, const float* last) {
    const char* p = reinterpret_cast<const char*>(first);
    const char* end = reinterpret_cast<const char*>(last + 1);
    for (; p < end; p += 64) prefetch_l2(p);
    prefetch_l2(end - 1);
  }

  // Appends the K/V rows of tokens [ta, tb) (head 0), one page-table lookup
  // per page.
  void append_rows(std::uint32_t b, std::uint32_t ta, std::uint32_t tb, TileRows<T>& rows) const {
    std::uint32_t tok = ta;
    while (tok < tb) {
      rows.seg[rows.nseg++] = static_cast<std::uint8_t>(rows.n);
      const std::uint32_t run_end = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(tb, (std::uint64_t{tok} / c_.page + 1) * c_.page));
      const T* kr = row(c_.k, b, tok, 0);
      const T* vr = row(c_.v, b, tok, 0);
      if constexpr (kPageScales<T>) append_scales(b, tok, run_end - tok, rows);
      for (; tok < run_end; ++tok, kr += c_.token_stride, vr += c_.token_stride) {
        rows.k[rows.n] = kr;
        rows.v[rows.n] = vr;
        ++rows.n;
      }
    }
    rows.seg[rows.nseg] = static_cast<std::uint8_t>(rows.n);
  }

  // int8: the scales (KV head 0) of n tokens from tok on, all in one page,
  // as rows.scales[rows.n ...]: the block's floats after its values, the one
  // of (row, head) at (row * token_stride + head * head_stride) / dim.
  void append_scales(std::uint32_t b, std::uint32_t tok, std::uint32_t n, TileRows<T>& rows) const {
    const std::uint32_t block = c_.lookup[std::size_t{b} * c_.lookup_stride + tok / c_.page];
    const std::size_t first = std::size_t{tok % c_.page} * c_.token_stride / c_.dim;
    const std::size_t step = c_.token_stride / c_.dim;
    const auto* kb = static_cast<const std::uint8_t*>(c_.k.blocks) +
                     std::size_t{block} * c_.k.block_stride + c_.scales_offset;
    const auto* vb = static_cast<const std::uint8_t*>(c_.v.blocks) +
                     std::size_t{block} * c_.v.block_stride + c_.scales_offset;
    const auto* ks = reinterpret_cast<const float*>(kb) + first;
    const auto* vs = reinterpret_cast<const float*>(vb) + first;
    for (std::uint32_t i = 0; i < n; ++i) {
      rows.scales.k[rows.n + i] = ks + i * step;
      rows.scales.v[rows.n + i] = vs + i * step;
    }
  }

  const T* row(const LayerRef& ref, std::uint32_t b, std::uint32_t tok, std::uint32_t h) const {
    const std::uint32_t block = c_.lookup[std::size_t{b} * c_.lookup_stride + tok / c_.page];
    return static_cast<const T*>(ref.blocks) + std::size_t{block} * ref.block_stride +
           std::size_t{tok % c_.page} * c_.token_stride + std::size_t{h} * c_.head_stride;
  }

  void load_queries(const WorkItem& it, Scratch& s) const {
    const std::uint32_t dim = c_.dim;
    const std::size_t q_row = std::size_t{c_.n_q} * dim;
    std::size_t idx = 0;
    for (std::uint32_t h = it.h0; h < it.h1; ++h) {
      for (std::uint32_t r = it.r0; r < it.r1; ++r) {
        for (std::uint32_t g = 0; g < c_.group; ++g, ++idx) {
          const float* src = c_.q + r * q_row + std::size_t{h * c_.group + g} * dim;
          float* q = s.qs.get() + idx * s.dimp;
          ToLayout<T>(src, dim, kIsCode<T> ? c_.scale * query_factor(h) : c_.scale, q);
          if (c_.bf16_inputs) RoundRowToBF16(DF(), q, s.dimp);
          if constexpr (kDotT) {
            if (dot_) PackQuery(q, s.dimp, s.qb.get() + idx * s.dimp / 2);
          }
        }
      }
    }
  }

  // 8-bit codes: what KV head h's queries are scaled by beyond the softmax
  // scale (the codes' unit and fp8's static K scale; int8's per-row scales
  // multiply the scores in the tile loops), and what its outputs are (the
  // unit and fp8's V scale). 1 for the other element types.
  float query_factor(std::uint32_t h) const {
    if constexpr (kIsCode<T> && !kPageScales<T>) return kCodeUnit<T> * c_.k_head_scales[h];
    (void)h;
    return kCodeUnit<T>;
  }
  float output_factor(std::uint32_t h) const {
    if constexpr (kIsCode<T> && !kPageScales<T>) return kCodeUnit<T> * c_.v_head_scales[h];
    (void)h;
    return kCodeUnit<T>;
  }

  // dst[d] = acc[LayoutPos(d)] * scale for d < dim.
  void unlayout(const float* acc, float scale, float* dst) const {
    FromLayout<T>(acc, c_.dim, scale, dst);
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
          unlayout(s.acc.get() + idx * s.dimp, kIsCode<T> ? output_factor(h) * inv : inv, dst);
        }
      }
    }
  }

  // Whether the call streams the next tile (next_tile_l2 or next_tile_l1).
  bool stream_chosen() const {
    return c_.prefetch == AttentionPrefetch::next_tile_l2 ||
           c_.prefetch == AttentionPrefetch::next_tile_l1;
  }

  // AttentionPrecision::bf16 by pair products possible for this call.
  const bool dot_capable_;
  // Residency probe (rows_resident): false once a probe in this call found
  // rows outside the caches.
  static constexpr std::uint32_t kProbeRows = 16;
  static constexpr std::uint32_t kProbeMinTiles = 4;
  bool maybe_resident_ = true;
  // Rows of the next item's tile that the stream walks past an item's end
  // (last: the members above are read in the loops, at short offsets).
  TileRows<T> carry_;
};

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_ITEM_RUNNER_INL_H_ (per target)
