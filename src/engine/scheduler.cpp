// Continuous-batching scheduler: chunked prefill, admission by free memory,
// preemption by recompute, prefix reuse through engine/prefix_adapter.h.

#include "kvcache/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/prefix_adapter.h"
#include "kvcache/error.h"
#include "kvcache/log.h"

namespace kvcache::engine {
namespace {

std::string num(std::uint64_t v) { return std::to_string(v); }

std::uint32_t ceil_div(std::uint32_t a, std::uint32_t b) { return (a + b - 1) / b; }

double steady_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

struct Scheduler::Seq {
  Request req;
  std::vector<TokenId> tokens;      // prompt + generated so far
  std::uint32_t computed = 0;       // tokens in the cache (== manager cache_length)
  std::uint32_t reserved = 0;       // room the last fetch guaranteed
  std::uint32_t matched = 0;        // tokens the last admission took from the prefix cache
  std::optional<SeqId> id;          // claimed manager sequence while running (or parked loading)
  std::uint64_t order = 0;          // arrival order: FCFS tie-break
  std::uint32_t forks_left = 0;     // samples still to fork at the first token (Request::n - 1)
  bool loading = false;             // its attached prefix has pages loading from a tier
  double loading_since = 0;         // when those loads started
  std::uint64_t admitted_step = 0;  // step_serial_ of its last admission
  std::mt19937_64 rng;
  RequestOutput out;
  std::uint32_t remaining() const { return static_cast<std::uint32_t>(tokens.size()) - computed; }
  std::uint32_t generated() const { return static_cast<std::uint32_t>(out.tokens.size()); }
};

struct Scheduler::Planned {
  Seq* seq;
  std::uint32_t count;
  bool admitted_now;
};

void SchedulerConfig::validate() const {
  if (max_num_tokens == 0) throw InvalidArgument("scheduler: max_num_tokens must be > 0");
  if (max_num_seqs == 0) throw InvalidArgument("scheduler: max_num_seqs must be > 0");
  if (!(watermark >= 0.0 && watermark < 1.0)) {
    throw InvalidArgument("scheduler: watermark " + std::to_string(watermark) +
                          " must be in [0, 1)");
  }
}

Scheduler::Scheduler(const Model& model, KVCacheManager& manager, SchedulerConfig config)
    : model_(model), manager_(manager), config_(std::move(config)) {
  config_.validate();
  paged_ = manager_.params().cache_strategy == CacheStrategy::paged;
  tiers_ = config_.prefix_caching && prefix::has_tiers(manager_);
  if (config_.max_num_seqs > manager_.max_batch_size()) {
    throw InvalidArgument("scheduler: max_num_seqs " + num(config_.max_num_seqs) +
                          " exceeds the manager's max_batch_size " +
                          num(manager_.max_batch_size()));
  }
  if (config_.prefix_caching && !prefix::available(manager_)) {
    throw InvalidArgument(
        "scheduler: prefix caching needs a paged manager with enable_prefix_caching and a "
        "library built with prefix caching (match_prefix)");
  }
  const ModelConfig& c = model_.config();
  const KVCacheParams& p = manager_.params();
  if (p.dtype != DType::f32 || p.num_layers != c.num_layers || p.n_kv_heads != c.n_kv_heads ||
      p.head_dim != c.head_dim) {
    throw InvalidArgument("scheduler: cache " + p.to_string() + " does not fit model '" + c.name +
                          "'");
  }
  if (!config_.clock) config_.clock = steady_seconds;
}

Scheduler::~Scheduler() {
  for (auto& s : running_) {
    if (s->id) manager_.release(*s->id);
  }
  for (auto& s : waiting_) {
    if (s->id) manager_.release(*s->id);  // parked while loading
  }
}

double Scheduler::now() const { return config_.clock(); }

void Scheduler::add_request(Request r) {
  if (r.prompt.empty()) throw InvalidArgument("request " + num(r.id) + ": empty prompt");
  if (r.max_new_tokens == 0) throw InvalidArgument("request " + num(r.id) + ": max_new_tokens 0");
  if (r.n == 0 || r.n > config_.max_num_seqs) {
    throw InvalidArgument("request " + num(r.id) + ": n " + num(r.n) +
                          " samples must be in [1, max_num_seqs " + num(config_.max_num_seqs) +
                          "]");
  }
  r.sampling.validate();
  if (r.reuse_hint > ReuseHint::likely) {
    throw InvalidArgument("request " + num(r.id) + ": reuse_hint " +
                          num(static_cast<std::uint32_t>(r.reuse_hint)) +
                          " is not unknown, unlikely or likely");
  }
  const std::uint32_t vocab = model_.config().vocab_size;
  for (TokenId t : r.prompt) {
    if (t < 0 || static_cast<std::uint32_t>(t) >= vocab) {
      throw InvalidArgument("request " + num(r.id) + ": token id " + std::to_string(t) +
                            " is outside the vocabulary [0, " + num(vocab) + ")");
    }
  }
  const std::uint64_t total = r.prompt.size() + std::uint64_t{r.max_new_tokens};
  std::uint64_t limit = manager_.max_seq_len();
  if (paged_) {
    limit = std::min<std::uint64_t>(
        limit, std::uint64_t{manager_.total_blocks()} * manager_.params().page_size);
  }
  if (total > limit) {
    throw InvalidArgument("request " + num(r.id) + ": prompt " + num(r.prompt.size()) +
                          " + max_new_tokens " + num(r.max_new_tokens) + " = " + num(total) +
                          " tokens exceeds the cache limit of " + num(limit));
  }
  // Paged: one sequence, forked at its first token. Continuous slots cannot
  // share: n sequences, each computing the prompt.
  const std::uint32_t sequences = paged_ ? 1 : r.n;
  std::vector<std::unique_ptr<Seq>> seqs;
  for (std::uint32_t i = 0; i < sequences; ++i) {
    auto s = std::make_unique<Seq>();
    s->tokens = r.prompt;
    s->order = next_order_;
    s->forks_left = paged_ ? r.n - 1 : 0;
    s->rng.seed(r.sampling.seed + i);
    s->out.id = r.id;
    s->out.sample_index = i;
    s->out.prompt_tokens = static_cast<std::uint32_t>(r.prompt.size());
    s->out.arrival_time = r.arrival_time;
    s->req = r;
    seqs.push_back(std::move(s));
  }
  ++next_order_;
  for (auto& s : seqs) requeue(std::move(s));
}

// Keeps waiting_ sorted by (priority desc if enabled, arrival order asc), so a
// preempted (older) sequence lands at the front of its class.
void Scheduler::requeue(std::unique_ptr<Seq> s) {
  const bool prio = config_.use_priority;
  auto before = [prio](const Seq& a, const Seq& b) {
    if (prio && a.req.priority != b.req.priority) return a.req.priority > b.req.priority;
    return a.order < b.order;
  };
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), s,
                             [&](const auto& a, const auto& b) { return before(*a, *b); });
  waiting_.insert(it, std::move(s));
}

