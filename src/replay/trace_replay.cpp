#include "kvcache/replay/trace_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <string>
#include <utility>

#include "kvcache/error.h"
#include "kvcache/paged_manager.h"
#include "replay/offline_belady.h"
#include "replay/replay_tiers.h"

namespace kvcache {

namespace {

std::uint32_t mix32(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return static_cast<std::uint32_t>((x ^ (x >> 31)) & 0x7fffffff);
}

std::uint64_t pages_for(std::uint64_t tokens, std::uint32_t ps) { return (tokens + ps - 1) / ps; }

using Clock = std::chrono::steady_clock;

std::string num(double v) { return std::to_string(v); }
std::string num(std::uint64_t v) { return std::to_string(v); }

// input_length must need exactly the request's hash ids (512 tokens each).
void check_blocks(const TraceRequest& r) {
  const std::uint64_t blocks = r.hash_ids.size();
  if (r.input_length > blocks * kTraceBlockTokens ||
      (blocks > 0 && r.input_length <= (blocks - 1) * kTraceBlockTokens)) {
    throw InvalidArgument("input_length " + std::to_string(r.input_length) + " does not fit " +
                          std::to_string(blocks) + " hash ids of " +
                          std::to_string(kTraceBlockTokens) + " tokens");
  }
}

// Each request's numbers against the limits of trace_replay.h, before any
// allocation is sized by them.
void check_request(const TraceRequest& r, std::size_t index) {
  const std::string name = "trace request " + num(std::uint64_t{index}) + ": ";
  if (!(r.timestamp_ms >= 0) || !std::isfinite(r.timestamp_ms)) {
    throw InvalidArgument(name + "timestamp " + num(r.timestamp_ms) +
                          " ms is not a finite number >= 0");
  }
  for (const auto& [field, value] :
       {std::pair{"input_length", r.input_length}, std::pair{"output_length", r.output_length}}) {
    if (value > kMaxTraceRequestTokens) {
      throw InvalidArgument(name + field + " " + num(std::uint64_t{value}) +
                            " exceeds the limit of " + num(std::uint64_t{kMaxTraceRequestTokens}));
    }
  }
  try {
    check_blocks(r);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(name + e.what());
  }
}

void check_options(const ReplayOptions& o) {
  if (o.page_size == 0 || o.page_size > kMaxTraceRequestTokens) {
    throw InvalidArgument("page size " + num(std::uint64_t{o.page_size}) + " is outside [1, " +
                          num(std::uint64_t{kMaxTraceRequestTokens}) + "]");
  }
  if (o.capacity_tokens / o.page_size > kMaxReplayPages) {
    throw InvalidArgument("capacity " + num(o.capacity_tokens) + " tokens is " +
                          num(o.capacity_tokens / o.page_size) + " pages of " +
                          num(std::uint64_t{o.page_size}) + ", more than the limit of " +
                          num(kMaxReplayPages));
  }
  if (o.max_batch > kMaxReplayBatch) {
    throw InvalidArgument("max_batch " + num(std::uint64_t{o.max_batch}) +
                          " exceeds the limit of " + num(std::uint64_t{kMaxReplayBatch}));
  }
  if (!o.sequential && !(o.decode_tokens_per_s > 0 && std::isfinite(o.decode_tokens_per_s))) {
    throw InvalidArgument("decode rate " + num(o.decode_tokens_per_s) +
                          " tokens/s must be a finite positive number");
  }
  replay::check_tiers(o.tiers, o.page_size);
  if (o.offline_belady && o.tiers.any()) {
    throw InvalidArgument("the offline optimum (belady) replays no tiers: drop the tier options");
  }
}

// Accumulates the wall time of the manager calls made inside `f`.
template <class F>
auto timed(std::uint64_t& ns, F&& f) {
  const auto t0 = Clock::now();
  struct Add {
    std::uint64_t& ns;
    Clock::time_point t0;
    ~Add() {
      ns += static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    }
  } add{ns, t0};
  return f();
}

// The pages the replay's requests need: the longest one's and all together.
struct TraceShape {
  std::uint64_t max_len = 1, all_pages = 0;
  TraceShape(std::span<const TraceRequest> trace, std::uint32_t page_size) {
    for (const TraceRequest& r : trace) {
      const std::uint64_t len = std::uint64_t{r.input_length} + r.output_length + 1;
      max_len = std::max(max_len, len);
      all_pages += pages_for(len, page_size);
    }
  }
};

KVCacheParams replay_params(std::uint32_t page_size) {
  return KVCacheParams{.dtype = DType::f32,
                       .num_layers = 1,
                       .n_kv_heads = 1,
                       .head_dim = 1,
                       .cache_strategy = CacheStrategy::paged,
                       .page_size = page_size,
                       .enable_prefix_caching = true};
}

std::uint32_t batch_of(const ReplayOptions& o) {
  return o.sequential ? 1 : std::max<std::uint32_t>(o.max_batch, 1);
}

// Staging for every page one call may evict: a whole request, or one page
// for each sequence of a decode step.
std::uint32_t staging_pages_for(const TraceShape& shape, const ReplayOptions& o) {
  const std::uint64_t most =
      std::max<std::uint64_t>(pages_for(shape.max_len, o.page_size), batch_of(o));
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(most, 16, 65536));
}

class Replayer {
 public:
  Replayer(std::span<const TraceRequest> trace, const ReplayOptions& o)
      : trace_(trace),
        opt_(o),
        shape_(trace, o.page_size),
        tiers_(
            replay::open_tiers(replay_params(o.page_size), o.tiers, staging_pages_for(shape_, o))),
        manager_(make_manager(shape_, o, tiers_.config)) {
    result_.capacity_pages = manager_.total_blocks();
    result_.media.push_back({.name = "device"});
    const ManagerStats stats = manager_.stats();
    for (std::size_t t = 0; t < stats.tiers.size(); ++t) {
      result_.media.push_back({.name = stats.tiers[t].name});
      result_.media.back().pages_at_start = tiers_.pages_at_start[t];
    }
  }

