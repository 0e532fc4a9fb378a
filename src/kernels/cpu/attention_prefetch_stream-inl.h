// The prefetch stream of the CPU attention kernel, per Highway target
// (included through attention_cpu-inl.h): the rows of the tile ahead issued
// as prefetches at the rate the score and PV loops read the current tile
// (AttentionPrefetch::next_tile_l2 / next_tile_l1), and the callbacks
// through which the loops report what they read.
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_PREFETCH_STREAM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_PREFETCH_STREAM_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_PREFETCH_STREAM_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_PREFETCH_STREAM_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/cpu/attention_blocks-inl.h"
#include "kernels/cpu/kernel_common.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {

// The online softmax's share of a tile's time, before it has been measured,
// and the most it is taken to be (see PrefetchStream::time_softmax).
constexpr float kSoftmaxShareGuess = 0.1f;
constexpr float kSoftmaxShareMax = 0.25f;
// One streaming tile in this many is timed for the softmax's share.
constexpr std::uint32_t kTimedTileEvery = 8;

// int8 caches: the scales of a tile's K and V rows (KV head 0; head h's is
// the pointer + h * head_stride / dim). Empty for the other element types.
template <class T, bool = kPageScales<T>>
struct TileScales {};
template <class T>
struct TileScales<T, true> {
  const float* k[kTile];
  const float* v[kTile];
};

// K and V row pointers of KV head 0 for the tokens of one tile (head h's
// row is the pointer + h * head_stride). Tiles may span pages.
template <class T>
struct TileRows {
  const T* k[kTile];
  const T* v[kTile];
  std::uint32_t n = 0;
  // Page segments: rows [seg[j], seg[j + 1]) lie in one page (j < nseg).
  std::uint8_t seg[kTile + 1];
  std::uint32_t nseg = 0;
  [[no_unique_address]] TileScales<T> scales;
};

// The prefetch stream of AttentionPrefetch::next_tile_l2 / next_tile_l1:
// while one tile runs, the rows of the tile kPrefetchTilesAhead on (the far
// tile) are prefetched, not at once but at the rate the score and PV loops
// read: the loops report the lines they consume and report(lines) issues as
// many lines of the far tile. A burst of ~256 prefetches per step stalled
// the core on Zen 4 until misses drained; spreading them at the read rate
// took decode from 11.1 to 14.6 GB/s (MHA) and 7.1 to 12.0 (GQA 4) on one
// thread.
//
// The stream walks the far tile as a sequence of ranges, all K ranges before
// the V ones, each a page segment's rows of one unit: one head on HND pages,
// all heads on NHD pages (a segment of whole token rows is one run there).
// An NHD item with only some of the heads walks K and V lines alternately
// row by row ("pairs", Range::q the V line beside Range::p). The walk
// follows the order the loops read in, not address order (which measured
// 0.95-0.97x on HND pages). Cursor says which range is next; range_ holds
// the lines of the current one still to issue.
//
// Past an item's last tile the far tile is the first one of the item the
// runner will run next (ItemRunner::run claims it early).
//
// The online softmax reads nothing, so with every prefetch tied to the lines
// the loops read, memory would idle through it: the softmax sends out its
// share s of the tile's time in prefetches (s measured on one tile in
// kTimedTileEvery, see time_softmax), and the loops (1 - s) per line they
// read (DRAM, 2 threads: HND GQA 4 1.10x, MHA 1.00-1.07x).
template <class T>
class PrefetchStream {
 public:
  explicit PrefetchStream(const AttentionCtx& c) : c_(c) {}

  // Per item: whether the stream walks K and V lines of a row alternately
  // (NHD rows that hold more than the item's heads).
  void set_pairs(bool pairs) { pairs_ = pairs; }
  // Whether a far tile is being streamed (between start and finish).
  bool active() const { return active_; }
  // Lines to issue per softmax update of the current tile.
  std::uint32_t softmax_lines() const { return softmax_lines_; }
  // Whether to time the current tile for the softmax's share: one streaming
  // tile in kTimedTileEvery (the TSC costs ~40 cycles a read; timing every
  // tile took MHA from L2 to 0.94x).
  bool time_this_tile() { return active_ && ++tiles_ % kTimedTileEvery == 0; }

  // Starts streaming the tile `rows` (heads [h0, h0 + nh)) while the current
  // tile runs with `softmax_calls` softmax updates.
  void start(const TileRows<T>& rows, std::uint32_t h0, std::uint32_t nh,
             std::uint32_t softmax_calls) {
    // NHD: one unit, the item's heads of a row; HND: one unit per head.
    const std::size_t row_bytes = std::size_t{c_.dim} * sizeof(T);
    const bool nhd = heads_contiguous();
    const std::uint32_t units = nhd ? 1 : nh;
    const std::size_t unit_bytes = nhd ? nh * row_bytes : row_bytes;
    cursor_ = {&rows, h0, units, unit_bytes, 0, 0, 0, rows.n == 0};
    // The softmax sends out its share of the tile's time in lines, the loops
    // the rest in step with what they read.
    const auto lines = static_cast<float>(tile_lines(rows, unit_bytes, units));
    softmax_lines_ =
        static_cast<std::uint32_t>(lines * softmax_share_ / static_cast<float>(softmax_calls));
    scale_ = static_cast<std::uint32_t>((1.0f - softmax_share_) * kOne);
    frac_ = 0;
    active_ = true;
    next_range();
  }