std::uint32_t Scheduler::pages_needed(const Seq& s) const {
  // Pages to hold every known token plus the first generated one.
  const std::uint32_t page = manager_.params().page_size;
  const std::uint32_t want = ceil_div(static_cast<std::uint32_t>(s.tokens.size()) + 1, page);
  const std::uint32_t held = ceil_div(std::max(s.reserved, s.computed), page);
  return want > held ? want - held : 0;
}

std::uint32_t Scheduler::pending_prompt_pages() const {
  std::uint32_t total = 0;
  for (const auto& s : running_) {
    if (s->remaining() > 1) total += pages_needed(*s);
  }
  return total;
}

std::uint32_t Scheduler::pending_forks() const {
  std::uint32_t total = 0;
  for (const auto& s : running_) total += s->forks_left;
  return total;
}

bool Scheduler::try_admit(Seq& s, std::uint32_t budget) {
  // Room for the sequence, its samples to come, those of the running ones
  // and the sequences parked while loading.
  const bool parked = s.id.has_value();
  const std::uint64_t slots = running_.size() + std::uint64_t{pending_forks()} + 1 + s.forks_left +
                              parked_ - (parked ? 1 : 0);
  if (budget == 0 || slots > config_.max_num_seqs) return false;
  if (!paged_) {
    if (manager_.free_blocks() == 0) return false;
    s.id = manager_.claim(1)[0];
    s.admitted_step = step_serial_;
    return true;
  }
  if (!parked) {
    const SeqId id = manager_.claim(1)[0];
    std::uint32_t matched = 0;
    if (config_.prefix_caching) {
      matched = prefix::match(manager_, id, std::span(s.tokens).first(s.tokens.size() - 1));
    }
    s.id = id;
    s.computed = s.reserved = matched;
    s.loading = tiers_ && prefix::has_pending_loads(manager_, id);
    if (s.loading) {
      s.loading_since = now();
      ++stats_.tier_matches;
    }
  }
  // A parked sequence (s.id set before this call: still loading) keeps
  // what it matched.
  const SeqId id = *s.id;
  const std::uint32_t matched = s.computed;
  const std::uint32_t total = manager_.total_blocks();
  const auto keep = static_cast<std::uint32_t>(config_.watermark * total);
  // Each sample to fork writes its first token into a page of its own.
  const std::uint64_t need =
      std::uint64_t{pages_needed(s)} + s.forks_left + pending_prompt_pages() + keep;
  // Evictable cached pages are as good as free: fetch evicts them on demand.
  const std::uint64_t available =
      std::uint64_t{manager_.free_blocks()} + prefix::cached_pages(manager_);
  if (need > available) {
    // Loading: parked in the queue with its loads, not matched again (which
    // would load the pages once more) until they are finished (unpark).
    if (s.loading) {
      if (!parked) ++parked_;
      return false;
    }
    prefix::release(manager_, id, ReuseHint::likely);  // it retries: keep what it matched
    s.id.reset();
    s.computed = s.reserved = 0;
    return false;
  }
  if (parked) --parked_;
  s.matched = matched;
  s.admitted_step = step_serial_;
  stats_.prefix_hit_tokens += matched;
  s.out.prefix_hit_tokens += matched;
  return true;
}

