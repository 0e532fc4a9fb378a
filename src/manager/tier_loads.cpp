// TierLink's onboard side (manager/tier_link.h): the load jobs, the index of
// the keys they load (attachable), finding a run's tiers (locate), issuing
// the loads and counting their results.
#include <algorithm>
#include <string>

#include "kvcache/error.h"
#include "manager/observability.h"
#include "manager/tier_link.h"

namespace kvcache::manager {

namespace {

std::string str(std::uint64_t v) { return std::to_string(v); }

constexpr std::uint8_t kNoTier = TierLink::kNoTier;

bool key_less(const PageKey& a, const PageKey& b) noexcept {
  return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
}

}  // namespace

// ---- LoadJob -----------------------------------------------------------------------

bool LoadJob::done() const {
  return std::all_of(tickets.begin(), tickets.end(), [](const TierTicket& t) { return t.done(); });
}

LoadResult LoadJob::shard_result(std::size_t i, std::uint32_t d) const {
  const std::size_t t = std::size_t{tier_of[i]} * shards + d;
  if (issue_threw[t]) return LoadResult::failed;
  const auto results = tickets[t].load_results();
  return slot[i] < results.size() ? results[slot[i]] : LoadResult::failed;
}

LoadResult LoadJob::result(std::size_t i) const {
  for (std::uint32_t d = 0; d < shards; ++d) {
    const LoadResult r = shard_result(i, d);
    if (r != LoadResult::loaded) return r;
  }
  return LoadResult::loaded;
}

// ---- TierLink: onboard -------------------------------------------------------------

std::size_t TierLink::locate(std::span<const PageKey> keys, std::vector<std::uint8_t>& tier_of) {
  std::vector<PageKey> ask;
  std::vector<std::size_t> where;
  ask.reserve(keys.size());
  where.reserve(keys.size());
  for (std::size_t t = 0; t < tiers_.size() / shards_; ++t) {
    ask.clear();
    where.clear();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (tier_of[i] != kNoTier) continue;
      ask.push_back(keys[i]);
      where.push_back(i);
    }
    if (ask.empty()) break;
    if (!level_enabled(t)) continue;
    const std::vector<std::uint8_t> held = level_contains(t, ask);
    for (std::size_t k = 0; k < where.size() && k < held.size(); ++k)
      if (held[k] != 0) tier_of[where[k]] = static_cast<std::uint8_t>(t);
  }
  std::size_t run = 0;
  while (run < keys.size() && tier_of[run] != kNoTier) ++run;
  return run;
}

bool TierLink::any_holds(const PageKey& key) {
  for (std::size_t t = 0; t < tiers_.size() / shards_; ++t)
    if (level_enabled(t) && level_contains(t, std::span(&key, 1)).at(0) != 0) return true;
  return false;
}

LoadRef TierLink::attachable(const PageKey& key, LoadRef hint) const noexcept {
  if (in_flight_.empty()) return {};
  auto usable = [&](LoadRef ref) {
    const LoadJob* j = job(ref.job);
    return j != nullptr && ref.index < j->size() && j->keys[ref.index] == key &&
           (!j->settled || j->result(ref.index) == LoadResult::loaded);
  };
  if (hint.valid() && usable(hint)) return hint;
  auto it =
      std::lower_bound(in_flight_.begin(), in_flight_.end(), key,
                       [](const InFlight& f, const PageKey& k) { return key_less(f.key, k); });
  for (; it != in_flight_.end() && it->key == key; ++it)
    if (usable(it->ref)) return it->ref;
  return {};
}

void TierLink::reserve_job(std::size_t n) {
  jobs_.reserve(jobs_.size() + 1);
  in_flight_.reserve(in_flight_.size() + n);
}

void TierLink::prepare(LoadJob& job, std::size_t n) const {
  job.waiters.reserve(1);
  job.kept.assign(n, 0);
  job.pages.reserve(n);
  job.tier_of.reserve(n);
  job.slot.assign(n, 0);
  job.tokens.reserve(n * page_size_);
  job.keys.reserve(n);
  job.shards = shards_;
  const PageBytes& bytes = bytes_.front();
  if (!bytes.packed_in_place()) job.staging.resize(n * shards_ * bytes.page_bytes());
  job.reads.reserve(n * shards_);
  job.tickets.assign(tiers_.size(), TierTicket());
  job.issue_threw.assign(tiers_.size(), 0);
}

void TierLink::add(LoadJob&& job) noexcept {
  job.id = next_job_id_++;
  for (std::uint32_t i = 0; i < job.size(); ++i)
    in_flight_.push_back({job.keys[i], {job.id, i}});  // capacity: reserve_job()
  std::sort(in_flight_.begin(), in_flight_.end(),
            [](const InFlight& a, const InFlight& b) { return key_less(a.key, b.key); });
  jobs_.push_back(std::move(job));  // capacity: reserve_job()
  issue(jobs_.back());
}