  // Averages a timed tile's softmax share (its softmax took `softmax` ticks
  // of the tile's `whole`) into the estimate.
  void time_softmax(std::uint64_t softmax, std::uint64_t whole) {
    if (whole == 0) return;
    const float share = static_cast<float>(softmax) / static_cast<float>(whole);
    softmax_share_ = std::min(kSoftmaxShareMax, 0.5f * (softmax_share_ + share));
  }

  // Lines the stream issues for a tile: each range rounded up to whole lines.
  std::uint32_t tile_lines(const TileRows<T>& rows, std::size_t unit_bytes,
                           std::uint32_t units) const {
    std::size_t lines = 0;
    if (pairs_) {
      lines = std::size_t{rows.n} * 2 * ((unit_bytes + 63) / 64);
    } else {
      for (std::uint32_t j = 0; j < rows.nseg; ++j)
        lines += ((rows.seg[j + 1] - rows.seg[j]) * unit_bytes + 63) / 64;
      lines *= 2 * std::size_t{units};
    }
    return static_cast<std::uint32_t>(lines);
  }

  // Issues what the loops left.
  void finish() {
    issue(~0u);
    cursor_.done = true;
    range_ = {};
    softmax_lines_ = 0;
    active_ = false;
  }

  // The loops' reports of `lines` read: scale_ / kOne as many
  // prefetches (the softmax issues the rest). Branching around the scaling
  // where it is 1 grew the loops (MHA from L2 0.75x); a countdown that
  // skipped every n-th report cost 0.92x.
  HWY_INLINE void report(std::uint32_t lines) {
    const std::uint64_t owed = std::uint64_t{lines} * scale_ + frac_;
    issue(static_cast<std::uint32_t>(owed / kOne));
    frac_ = static_cast<std::uint32_t>(owed % kOne);
  }

  // Up to `lines` prefetches from the current range on. Inlined into the
  // loops: per call a compare or two and the prefetches; finding the next
  // range happens once per range. The stream that found its place anew on
  // every call (out of line) took 27 % of MHA's time from L2 with
  // head-major loops, and cost token-major MHA 17-26 % there
  //. Finding the next range is inlined
  // too: a call in the loops clobbers every vector register, and GCC 12
  // saved and restored the PV loop's accumulators around every report
  // (per token for MHA). Inlined, from L2, 1 thread: streamed HND MHA 1.28x,
  // NHD MHA 1.09x, GQA 4 1.05-1.09x; unstreamed GQA 4 1.05-1.085x; DRAM in
  // the slow memory state 0.97-1.01x.
  HWY_INLINE void issue(std::uint32_t lines) {
    if (pairs_) {
      if (l1_) return issue_ranges<true, true>(lines);
      issue_ranges<true, false>(lines);
    } else {
      if (l1_) return issue_ranges<false, true>(lines);
      issue_ranges<false, false>(lines);
    }
  }

  // One line of the stream: prefetcht0 (next_tile_l1) or prefetcht1 (next_tile_l2).
  template <bool kL1>
  static HWY_INLINE void issue_line(const char* p) {
    if constexpr (kL1) {
      prefetch_l1(p);
    } else {
      prefetch_l2(p);
    }
  }

  // kPair: each range is a K run with its V run beside it (range_.q).
  // kL1: the lines are requested with prefetcht0 (next_tile_l1), though they
  // are wanted a tile later: on Zen 5, in DRAM, 2 threads, slow memory
  // state, against prefetcht1: MHA 1.02-1.10x, GQA 4 1.02-1.045x, batch 1
  // at 32k 1.055x; prefetchnta 0.99-1.07x, prefetcht2 0.91-1.02x. In the
  // fast state it cost the compute-bound GQA 4 6 % until the range walk
  // below was inlined (then 1.00x); with it, prefetcht1 read 0.91x for NHD
  // MHA. The lines still land in L2; most
  // have left L1 by the time the loops read them. On Zen 4 prefetcht0 barely
  // got ahead of memory and prefetcht1 read 1.3-2.0x of it.
  template <bool kPair, bool kL1>
  HWY_INLINE void issue_ranges(std::uint32_t lines) {
    while (range_.p != nullptr) {
      const std::size_t avail = static_cast<std::size_t>(range_.end - range_.p) / 64;
      if constexpr (kPair) {
        const std::size_t n = std::min<std::size_t>((std::size_t{lines} + 1) / 2, avail);
        for (std::size_t i = 0; i < n; ++i) {
          issue_line<kL1>(range_.p + 64 * i);
          issue_line<kL1>(range_.q + 64 * i);
        }
        range_.p += 64 * n;
        range_.q += 64 * n;
        lines = lines > 2 * n ? lines - static_cast<std::uint32_t>(2 * n) : 0;
      } else {
        const std::size_t n = std::min<std::size_t>(lines, avail);
        for (std::size_t i = 0; i < n; ++i) issue_line<kL1>(range_.p + 64 * i);
        range_.p += 64 * n;
        lines -= static_cast<std::uint32_t>(n);
      }
      if (lines == 0) return;
      next_range();
    }
  }