  ReplayResult run() {
    if (opt_.sequential) {
      run_sequential();
    } else {
      run_timed();
    }
    settle();
    result_.evictions = manager_.metrics().evictions;
    note_tiers();
    return result_;
  }

 private:
  static PagedKVCacheManager make_manager(const TraceShape& shape, const ReplayOptions& o,
                                          TierConfig tiers) {
    const std::uint64_t max_len = shape.max_len, all_pages = shape.all_pages;
    if (o.capacity_tokens == 0 && all_pages > kMaxReplayPages) {
      throw InvalidArgument("the trace needs " + num(all_pages) + " pages of " +
                            num(std::uint64_t{o.page_size}) + " without a capacity, more than " +
                            "the limit of " + num(kMaxReplayPages) + ": set a capacity");
    }
    std::uint64_t pages = o.capacity_tokens == 0 ? all_pages : o.capacity_tokens / o.page_size;
    pages = std::max<std::uint64_t>(pages, 1);
    PrefixCacheConfig cfg;
    cfg.policy = o.policy;
    cfg.s3fifo_small_fraction = o.s3fifo_small_fraction;
    cfg.ghost_factor = o.ghost_factor;
    cfg.tiers = std::move(tiers);
    return PagedKVCacheManager(
        replay_params(o.page_size), static_cast<std::uint32_t>(pages), batch_of(o),
        static_cast<std::uint32_t>(std::min<std::uint64_t>(max_len, UINT32_MAX)), std::move(cfg));
  }

  // Pages each tier has loaded back so far (the manager's count).
  std::vector<std::uint64_t> onboarded() const {
    std::vector<std::uint64_t> out;
    if (!manager_.has_tiers()) return out;
    for (const TierFigures& f : manager_.stats().tiers) out.push_back(f.pages_onboarded);
    return out;
  }

  // The hits of request `index`: `reused` tokens, of which tier t loaded
  // loaded[t] pages; the device served the rest.
  void count_prompt(const TraceRequest& r, std::size_t index, std::uint32_t reused,
                    const std::vector<std::uint64_t>& loaded) {
    ++result_.requests;
    result_.blocks_total += r.hash_ids.size();
    result_.blocks_hit += reused / kTraceBlockTokens;
    result_.prompt_tokens += r.input_length;
    result_.tokens_hit += reused;
    std::uint64_t device_pages = reused / opt_.page_size;
    for (std::size_t t = 0; t < loaded.size(); ++t) {
      count_medium(result_.media[t + 1], loaded[t], index);
      device_pages -= loaded[t];
    }
    count_medium(result_.media[0], device_pages, index);
  }