// A running sequence's loads are finished: a failed one shortened its
// prefix (the manager truncated it), so it computes from the manager's
// cache length, and the figures give back what the failure took.
void Scheduler::loads_finished(Seq& s) {
  s.loading = false;
  s.out.load_seconds += now() - s.loading_since;
  const std::uint32_t length = manager_.cache_length(*s.id);
  if (length >= s.computed) return;
  const std::uint32_t lost = s.computed - length;
  s.computed = s.reserved = length;
  stats_.load_failed_tokens += lost;
  stats_.prefix_hit_tokens -= lost;
  s.out.prefix_hit_tokens -= lost;
  s.matched -= lost;
}

// A parked sequence's loads are finished: it lets its sequence go (the
// loaded pages are published: they stay cached, and its next admission
// finds them in the device index), so that it holds no pages while it waits.
void Scheduler::unpark(Seq& s) {
  s.loading = false;
  s.out.load_seconds += now() - s.loading_since;
  prefix::release(manager_, *s.id, ReuseHint::likely);
  s.id.reset();
  s.computed = s.reserved = 0;
  --parked_;
}

// Finishes the loads that are done and takes their sequences off loading.
void Scheduler::finish_loads() {
  prefix::poll_loads(manager_);
  for (auto& s : running_) {
    if (s->loading && !prefix::has_pending_loads(manager_, *s->id)) loads_finished(*s);
  }
  for (auto& s : waiting_) {
    if (s->loading && !prefix::has_pending_loads(manager_, *s->id)) unpark(*s);
  }
}

// Nothing else can run: blocks on the loads of the oldest loading sequence
// (running ones first: they compute as soon as their pages arrive).
// Returns false when no sequence is loading.
bool Scheduler::wait_for_loads() {
  const Seq* oldest = nullptr;
  for (const auto& s : running_) {
    if (s->loading && (oldest == nullptr || s->order < oldest->order)) oldest = s.get();
  }
  for (const auto& s : waiting_) {
    if (oldest == nullptr && s->loading) oldest = s.get();
  }
  if (oldest == nullptr) return false;
  const double t = now();
  prefix::wait_loads(manager_, *oldest->id);
  stats_.load_wait_seconds += now() - t;
  ++stats_.load_waits;
  finish_loads();
  return true;
}

std::size_t Scheduler::pick_victim() const {
  // Lowest priority (when enabled), newest arrival; never a loading sequence
  // (its pages stay taken until the loads end). Called with a planned, hence
  // loaded, sequence running.
  std::size_t victim = running_.size() - 1;
  while (running_[victim]->loading) --victim;
  for (std::size_t i = running_.size(); i-- > 0;) {
    const Seq& a = *running_[i];
    const Seq& v = *running_[victim];
    if (a.loading) continue;
    const bool lower = config_.use_priority && a.req.priority < v.req.priority;
    const bool same = !config_.use_priority || a.req.priority == v.req.priority;
    if (lower || (same && a.order > v.order)) victim = i;
  }
  return victim;
}

