// Workload replay with metrics (see serve.h).

#include "kvcache/engine/serve.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "engine/prefix_adapter.h"
#include "kvcache/continuous_manager.h"
#include "kvcache/disk_tier.h"
#include "kvcache/engine/scheduler.h"
#include "kvcache/error.h"
#include "kvcache/host_tier.h"
#include "kvcache/paged_manager.h"
#include "kvcache/write_through_tier.h"

namespace kvcache::engine {
namespace {

// Real time, except that idle gaps before the next arrival are skipped.
class SkipClock {
 public:
  double now() const {
    using namespace std::chrono;
    return duration<double>(steady_clock::now() - start_).count() + offset_;
  }
  void advance_to(double t) {
    const double n = now();
    if (t > n) offset_ += t - n;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double offset_ = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p * double(v.size() - 1);
  const auto lo = static_cast<std::size_t>(idx);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - double(lo));
}

// Write-back staging: room for what one call can evict (a whole prompt
// loaded or matched, a step's pages, a new page per sequence).
std::uint32_t staging_pages(const ServeOptions& o) {
  const std::uint64_t pages = std::uint64_t{o.max_seq_len} / o.page_size +
                              o.max_num_tokens / o.page_size + o.max_num_seqs + 1;
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(pages, 16, 65536));
}

PrefixCacheConfig tier_config(const KVCacheParams& p, const ServeOptions& o) {
  if (!o.tiers.any()) {
    throw InvalidArgument(std::string(serve_mode_name(o.mode)) +
                          " needs a tier: a host capacity or a disk directory");
  }
  PrefixCacheConfig config;
  TierConfig& t = config.tiers;
  t.model_id = o.tiers.model_id;
  t.staging_pages = staging_pages(o);
  const TierFingerprint fp = TierFingerprint::of(p, t.model_id);
  std::shared_ptr<Tier> host, disk;
  if (o.tiers.host_bytes > 0) host = std::make_shared<HostTier>(fp, o.tiers.host_bytes);
  if (!o.tiers.disk_dir.empty()) {
    disk = std::make_shared<DiskTier>(fp, o.tiers.disk_dir, o.tiers.disk_bytes);
  }
  // Both: the host writes through to the disk, which serves what the host
  // no longer holds (kvcache/write_through_tier.h).
  if (host && disk) host = std::make_shared<WriteThroughTier>(host, disk);
  for (auto& tier : {host, disk})
    if (tier) t.tiers.push_back(tier);
  return config;
}

std::unique_ptr<KVCacheManager> make_manager(const Model& model, const ServeOptions& o,
                                             ServeReport& r) {
  const ModelConfig& c = model.config();
  if (o.mode == ServeMode::continuous) {
    const KVCacheParams p = c.cache_params(CacheStrategy::continuous, 0);
    const std::size_t slot = std::size_t{o.max_seq_len} * p.bytes_per_token();
    const auto slots = static_cast<std::uint32_t>(o.memory_bytes / slot);
    if (slots == 0) {
      throw InvalidArgument("memory budget " + std::to_string(o.memory_bytes) +
                            " B holds no slot of " + std::to_string(slot) + " B");
    }
    r.blocks = slots, r.page_size = o.max_seq_len;
    r.memory_bytes =
        ContinuousBatchingKVCacheManager::estimated_memory_size(p, slots, o.max_seq_len);
    return std::make_unique<ContinuousBatchingKVCacheManager>(p, slots, o.max_seq_len);
  }
  KVCacheParams p = c.cache_params(CacheStrategy::paged, o.page_size);
  p.enable_prefix_caching = o.mode == ServeMode::paged_prefix || o.mode == ServeMode::paged_tiers;
  const std::uint32_t pages = PagedKVCacheManager::pages_for_memory(p, o.memory_bytes);
  if (pages == 0) {
    throw InvalidArgument("memory budget " + std::to_string(o.memory_bytes) +
                          " B holds no page of " + std::to_string(o.page_size) + " tokens");
  }
  r.blocks = pages, r.page_size = o.page_size;
  r.memory_bytes = PagedKVCacheManager::estimated_memory_size(p, pages);
  if (o.mode == ServeMode::paged_tiers) {
    return std::make_unique<PagedKVCacheManager>(p, pages, o.max_num_seqs, o.max_seq_len,
                                                 tier_config(p, o));
  }
  return std::make_unique<PagedKVCacheManager>(p, pages, o.max_num_seqs, o.max_seq_len);
}

void summarise(const std::vector<RequestOutput>& done, double elapsed, ServeReport& r) {
  std::vector<double> ttft;
  double tpot_sum = 0, load_sum = 0;
  std::size_t tpot_n = 0, load_n = 0;
  for (const RequestOutput& o : done) {
    r.generated_tokens += o.tokens.size();
    if (o.load_seconds > 0) load_sum += o.load_seconds, ++load_n;
    ttft.push_back(o.first_token_time - o.arrival_time);
    if (o.tokens.size() > 1) {
      tpot_sum += (o.finish_time - o.first_token_time) / double(o.tokens.size() - 1);
      ++tpot_n;
    }
  }
  r.elapsed_s = elapsed;
  r.requests_per_s = elapsed > 0 ? double(r.requests) / elapsed : 0;  // not outputs (samples)
  r.output_tokens_per_s = elapsed > 0 ? double(r.generated_tokens) / elapsed : 0;
  double sum = 0;
  for (double t : ttft) sum += t;
  r.ttft_mean_s = ttft.empty() ? 0 : sum / double(ttft.size());
  r.ttft_p50_s = percentile(ttft, 0.5);
  r.ttft_p99_s = percentile(ttft, 0.99);
  r.tpot_mean_s = tpot_n ? tpot_sum / double(tpot_n) : 0;
  r.load_mean_s = load_n ? load_sum / double(load_n) : 0;
}

}  // namespace