  void count_medium(ReplayMedium& m, std::uint64_t pages, std::size_t index) const {
    if (pages == 0) return;
    m.pages_hit += pages;
    m.tokens_hit += pages * opt_.page_size;
    m.first_hit_request = std::min<std::uint64_t>(m.first_hit_request, index);
  }

  // Waits for every write-back in flight, so each call finds its staging free.
  void settle() {
    if (!manager_.has_tiers()) return;
    timed(result_.tier_wait_ns, [&] { manager_.wait_tiers(); });
  }

  // The tiers' figures at the end.
  void note_tiers() {
    const ManagerStats stats = manager_.stats();
    for (std::size_t t = 0; t < stats.tiers.size(); ++t) {
      const TierFigures& f = stats.tiers[t];
      ReplayMedium& m = result_.media[t + 1];
      m.pages_held = f.pages_held;
      m.pages_stored = f.pages_stored;
      m.bytes_stored = f.bytes_stored;
      m.pages_loaded = f.pages_loaded;
      m.bytes_loaded = f.bytes_loaded;
      m.evictions = f.evictions;
      m.offload_dropped = f.offload_dropped;
      m.load_failures = f.load_failures;
    }
  }

  void note_peak() {
    result_.peak_pages_used = std::max(result_.peak_pages_used, manager_.metrics().pages_used);
  }

  void progress(std::size_t done) {
    if (opt_.progress) opt_.progress(done, trace_.size());
  }

  // Claims, matches (waiting for its loads from the tiers) and fetches room
  // for prompt + `extra` tokens. Returns the sequence and the reused tokens,
  // or nothing if the pages are not there.
  bool admit(const TraceRequest& r, const std::vector<std::uint32_t>& tokens, std::uint32_t extra,
             SeqId& seq, std::uint32_t& reused) {
    std::uint64_t& ns = result_.manager_ns;
    seq = timed(ns, [&] { return manager_.claim(1)[0]; });
    reused = timed(ns, [&] { return manager_.match_prefix(seq, tokens); });
    if (manager_.has_tiers() && manager_.has_pending_loads(seq)) {
      timed(result_.tier_wait_ns, [&] { manager_.wait_loads(seq); });
      reused = manager_.cache_length(seq);  // a failed load ends the hit before it
    }
    const std::uint32_t rest = r.input_length - reused;
    const std::uint32_t steps = extra + 1;
    try {
      timed(ns,
            [&] { manager_.fetch_into(batch_, std::span(&seq, 1), std::span(&rest, 1), steps); });
    } catch (const OutOfPages&) {
      timed(ns, [&] { manager_.release(seq); });
      settle();
      return false;
    }
    settle();
    note_peak();
    timed(ns, [&] {
      manager_.step(std::span(&seq, 1), std::span(&rest, 1),
                    std::span(tokens).subspan(reused, rest));
    });
    return true;
  }

  ReuseHint hint_for(const TraceRequest& r) const {
    if (!opt_.reuse_hints) return ReuseHint::unknown;
    return r.output_length < opt_.short_output ? ReuseHint::likely : ReuseHint::unlikely;
  }

  void run_sequential() {
    for (std::size_t i = 0; i < trace_.size(); ++i) {
      const TraceRequest& r = trace_[i];
      const std::vector<std::uint32_t> tokens = request_tokens(r);
      SeqId seq;
      std::uint32_t reused;
      if (r.input_length == 0) continue;
      const std::vector<std::uint64_t> before = onboarded();
      if (admit(r, tokens, 0, seq, reused)) {
        count_prompt(r, i, reused, loaded_since(before));
        timed(result_.manager_ns, [&] { manager_.release(seq, hint_for(r)); });
      } else {
        ++result_.rejected;
      }
      progress(i + 1);
    }
  }

  struct Active {
    SeqId seq;
    std::uint32_t remaining;
    std::uint32_t index;  // the request's position in the trace (also salts its decode tokens)
  };

