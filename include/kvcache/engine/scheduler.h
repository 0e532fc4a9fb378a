// kvcache/engine/scheduler.h — a continuous-batching scheduler over a model
// and a KV cache manager (either kind).
//
// Every `step()` is one iteration of the engine:
//   1. running sequences that are decoding get one token each;
//   2. running sequences still prefilling get a chunk of their prompt
//      (chunked prefill) from what is left of the per-step token budget;
//   3. waiting requests are admitted (FCFS, or by priority then arrival)
//      while budget, batch slots and memory allow: a paged manager needs the
//      pages of the whole prompt free above a watermark (prefix-cached pages
//      count as already held, evictable cached pages as free); a continuous
//      manager needs a free slot.
//      With prefix caching, admission first attaches the longest cached
//      prefix so only the rest is computed;
//   4. one fetch for the mixed batch; if the pool runs out, the newest,
//      lowest-priority sequence is preempted by recompute (released and
//      requeued at the front of its priority class, to resume with prompt +
//      generated tokens, through the prefix cache when enabled) until it fits;
//   5. one model forward, one manager step, sampling for every sequence whose
//      known tokens are now all in the cache (a request with n > 1 samples
//      forks its sequence here, at its first token: Request::n); finished
//      sequences (max tokens or end token) are released.
// The scheduler never leaves a sequence claimed after it finishes; when
// `has_work()` is false every sequence it claimed has been released.
//
// Tiers (a paged manager with PrefixCacheConfig::tiers, docs/tiers.md): the
// prefix attached at admission may go on into a tier, whose pages arrive
// later (pending loads). Such a sequence is admitted but left out of every
// batch (fetch would throw for it) while the others compute; each step
// first finishes the loads that are done (PagedKVCacheManager::poll_loads)
// and moves those sequences in. A load that failed (missing, corrupt, I/O
// error) shortens the attached prefix and the rest is computed. When a step
// has nothing else to run it blocks on the oldest sequence's loads
// (wait_loads) instead of spinning. A request that does not fit yet after
// its prefix started loading keeps its sequence and waits in the queue
// until the loads are finished (it is not matched again, which would load
// the pages twice); then it lets the sequence go, the loaded pages staying
// cached in the device index for its next admission.
// TTFT therefore includes the load time; RequestOutput::load_seconds and
// the load_* figures of SchedulerStats show it. Loading sequences are never
// chosen for preemption.
//
// Thread-safety: not thread-safe; drive one Scheduler from one thread.
// The model and manager must outlive it; nothing else may use the manager's
// sequences the scheduler claims.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kvcache/batch.h"
#include "kvcache/engine/model.h"
#include "kvcache/engine/sampling.h"
#include "kvcache/manager.h"
#include "kvcache/prefix_cache.h"

