// WriteThroughTier (kvcache/write_through_tier.h): stores go to both tiers;
// one completion thread finishes each combined ticket once both are done.
#include "kvcache/write_through_tier.h"

#include "kvcache/error.h"
#include "tier/ticket_state.h"
#include "tier/workers.h"

namespace kvcache {

namespace {

struct Pending {
  std::shared_ptr<TierTicket::State> state;
  TierTicket near, far;
};

// Finishes `p.state` with near's results once both tickets are done.
void finish(const Pending& p) {
  p.far.wait();
  const auto results = p.near.store_results();
  for (std::size_t i = 0; i < results.size(); ++i) p.state->finish_store(i, results[i]);
}

}  // namespace

struct WriteThroughTier::Impl {
  Impl(std::shared_ptr<Tier> n, std::shared_ptr<Tier> f) : near(std::move(n)), far(std::move(f)) {
    if (near == nullptr || far == nullptr) {
      throw InvalidArgument(std::string("write-through tier: the ") +
                            (near == nullptr ? "near" : "far") + " tier is null");
    }
    if (near == far) {
      throw InvalidArgument("write-through tier: near and far are the same tier '" +
                            std::string(near->name()) + "'");
    }
    if (!(near->fingerprint() == far->fingerprint())) {
      throw InvalidArgument("write-through tier: tier '" + std::string(far->name()) +
                            "' has another fingerprint than tier '" + std::string(near->name()) +
                            "' (digest " + std::to_string(far->fingerprint().digest()) + " vs " +
                            std::to_string(near->fingerprint().digest()) + ")");
    }
  }

  std::shared_ptr<Tier> near, far;
  // One thread finishing the combined tickets in order, woken lazily (a
  // write-back's caller pays no wake-up); last: destroyed first, finishing
  // every ticket queued.
  tier::TierWorkers completer{1};
};

WriteThroughTier::WriteThroughTier(std::shared_ptr<Tier> near, std::shared_ptr<Tier> far)
    : impl_(std::make_unique<Impl>(std::move(near), std::move(far))) {}

WriteThroughTier::~WriteThroughTier() = default;

std::string_view WriteThroughTier::name() const { return impl_->near->name(); }
const TierFingerprint& WriteThroughTier::fingerprint() const { return impl_->near->fingerprint(); }
bool WriteThroughTier::enabled() const { return impl_->near->enabled(); }

std::vector<std::uint8_t> WriteThroughTier::contains(std::span<const PageKey> keys) {
  return impl_->near->contains(keys);
}

TierTicket WriteThroughTier::store(std::span<const PageWrite> pages) {
  Pending p{TierTicket::State::for_stores(pages.size()), impl_->near->store(pages), {}};
  try {
    p.far = impl_->far->store(pages);
  } catch (...) {
    p.far = TierTicket();  // near alone
  }
  TierTicket out(p.state);
  if (p.near.done() && p.far.done()) {
    finish(p);
  } else {
    p.state->set_nudge(impl_->completer.nudger());
    impl_->completer.post([p = std::move(p)] { finish(p); }, tier::TierWorkers::Wake::lazy);
  }
  return out;
}

TierTicket WriteThroughTier::load(std::span<const PageRead> pages) {
  return impl_->near->load(pages);
}

TierStats WriteThroughTier::stats() const { return impl_->near->stats(); }
void WriteThroughTier::take_evicted(std::vector<PageKey>& out) { impl_->near->take_evicted(out); }

const std::shared_ptr<Tier>& WriteThroughTier::near() const { return impl_->near; }
const std::shared_ptr<Tier>& WriteThroughTier::far() const { return impl_->far; }

}  // namespace kvcache
