// kvcache/write_through_tier.h — a near tier whose every stored page also goes
// to a farther tier: host memory in front of a disk (kvcache/tier.h has the
// contract).
//
// WriteThroughTier(near, far) answers name(), fingerprint(), enabled(),
// contains(), load(), stats() and take_evicted() as `near` does (far's
// evictions are far's to report, as a manager configured with {write_through,
// far} has it do), and hands each store() to
// both: `near` keeps what its capacity allows, `far` keeps everything `near`
// ever stored, so a page `near` evicts is still in `far`, and a `far` that
// survives a restart (DiskTier) finds it then. The manager writes back to its
// first tier only (PrefixCacheConfig::tiers), so a host and a disk tier are
// configured as {write_through(host, disk), disk}: the write-back reaches
// both, and match_prefix loads from the disk what the host no longer holds.
//
// Tickets: store() returns a ticket done once both tiers' stores are done,
// with `near`'s result per page (the caller's buffers are borrowed until
// then); `far`'s results show in far's own stats. A completion thread waits
// for the two tickets of each store, in order. A store that `far` refuses
// with an exception (it cannot, for a fingerprint equal to near's: the sizes
// near accepted) goes to `near` alone.
//
// Throws InvalidArgument from the constructor for a null tier, one tier
// twice, or fingerprints that differ; store()/load() throw what `near`
// throws (nothing queued). Thread-safety: every method from any thread. The
// destructor waits for every store in flight.
#pragma once

#include <memory>

#include "kvcache/tier.h"

namespace kvcache {

class WriteThroughTier final : public Tier {
 public:
  WriteThroughTier(std::shared_ptr<Tier> near, std::shared_ptr<Tier> far);
  ~WriteThroughTier() override;

  std::string_view name() const override;
  const TierFingerprint& fingerprint() const override;
  bool enabled() const override;
  std::vector<std::uint8_t> contains(std::span<const PageKey> keys) override;
  TierTicket store(std::span<const PageWrite> pages) override;
  TierTicket load(std::span<const PageRead> pages) override;
  TierStats stats() const override;
  void take_evicted(std::vector<PageKey>& out) override;

  const std::shared_ptr<Tier>& near() const;
  const std::shared_ptr<Tier>& far() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