std::string_view serve_mode_name(ServeMode m) {
  switch (m) {
    case ServeMode::continuous:
      return "continuous slots";
    case ServeMode::paged:
      return "paged";
    case ServeMode::paged_prefix:
      return "paged + prefix caching";
    case ServeMode::paged_tiers:
      return "paged + prefix + tiers";
  }
  return "?";
}

ServeReport serve(const Model& model, const std::vector<WorkloadRequest>& workload,
                  const ServeOptions& o) {
  ServeReport r;
  r.config = std::string(serve_mode_name(o.mode));
  r.requests = static_cast<std::uint32_t>(workload.size());
  r.samples = o.samples;
  for (const auto& w : workload) {
    r.prompt_tokens += w.prompt.size();
    r.requested_output_tokens += std::uint64_t{w.output_tokens} * o.samples;
  }
  std::unique_ptr<KVCacheManager> manager = make_manager(model, o, r);
  const bool prefix_mode = o.mode == ServeMode::paged_prefix || o.mode == ServeMode::paged_tiers;
  if (prefix_mode && !prefix::available(*manager)) {
    r.pending = true;
    r.note = "prefix caching: pending (PagedKVCacheManager::match_prefix not in this build)";
    return r;
  }
  SkipClock clock;
  SchedulerConfig sc;
  sc.max_num_tokens = o.max_num_tokens;
  sc.max_num_seqs = std::min(o.max_num_seqs, manager->max_batch_size());
  sc.watermark = o.watermark;
  sc.prefix_caching = prefix_mode;
  sc.clock = [&clock] { return clock.now(); };
  std::vector<RequestOutput> done;
  {
    Scheduler scheduler(model, *manager, sc);
    std::size_t next = 0;
    while (next < workload.size() || scheduler.has_work()) {
      if (!scheduler.has_work() && next < workload.size()) clock.advance_to(workload[next].arrival);
      for (; next < workload.size() && workload[next].arrival <= clock.now(); ++next) {
        Request req;
        req.id = next;
        req.prompt = workload[next].prompt;
        req.max_new_tokens = workload[next].output_tokens;
        req.arrival_time = workload[next].arrival;
        req.n = o.samples;
        scheduler.add_request(std::move(req));
      }
      scheduler.step();
      for (auto& f : scheduler.take_finished()) done.push_back(std::move(f));
      if (o.progress) o.progress(done.size(), workload.size() * o.samples);
    }
    const SchedulerStats& s = scheduler.stats();
    r.peak_running = s.peak_running;
    r.kv_utilisation = s.kv_utilisation();
    r.prefix_hit_rate = s.admitted_prompt_tokens
                            ? double(s.prefix_hit_tokens) / double(s.admitted_prompt_tokens)
                            : 0.0;
    r.prefill_tokens = s.prefill_tokens;
    r.preemptions = s.preemptions;
    r.steps = s.steps;
    r.model_s = s.model_seconds;
    r.sampling_s = s.sampling_seconds;
    r.overhead_s = s.overhead_seconds();
    r.tier_matches = s.tier_matches;
    r.load_failed_tokens = s.load_failed_tokens;
    r.load_waits = s.load_waits;
    r.load_wait_s = s.load_wait_seconds;
  }
  summarise(done, clock.now(), r);
  if (PagedKVCacheManager* pm = manager->paged(); pm != nullptr && pm->has_tiers()) {
    pm->wait_tiers();  // write-backs still in flight
    r.tiers = pm->stats().tiers;
  }
  r.active_sequences_left = manager->num_active_sequences();
  r.blocks_cached = prefix::cached_pages(*manager);
  r.blocks_not_free = manager->used_blocks() - r.blocks_cached;
  manager->check_invariants();
  return r;
}

}  // namespace kvcache::engine