  // Loads the next range into range_ (p == nullptr once the tile is done)
  // and advances the cursor.
  HWY_INLINE void next_range() {
    Cursor& c = cursor_;
    if (c.done) {
      range_ = {};
      return;
    }
    const TileRows<T>& rows = *c.rows;
    if (!pairs_) {
      const std::uint32_t r0 = rows.seg[c.inner];
      const T* first = c.phase == 0 ? rows.k[r0] : rows.v[r0];
      const std::size_t bytes = (rows.seg[c.inner + 1] - r0) * c.unit_bytes;
      range_.p =
          reinterpret_cast<const char*>(first + std::size_t{c.h0 + c.outer} * c_.head_stride);
      range_.q = nullptr;
      range_.end = range_.p + (bytes + 63) / 64 * 64;
      if (++c.inner == rows.nseg) {
        c.inner = 0;
        if (++c.outer == c.units) {
          c.outer = 0;
          c.done = ++c.phase == 2;
        }
      }
      return;
    }
    // Pairs (NHD, some of the heads): the item's heads of row `outer` are one run.
    const std::size_t off = std::size_t{c.h0} * c_.head_stride;
    const std::size_t bytes = c.unit_bytes;
    range_.p = reinterpret_cast<const char*>(rows.k[c.outer] + off);
    range_.q = reinterpret_cast<const char*>(rows.v[c.outer] + off);
    range_.end = range_.p + (bytes + 63) / 64 * 64;
    c.done = ++c.outer == rows.n;
  }

 private:
  struct Cursor {
    const TileRows<T>* rows = nullptr;
    std::uint32_t h0 = 0;        // the item's first head
    std::uint32_t units = 0;     // runs per page segment (heads on HND, 1 on NHD)
    std::size_t unit_bytes = 0;  // bytes of one row of a unit
    // Segments: unit (from h0), page segment. Pairs: the row (inner unused).
    std::uint32_t outer = 0, inner = 0;
    std::uint32_t phase = 0;  // segments: 0 K, 1 V
    bool done = true;
  };
  struct Range {
    const char* p = nullptr;    // next line
    const char* q = nullptr;    // pairs: the V line beside p; else null
    const char* end = nullptr;  // end of p's range (whole lines)
  };

  // NHD: a token's heads are one contiguous run; HND: one run per head.
  bool heads_contiguous() const { return c_.head_stride == c_.dim; }

  const AttentionCtx& c_;
  Cursor cursor_;
  Range range_;
  // Pacing (start): prefetches per line the loops read, in 1/kOne, the
  // fraction owed, lines per softmax update, whether a far tile is being
  // streamed, the softmax's share of a tile's time, and the tiles streamed.
  static constexpr std::uint32_t kOne = 1u << 16;
  std::uint32_t scale_ = kOne, frac_ = 0;
  std::uint32_t softmax_lines_ = 0;
  bool active_ = false;
  float softmax_share_ = kSoftmaxShareGuess;
  std::uint32_t tiles_ = 0;
  // The lines go out as prefetcht0 (next_tile_l1), else prefetcht1.
  const bool l1_ = c_.prefetch == AttentionPrefetch::next_tile_l1;
  bool pairs_ = false;  // K and V lines of a row alternately
};

// The loops' lines-read callback: the first pass over the tile's rows (K in
// the score loop, V in the PV loop) drives the stream; later query blocks
// re-read rows that are already cached. A functor rather than a lambda so
// that it is inlined into the loops (GCC 12 called the lambda out of line:
// 6 % of MHA's time from L2).
template <class T>
struct LinesRead {
  PrefetchStream<T>* stream;
  bool first_pass;
  HWY_INLINE void operator()(std::uint32_t lines) const {
    if (first_pass) stream->report(lines);
  }
};
// For loops whose pass does not drive the stream (later query blocks, or no
// stream at all): reports cost nothing. The loops are instantiated with it
// where they would have taken LinesRead{first_pass = false}, whose flag
// GCC 12 tested on every token of the PV loop and every row of the score
// loop, and which made it spill the AVX2 4-query score loop. Zen 3 (AVX2),
// from L2, 1 thread: GQA 4 1.26x, MHA 1.14x.
struct NoLinesRead {
  HWY_INLINE void operator()(std::uint32_t) const {}
};

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_PREFETCH_STREAM_INL_H_ (per target)