void Scheduler::preempt(std::size_t index, bool admitted_this_step) {
  std::unique_ptr<Seq> s = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  log_with(LogLevel::debug, [&] {
    return "scheduler: out of pages, preempted request " + std::to_string(s->req.id) + " (" +
           std::to_string(s->computed) + " tokens computed, " + std::to_string(running_.size()) +
           " still running)";
  });
  prefix::release(manager_, *s->id, ReuseHint::likely);  // it comes back and re-matches
  s->id.reset();
  s->computed = s->reserved = 0;
  if (!admitted_this_step) {
    ++s->out.preemptions;
    ++stats_.preemptions;
  } else {
    stats_.admitted_prompt_tokens -= s->tokens.size();
    // Undo only this admission's figures; earlier admissions of a resumed
    // request did reuse their tokens.
    stats_.prefix_hit_tokens -= s->matched;
    s->out.prefix_hit_tokens -= s->matched;
    s->matched = 0;
  }
  requeue(std::move(s));
}

bool Scheduler::fetch_with_preemption(std::vector<Planned>& plan, StepResult& result) {
  while (!plan.empty()) {
    ids_.clear();
    counts_.clear();
    for (const Planned& p : plan) {
      ids_.push_back(*p.seq->id);
      counts_.push_back(p.count);
    }
    try {
      manager_.fetch_into(batch_, ids_, counts_);
      return true;
    } catch (const OutOfPages&) {
      const std::size_t v = pick_victim();
      Seq* victim = running_[v].get();
      auto it =
          std::find_if(plan.begin(), plan.end(), [&](const Planned& p) { return p.seq == victim; });
      const bool now_admitted = it != plan.end() && it->admitted_now;
      if (it != plan.end()) plan.erase(it);
      if (!now_admitted) ++result.preemptions;
      preempt(v, now_admitted);
    }
  }
  return false;
}

// Parallel sampling: the other n - 1 samples of the request share the
// prompt's pages from here on, and each draws its first token from the same
// logits with its own seed.
void Scheduler::fork_samples(Seq& parent, std::span<const float> logits,
                             std::vector<std::unique_ptr<Seq>>& out) {
  for (std::uint32_t i = 1; i <= parent.forks_left; ++i) {
    auto c = std::make_unique<Seq>();
    c->req = parent.req;
    c->tokens = parent.tokens;
    c->computed = c->reserved = parent.computed;
    c->order = parent.order;
    c->rng.seed(parent.req.sampling.seed + i);
    c->out.id = parent.out.id;
    c->out.sample_index = i;
    c->out.prompt_tokens = parent.out.prompt_tokens;
    c->out.arrival_time = parent.out.arrival_time;
    c->id = prefix::fork(manager_, *parent.id);
    take_token(*c, logits, sample(logits, c->req.sampling, c->rng));
    out.push_back(std::move(c));
  }
  parent.forks_left = 0;
}

void Scheduler::take_token(Seq& s, std::span<const float> logits, TokenId t) {
  if (config_.record_logits) s.out.logits.emplace_back(logits.begin(), logits.end());
  if (s.out.tokens.empty()) s.out.first_token_time = now();
  s.out.tokens.push_back(t);
  s.tokens.push_back(t);
  ++stats_.generated_tokens;
  if (s.req.end_token && t == *s.req.end_token) s.out.reason = FinishReason::end_token;
}

void Scheduler::finish(std::size_t index) {
  std::unique_ptr<Seq> s = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  prefix::release(manager_, *s->id, s->req.reuse_hint);
  s->out.finish_time = now();
  finished_.push_back(std::move(s->out));
}

void Scheduler::record_utilisation() {
  const std::uint32_t page_size = paged_ ? manager_.params().page_size : manager_.max_seq_len();
  // Evictable cached pages belong to no running sequence.
  const double reserved =
      double(manager_.used_blocks() - prefix::cached_pages(manager_)) * page_size;
  // Tokens physically stored: the held capacity minus each sequence's unused
  // tail of its last block. Counting per sequence instead would count a page
  // shared through the prefix cache once per sharer (utilisation > 100 %).
  double tail_waste = 0;
  for (const auto& s : running_) {
    const std::uint64_t blocks = (std::uint64_t{s->computed} + page_size - 1) / page_size;
    tail_waste += double(blocks * page_size - s->computed);
  }
  const double stored = std::max(0.0, reserved - tail_waste);
  stats_.kv_utilisation_sum += reserved > 0 ? stored / reserved : 0.0;
}

