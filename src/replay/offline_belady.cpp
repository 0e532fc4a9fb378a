#include "replay/offline_belady.h"

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kvcache/error.h"

namespace kvcache::replay {

namespace {

constexpr std::uint32_t kNever = std::numeric_limits<std::uint32_t>::max();

std::uint64_t pages_for(std::uint64_t tokens, std::uint32_t ps) { return (tokens + ps - 1) / ps; }

struct Page {
  std::uint64_t parent = 0;  // parent's hash (0: first page)
  std::uint32_t depth = 0;
  std::uint32_t children = 0;  // cached pages whose parent this is
  bool in_use = false;
  bool evictable = false;  // in the eviction set (a leaf not in use)
  std::uint32_t next_use = kNever;
};

class Belady {
 public:
  Belady(std::span<const TraceRequest> trace, const ReplayOptions& o)
      : trace_(trace), ps_(o.page_size) {
    std::uint64_t all_pages = 0;
    for (const TraceRequest& r : trace) {
      all_pages += pages_for(std::uint64_t{r.input_length} + r.output_length + 1, ps_);
    }
    const std::uint64_t pages = o.capacity_tokens == 0 ? all_pages : o.capacity_tokens / ps_;
    capacity_ = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(pages, 1, UINT32_MAX - 1));
    result_.capacity_pages = capacity_;
    hash_all();
  }

  ReplayResult run(const ReplayOptions& o) {
    for (std::uint32_t t = 0; t < trace_.size(); ++t) {
      if (trace_[t].input_length > 0) request(t);
      if (o.progress) o.progress(t + 1, trace_.size());
    }
    return result_;
  }

 private:
  // Chained hashes of every request's full pages and, per hash, the requests
  // that can match it (in order).
  void hash_all() {
    hashes_.resize(trace_.size());
    for (std::uint32_t t = 0; t < trace_.size(); ++t) {
      const TraceRequest& r = trace_[t];
      if (r.input_length == 0) continue;
      const std::vector<std::uint32_t> tokens = request_tokens(r);
      const std::uint32_t full = r.input_length / ps_, usable = (r.input_length - 1) / ps_;
      std::uint64_t h = 0;
      for (std::uint32_t j = 0; j < full; ++j) {
        h = default_block_hash(h, std::span(tokens).subspan(std::size_t{j} * ps_, ps_), 0);
        hashes_[t].push_back(h);
        if (j < usable) uses_[h].push_back(t);
      }
    }
  }

  std::uint32_t next_use(std::uint64_t h, std::uint32_t t) const {
    const auto it = uses_.find(h);
    if (it == uses_.end()) return kNever;
    const auto n = std::upper_bound(it->second.begin(), it->second.end(), t);
    return n == it->second.end() ? kNever : *n;
  }

  void make_evictable(std::uint64_t h, Page& p) {
    p.evictable = true;
    victims_.emplace(p.next_use, p.depth, h);
  }
  void make_unevictable(std::uint64_t h, Page& p) {
    if (!p.evictable) return;
    victims_.erase({p.next_use, p.depth, h});
    p.evictable = false;
  }

  void evict_one() {
    const auto [next, depth, h] = *victims_.rbegin();
    victims_.erase(std::prev(victims_.end()));
    const std::uint64_t parent = cached_.at(h).parent;
    cached_.erase(h);
    ++result_.evictions;
    if (depth == 0) return;
    Page& pp = cached_.at(parent);
    if (--pp.children == 0 && !pp.in_use) make_evictable(parent, pp);
  }

  // Ends the request at time t: its cached pages become evictable leaves.
  void release(std::uint32_t t, std::span<const std::uint64_t> held) {
    for (std::uint64_t h : held) {
      Page& p = cached_.at(h);
      p.in_use = false;
      p.next_use = next_use(h, t);
      if (p.children == 0) make_evictable(h, p);
    }
  }

  void request(std::uint32_t t) {
    const TraceRequest& r = trace_[t];
    const std::vector<std::uint64_t>& h = hashes_[t];
    const std::uint32_t usable = (r.input_length - 1) / ps_;
    std::uint32_t m = 0;
    while (m < usable && m < h.size() && cached_.count(h[m]) != 0) ++m;
    std::vector<std::uint64_t> held(h.begin(), h.begin() + m);
    for (std::uint64_t x : held) {
      Page& p = cached_.at(x);
      make_unevictable(x, p);
      p.in_use = true;
    }
    const std::uint64_t need = pages_for(r.input_length, ps_) - m;
    const std::uint64_t free = capacity_ - cached_.size();
    if (need > free + (cached_.size() - m)) {
      ++result_.rejected;
      release(t, held);
      return;
    }
    while (capacity_ - cached_.size() < need) evict_one();
    // Publish the computed full pages whose parent is published and whose
    // content is not cached yet (else the page stays private, as in the manager).
    bool parent_published = true;
    for (std::uint32_t j = m; j < h.size(); ++j) {
      if (!parent_published || cached_.count(h[j]) != 0) {
        parent_published = false;
        continue;
      }
      Page p;
      p.depth = j;
      p.in_use = true;
      if (j > 0) {
        p.parent = h[j - 1];
        ++cached_.at(p.parent).children;
      }
      cached_.emplace(h[j], p);
      held.push_back(h[j]);
    }
    result_.peak_pages_used = std::max<std::uint32_t>(
        result_.peak_pages_used, static_cast<std::uint32_t>(pages_for(r.input_length, ps_)));
    const std::uint64_t reused = std::uint64_t{m} * ps_;
    ++result_.requests;
    result_.blocks_total += r.hash_ids.size();
    result_.blocks_hit += reused / kTraceBlockTokens;
    result_.prompt_tokens += r.input_length;
    result_.tokens_hit += reused;
    release(t, held);
  }

  std::span<const TraceRequest> trace_;
  std::uint32_t ps_;
  std::uint32_t capacity_ = 0;
  std::vector<std::vector<std::uint64_t>> hashes_;
  std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> uses_;
  std::unordered_map<std::uint64_t, Page> cached_;
  std::set<std::tuple<std::uint32_t, std::uint32_t, std::uint64_t>> victims_;  // max = victim
  ReplayResult result_;
};

}  // namespace

ReplayResult replay_offline_belady(std::span<const TraceRequest> trace,
                                   const ReplayOptions& options) {
  if (options.page_size == 0) throw InvalidArgument("page size is 0: it must be at least 1");
  if (!options.sequential) {
    throw InvalidArgument("the offline Belady reference replays --sequential only");
  }
  return Belady(trace, options).run(options);
}

}  // namespace kvcache::replay