  void run_timed() {
    const double interval = 1000.0 / opt_.decode_tokens_per_s;
    std::deque<std::size_t> pending;
    std::vector<Active> active;
    std::vector<SeqId> ids;
    std::vector<std::uint32_t> ones, new_tokens;
    std::size_t next = 0, done = 0;
    double now = 0;
    std::uint64_t& ns = result_.manager_ns;
    while (next < trace_.size() || !pending.empty() || !active.empty()) {
      if (active.empty() && pending.empty()) now = std::max(now, trace_[next].timestamp_ms);
      while (next < trace_.size() && trace_[next].timestamp_ms <= now) pending.push_back(next++);
      // Admit in arrival order while pages last.
      while (!pending.empty() && active.size() < manager_.max_batch_size()) {
        const TraceRequest& r = trace_[pending.front()];
        if (r.input_length == 0) {
          pending.pop_front();
          ++done;
          continue;
        }
        const std::vector<std::uint32_t> tokens = request_tokens(r);
        SeqId seq;
        std::uint32_t reused;
        const std::vector<std::uint64_t> before = onboarded();
        if (!admit(r, tokens, r.output_length, seq, reused)) {
          if (!active.empty()) break;  // wait for pages
          ++result_.rejected;          // cannot fit even alone
        } else {
          count_prompt(r, pending.front(), reused, loaded_since(before));
          active.push_back({seq, r.output_length, static_cast<std::uint32_t>(pending.front())});
        }
        pending.pop_front();
        progress(++done);
      }
      // One decode step for every active request, then retire finished ones.
      ids.clear();
      new_tokens.clear();
      for (Active& a : active) {
        if (a.remaining == 0) continue;
        ids.push_back(a.seq);
        new_tokens.push_back(mix32((std::uint64_t{a.index} << 32) | a.remaining) | 0x40000000u);
      }
      if (!ids.empty()) {
        ones.assign(ids.size(), 1);
        timed(ns, [&] {
          manager_.fetch_into(batch_, ids, ones);
          manager_.step(ids, ones, new_tokens);
        });
        settle();
        ++result_.decode_steps;
        note_peak();
      }
      for (std::size_t i = 0; i < active.size();) {
        if (active[i].remaining > 0) --active[i].remaining;
        if (active[i].remaining == 0) {
          const ReuseHint hint = hint_for(trace_[active[i].index]);
          timed(ns, [&] { manager_.release(active[i].seq, hint); });
          active[i] = active.back();
          active.pop_back();
        } else {
          ++i;
        }
      }
      now += interval;
    }
  }

  std::vector<std::uint64_t> loaded_since(const std::vector<std::uint64_t>& before) const {
    std::vector<std::uint64_t> now = onboarded();
    for (std::size_t t = 0; t < now.size(); ++t) now[t] -= before[t];
    return now;
  }

  std::span<const TraceRequest> trace_;
  ReplayOptions opt_;
  TraceShape shape_;
  replay::ReplayTierSet tiers_;  // before manager_: outlives it
  PagedKVCacheManager manager_;
  KVCacheBatch batch_;
  ReplayResult result_;
};

}  // namespace

std::vector<std::uint32_t> request_tokens(const TraceRequest& r) {
  check_blocks(r);
  std::vector<std::uint32_t> tokens(r.input_length);
  for (std::uint32_t i = 0; i < r.input_length; ++i) {
    const std::uint64_t k = r.hash_ids[i / kTraceBlockTokens];
    tokens[i] = mix32(k * kTraceBlockTokens + i % kTraceBlockTokens) & 0x3fffffffu;
  }
  return tokens;
}

ReplayResult replay_trace(std::span<const TraceRequest> trace, const ReplayOptions& options) {
  check_options(options);
  for (std::size_t i = 0; i < trace.size(); ++i) check_request(trace[i], i);
  if (options.offline_belady) {
    ReplayResult r = replay::replay_offline_belady(trace, options);
    r.media = {ReplayMedium{.name = "device",
                            .pages_hit = r.tokens_hit / options.page_size,
                            .tokens_hit = r.tokens_hit}};
    return r;
  }
  return Replayer(trace, options).run();
}

}  // namespace kvcache