// Steps 1-3 of the header comment: the running sequences' decodes and
// prefill chunks, then admission; loading sequences are left out.
void Scheduler::plan_step(std::vector<Planned>& plan) {
  plan.clear();
  std::uint32_t budget = config_.max_num_tokens;
  auto add = [&](Seq& s, std::uint32_t n) {
    plan.push_back({&s, n, s.admitted_step == step_serial_});
    budget -= n;
  };
  for (auto& s : running_) {
    if (!s->loading && s->remaining() == 1 && budget > 0) add(*s, 1);
  }
  for (auto& s : running_) {
    if (!s->loading && s->remaining() > 1 && budget > 0) add(*s, std::min(s->remaining(), budget));
  }
  // Admission, head of the queue first (no overtaking).
  while (!waiting_.empty() && try_admit(*waiting_.front(), budget)) {
    std::unique_ptr<Seq> s = std::move(waiting_.front());
    waiting_.pop_front();
    stats_.admitted_prompt_tokens += s->tokens.size();
    if (!s->loading) add(*s, std::min(s->remaining(), budget));
    running_.push_back(std::move(s));
  }
}

StepResult Scheduler::step() {
  StepResult result;
  if (!has_work()) return result;
  const double t0 = now();
  ++step_serial_;
  std::vector<Planned> plan;
  if (tiers_) finish_loads();
  plan_step(plan);
  // Only loads to wait for: block on them rather than spin.
  while (tiers_ && plan.empty() && wait_for_loads()) plan_step(plan);
  stats_.peak_running = std::max(stats_.peak_running, num_running());
  // 4: memory for the batch, preempting if the pool ran out.
  if (!fetch_with_preemption(plan, result)) {
    stats_.step_seconds += now() - t0;
    // (Pages a parked request is loading come back when its loads end.)
    if (running_.empty() && !waiting_.empty() && parked_ == 0) {
      throw OutOfPages("scheduler: request " + num(waiting_.front()->req.id) +
                       " does not fit in the empty pool");
    }
    return result;
  }
  // 5: forward, commit, sample.
  tokens_.clear();
  offsets_.assign(1, 0);
  logit_rows_.clear();
  for (const Planned& p : plan) {
    const auto first = p.seq->tokens.begin() + p.seq->computed;
    tokens_.insert(tokens_.end(), first, first + p.count);
    offsets_.push_back(static_cast<std::uint32_t>(tokens_.size()));
    if (p.count == p.seq->remaining()) logit_rows_.push_back(offsets_.back() - 1);
    p.seq->reserved = p.seq->computed + p.count;
    if (p.count == 1 && p.seq->generated() > 0 && p.seq->computed + 1 == p.seq->tokens.size()) {
      result.decode_tokens += 1;
    } else {
      result.prefill_tokens += p.count;
    }
  }
  const std::uint32_t vocab = model_.config().vocab_size;
  logits_.resize(logit_rows_.size() * vocab);
  const double tm = now();
  model_.forward(tokens_, offsets_, batch_, logit_rows_, logits_, scratch_);
  stats_.model_seconds += now() - tm;
  prefix::step(manager_, ids_, counts_, tokens_);
  const double ts = now();
  std::size_t row = 0;
  std::vector<std::unique_ptr<Seq>> forked;
  for (const Planned& p : plan) {
    Seq& s = *p.seq;
    const bool sample_now = p.count == s.remaining();
    s.computed += p.count;
    if (!sample_now) continue;
    const std::span<const float> lg(logits_.data() + row++ * vocab, vocab);
    if (s.forks_left > 0) fork_samples(s, lg, forked);
    take_token(s, lg, sample(lg, s.req.sampling, s.rng));
  }
  for (auto& f : forked) running_.push_back(std::move(f));
  stats_.sampling_seconds += now() - ts;
  for (std::size_t i = running_.size(); i-- > 0;) {
    Seq& s = *running_[i];
    if (s.generated() >= s.req.max_new_tokens || s.out.reason == FinishReason::end_token) {
      finish(i);
      ++result.finished;
    }
  }
  result.num_seqs = static_cast<std::uint32_t>(plan.size());
  stats_.prefill_tokens += result.prefill_tokens;
  stats_.decode_tokens += result.decode_tokens;
  ++stats_.steps;
  record_utilisation();
  stats_.step_seconds += now() - t0;
  return result;
}

void Scheduler::run_to_completion() {
  while (has_work()) step();
}

std::vector<RequestOutput> Scheduler::take_finished() {
  std::vector<RequestOutput> out = std::move(finished_);
  finished_.clear();
  return out;
}

}  // namespace kvcache::engine