void TierLink::issue(LoadJob& job) noexcept {
  const std::size_t pb = bytes_.front().page_bytes();
  job.reads.clear();
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    const std::size_t level = t / shards_;
    const std::uint32_t d = static_cast<std::uint32_t>(t % shards_);
    const std::size_t begin = job.reads.size();
    for (std::size_t i = 0; i < job.size(); ++i) {
      if (job.tier_of[i] != level) continue;
      job.slot[i] = static_cast<std::uint32_t>(job.reads.size() - begin);  // equal for every d
      const std::span<std::byte> dst =
          bytes_[d].packed_in_place()
              ? bytes_[d].in_place(job.pages[i])
              : std::span<std::byte>(job.staging).subspan((i * shards_ + d) * pb, pb);
      const auto toks =
          std::span<const std::uint32_t>(job.tokens).subspan(i * page_size_, page_size_);
      job.reads.push_back({shard_key(job.keys[i], masks_[d]), toks, dst});  // capacity: prepare()
    }
    if (job.reads.size() == begin) continue;
    try {
      job.tickets[t] = tiers_[t]->load(std::span(job.reads).subspan(begin));
    } catch (...) {
      job.issue_threw[t] = 1;
      log_after_commit(LogLevel::warn, [&] {
        return "paged manager: tier '" + names_[t] + "' refused a load of " +
               str(job.reads.size() - begin) + " pages";
      });
    }
  }
}

LoadJob* TierLink::job(std::uint64_t id) noexcept {
  for (LoadJob& j : jobs_)
    if (j.id == id) return &j;
  return nullptr;
}

const LoadJob* TierLink::job(std::uint64_t id) const noexcept {
  for (const LoadJob& j : jobs_)
    if (j.id == id) return &j;
  return nullptr;
}

void TierLink::settle(LoadJob& job) noexcept {
  job.settled = true;
  for (std::size_t i = 0; i < job.size(); ++i)
    if (job.result(i) == LoadResult::loaded) unpack_loaded(job, i);  // per_layer: every device
}

void TierLink::erase_job(std::size_t i) noexcept {
  const std::uint64_t id = jobs_[i].id;
  std::erase_if(in_flight_, [id](const InFlight& f) { return f.ref.job == id; });
  jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(i));
}

void TierLink::count_results(const LoadJob& job) noexcept {
  for (std::size_t i = 0; i < job.size(); ++i) {
    for (std::uint32_t d = 0; d < shards_; ++d) {
      const std::size_t t = std::size_t{job.tier_of[i]} * shards_ + d;
      if (job.kept[i] != 0) {
        ++counters_[t].pages_onboarded;
        continue;
      }
      const LoadResult r = job.shard_result(i, d);
      if (r == LoadResult::loaded) continue;  // after a failed page: dropped with it
      ++counters_[t].load_failures;
      if (r == LoadResult::missing || r == LoadResult::corrupt || r == LoadResult::mismatch) {
        if (on_event_) {  // the tier no longer holds it
          on_event_(PageEvent{
              PageEvent::Kind::removed, job.pages[i], 0, 0, 0,
              std::span<const std::uint32_t>(job.tokens).subspan(i * page_size_, page_size_),
              names_[t], job.keys[i]});
        }
      }
    }
  }
}

void TierLink::check_jobs() const {
  std::size_t pages = 0;
  for (const LoadJob& j : jobs_) {
    pages += j.size();
    if (j.id == 0 || j.id >= next_job_id_)
      throw Error("load job id " + str(j.id) + " out of range");
    if (j.kept.size() != j.size()) throw Error("load job " + str(j.id) + " keeps no kept flags");
    for (std::size_t w = 0; w < j.waiters.size(); ++w) {
      if (std::count(j.waiters.begin(), j.waiters.end(), j.waiters[w]) != 1)
        throw Error("load job " + str(j.id) + " lists a waiter twice");
    }
    if (!j.settled && (j.used || std::count(j.kept.begin(), j.kept.end(), 1) != 0))
      throw Error("load job " + str(j.id) + " has kept pages before it settled");
  }
  if (in_flight_.size() != pages)
    throw Error(str(in_flight_.size()) + " keys in flight for " + str(pages) + " loading pages");
  for (std::size_t k = 0; k < in_flight_.size(); ++k) {
    const InFlight& f = in_flight_[k];
    const LoadJob* j = job(f.ref.job);
    if (j == nullptr || f.ref.index >= j->size() || !(j->keys[f.ref.index] == f.key))
      throw Error("a key in flight names no page of a load job");
    if (k > 0 && key_less(f.key, in_flight_[k - 1].key))
      throw Error("the keys in flight are not sorted");
  }
}

std::uint32_t TierLink::pending_pages() const noexcept {
  std::size_t n = 0;
  for (const LoadJob& j : jobs_) n += j.settled ? 0 : j.size();
  return static_cast<std::uint32_t>(n);
}

}  // namespace kvcache::manager