namespace kvcache::engine {

struct Request {
  std::uint64_t id = 0;  // the caller's id, echoed in the output
  std::vector<TokenId> prompt;
  std::uint32_t max_new_tokens = 16;
  std::optional<TokenId> end_token{};  // stop after emitting it
  SamplingParams sampling{};
  int priority = 0;         // larger first when SchedulerConfig::use_priority
  double arrival_time = 0;  // on the scheduler's clock; for latency figures
  // With prefix caching: whether a later request is expected to start with
  // this one's tokens (e.g. `likely` for a chat turn that expects a
  // follow-up), passed to the prefix cache when the request finishes
  // (PagedKVCacheManager::release(seq, hint); the `tiered` policy acts on
  // it). A preempted request is always released `likely`: it comes back.
  ReuseHint reuse_hint = ReuseHint::unknown;
  // Independent samples of this prompt (parallel sampling, n in vLLM /
  // OpenAI). The prompt is computed once; when its first token is due, the
  // sequence is forked n - 1 times (PagedKVCacheManager::fork: the prompt's
  // pages are shared, and the first write into the shared partial page
  // copies it), and every sample draws its first token from the same logits.
  // Sample i draws with sampling.seed + i and finishes as its own
  // RequestOutput (same id, sample_index i). Admission waits until n
  // sequence slots are free. A preempted sample is recomputed alone (prompt +
  // its own tokens). A continuous manager's slots cannot share: there the
  // request becomes n sequences that each compute the prompt.
  std::uint32_t n = 1;
};

enum class FinishReason : std::uint8_t { max_tokens, end_token };

struct RequestOutput {
  std::uint64_t id = 0;
  std::uint32_t sample_index = 0;  // which of the request's n samples (0 .. n - 1)
  std::vector<TokenId> tokens;     // generated tokens
  FinishReason reason = FinishReason::max_tokens;
  std::uint32_t prompt_tokens = 0;
  double arrival_time = 0, first_token_time = 0, finish_time = 0;
  std::uint32_t preemptions = 0;
  std::uint32_t prefix_hit_tokens = 0;  // prompt tokens served from the prefix cache
                                        // (device pages and pages loaded from a tier)
  double load_seconds = 0;  // from its admission to its tier loads finishing (in its TTFT)
  std::vector<std::vector<float>> logits;  // per generated token, if record_logits
};

struct SchedulerConfig {
  std::uint32_t max_num_tokens = 256;  // token budget of one step (prefill chunks + decodes)
  std::uint32_t max_num_seqs = 64;     // running sequences; <= manager max_batch_size
  double watermark = 0.01;             // paged: fraction of pages kept free at admission
  bool use_priority = false;
  bool prefix_caching = false;      // paged manager with prefix caching enabled
  bool record_logits = false;       // keep the logits behind every sampled token (tests)
  std::function<double()> clock{};  // seconds; default: steady clock
  // Throws InvalidArgument: zero budget / seqs, watermark outside [0, 1).
  void validate() const;
};

struct SchedulerStats {
  std::uint64_t steps = 0;
  std::uint64_t prefill_tokens = 0;  // computed prompt (and recompute) tokens
  std::uint64_t decode_tokens = 0;
  std::uint64_t generated_tokens = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t admitted_prompt_tokens = 0;  // prompt tokens at every admission
  std::uint64_t prefix_hit_tokens = 0;       // of those, served from the prefix cache
  std::uint32_t peak_running = 0;
  // Tiers: admission matches whose prefix went on into a tier (loads
  // started); prompt tokens a load that failed took back (computed
  // instead); steps that had nothing but loads to wait for, and the time
  // they blocked.
  std::uint64_t tier_matches = 0;
  std::uint64_t load_failed_tokens = 0;
  std::uint64_t load_waits = 0;
  double load_wait_seconds = 0;
  double kv_utilisation_sum = 0;  // sum over steps of stored tokens / reserved tokens
  double model_seconds = 0;       // inside Model::forward
  double sampling_seconds = 0;
  double step_seconds = 0;  // whole step() calls; overhead = step - model - sampling
  double kv_utilisation() const { return steps ? kv_utilisation_sum / double(steps) : 0.0; }
  double overhead_seconds() const { return step_seconds - model_seconds - sampling_seconds; }
};

// What one step did.
struct StepResult {
  std::uint32_t num_seqs = 0, prefill_tokens = 0, decode_tokens = 0, preemptions = 0, finished = 0;
};

class Scheduler {
 public:
  // Throws InvalidArgument: bad config; prefix_caching with a manager that
  // has no prefix cache; max_num_seqs above the manager's max_batch_size;
  // a model whose shape does not match the cache.
  Scheduler(const Model& model, KVCacheManager& manager, SchedulerConfig config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Throws InvalidArgument (empty prompt, token outside the
  // vocabulary, max_new_tokens 0, bad sampling, a reuse_hint outside ReuseHint,
  // prompt + max_new_tokens past the manager's max_seq_len or the whole paged
  // pool, n of 0 or above max_num_seqs).
  // Nothing queued on throw.
  void add_request(Request request);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  std::uint32_t num_waiting() const { return static_cast<std::uint32_t>(waiting_.size()); }
  std::uint32_t num_running() const { return static_cast<std::uint32_t>(running_.size()); }

  // One iteration (see the header comment). Does nothing when !has_work().
  StepResult step();
  // Steps until every queued request has finished.
  void run_to_completion();

  // Finished requests since the last call, in finishing order.
  std::vector<RequestOutput> take_finished();
  const SchedulerStats& stats() const { return stats_; }
  bool prefix_caching() const { return config_.prefix_caching; }

 private:
  struct Seq;
  struct Planned;
  double now() const;
  bool try_admit(Seq& s, std::uint32_t budget);
  void plan_step(std::vector<Planned>& plan);
  void finish_loads();
  void loads_finished(Seq& s);
  void unpark(Seq& s);
  bool wait_for_loads();
  std::uint32_t pages_needed(const Seq& s) const;
  std::uint32_t pending_prompt_pages() const;
  std::uint32_t pending_forks() const;
  void fork_samples(Seq& parent, std::span<const float> logits,
                    std::vector<std::unique_ptr<Seq>>& out);
  void take_token(Seq& s, std::span<const float> logits, TokenId t);
  void preempt(std::size_t running_index, bool admitted_this_step);
  std::size_t pick_victim() const;
  void requeue(std::unique_ptr<Seq> s);
  bool fetch_with_preemption(std::vector<Planned>& plan, StepResult& result);
  void finish(std::size_t running_index);
  void record_utilisation();

  const Model& model_;
  KVCacheManager& manager_;
  SchedulerConfig config_;
  bool paged_;
  bool tiers_;  // the manager has tiers: sequences may be loading
  std::uint64_t next_order_ = 0;
  std::uint64_t step_serial_ = 0;  // step() calls
  std::uint32_t parked_ = 0;       // waiting requests holding a claimed, loading sequence
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;  // admission order
  std::vector<RequestOutput> finished_;
  SchedulerStats stats_;
  // Per-step buffers, reused.
  KVCacheBatch batch_;
  ForwardScratch scratch_;
  std::vector<SeqId> ids_;
  std::vector<std::uint32_t> counts_, offsets_, logit_rows_;
  std::vector<TokenId> tokens_;
  std::vector<float> logits_;
};

}  // namespace kvcache::engine
