// kvcache/tier.h — the storage tiers below the device pool: host memory, a
// local disk, and later a shared remote store (Redis). One interface, many
// media.
//
// A tier keeps whole pages (every layer's K and V of page_size tokens, the
// bytes of one block of the pool, packed interleaved: [2][num_layers][block]
// whatever the pool's arrangement) under a 128-bit content key, and gives
// them back on request. The key is the page's place in a token chain:
//   key_j = page_key(key_{j-1}, tokens of page j, fingerprint digest),
//   key_{-1} = {0, 0}
// so equal keys mean equal token prefixes of equal bytes-compatible caches.
// A cache split over several devices (tensor parallelism) keeps one tier per
// device shard, each holding that device's heads of every page: the chain
// runs with a digest common to the shards and each shard's key is the chain
// key masked with its own fingerprint (shard_key below), so a rank that runs
// in its own process finds what shard d of a multi-device manager stored.
// A stored value carries a self-describing header (PageHeader) with the
// fingerprint, the key, the page's token ids and a checksum of all of it:
// a load verifies them and never hands out a page whose tokens, namespace
// or bytes do not match (LoadResult::mismatch / corrupt), so neither a key
// collision nor a torn or rotten write can reach a kernel.
//
// Namespacing: TierFingerprint says everything that makes two caches' bytes
// interchangeable (dtype, layout, arrangement-independent page shape, layer
// range, device shard, model id, cache salt). A tier is opened for one
// fingerprint; values written under another are invisible to it (their keys
// are different, and a header check refuses them).
//
// Asynchrony: store() and load() enqueue and return a TierTicket at once; I/O
// runs on the tier's own threads (or io_uring), never on the caller's. The
// caller keeps the buffers it passed alive and untouched until the ticket is
// done(); wait() blocks until then. contains() is synchronous and cheap (an
// in-memory index), so a manager may call it under its lock.
//
// Failure: an I/O error or a full medium never throws out of a ticket; it
// shows as LoadResult::failed / StoreResult::failed for the pages concerned,
// is counted in TierStats, logged, and a tier that cannot go on (disk gone)
// disables itself (enabled() false): every later call answers "absent" /
// "not stored" and the cache goes on without it. Bad arguments (a buffer of
// the wrong size, a wrong token count) throw InvalidArgument at the call and
// enqueue nothing.
//
// Thread-safety: every Tier method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/dtype.h"
#include "kvcache/params.h"

namespace kvcache {

// 128-bit content key of a page (see the file comment).
struct PageKey {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
  friend bool operator==(const PageKey&, const PageKey&) = default;
};

// What makes two caches' page bytes interchangeable.
struct TierFingerprint {
  DType dtype = DType::f32;
  PageLayout layout = PageLayout::nhd;
  std::uint32_t page_size = 0;   // tokens per page
  std::uint32_t n_kv_heads = 0;  // on this device shard
  std::uint32_t head_dim = 0;
  std::uint32_t layer_begin = 0;  // layers [layer_begin, layer_end) of the model
  std::uint32_t layer_end = 0;
  std::uint32_t device_index = 0;  // this shard's index among device_count
  std::uint32_t device_count = 1;
  std::string model_id;    // set by the caller: the weights' identity
  std::string cache_salt;  // tenant isolation, as the prefix cache's extra key

  // The fingerprint of a manager's cache with these params (device 0 of
  // params.n_devices, all layers), for `model_id` and `cache_salt`.
  static TierFingerprint of(const KVCacheParams& params, std::string model_id = {},
                            std::string cache_salt = {}, std::uint32_t device_index = 0);
  // 64-bit digest of every field (XXH3): part of every header, and of every
  // key of a one-device cache.
  std::uint64_t digest() const;
  // Several devices (device_count > 1): each page has one chain key, made
  // with chain_digest() (the digest of this fingerprint with device_index
  // 0, the same for every shard), and shard d's tier holds it under
  // shard_key(chain key, shard_mask()) (a 128-bit mask from digest(), so
  // the shards' keys differ). One device: chain_digest() == digest() and
  // the mask is {0, 0} (the key is the chain key).
  std::uint64_t chain_digest() const;
  PageKey shard_mask() const;
  // Bytes of one page's K and V, every layer of the range (int8: its in-page
  // scales too, as KVCacheParams::bytes_per_token counts them).
  std::size_t page_bytes() const;

  friend bool operator==(const TierFingerprint&, const TierFingerprint&) = default;
};

// key_j from key_{j-1}, the page's tokens and the fingerprint's digest
// (XXH3-128). parent {0, 0} for a sequence's first page. Allocates nothing.
PageKey page_key(PageKey parent, std::span<const std::uint32_t> tokens,
                 std::uint64_t digest) noexcept;

// A page's key in one shard's tier: its chain key XOR the shard's mask
// (TierFingerprint::shard_mask); XOR with the mask again gives the chain key.
constexpr PageKey shard_key(PageKey chain, PageKey mask) noexcept {
  return {chain.hi ^ mask.hi, chain.lo ^ mask.lo};
}

// The header before every stored value (fixed size; token ids and page bytes
// follow it). checksum: XXH3-64 over the header (checksum field zero), the
// token ids and the page bytes.
struct PageHeader {
  static constexpr std::uint32_t kMagic = 0x4B564350;  // "KVCP"
  static constexpr std::uint32_t kVersion = 1;
  std::uint32_t magic = kMagic;
  std::uint32_t version = kVersion;
  std::uint64_t fingerprint = 0;  // TierFingerprint::digest()
  PageKey key;
  std::uint32_t num_tokens = 0;  // == page_size
  std::uint32_t reserved = 0;
  std::uint64_t page_bytes = 0;
  std::uint64_t checksum = 0;
};
static_assert(sizeof(PageHeader) == 56);

// One page to store: its key, its token ids (page_size of them) and its bytes
// (page_bytes()). Borrowed until the ticket is done.
struct PageWrite {
  PageKey key;
  std::span<const std::uint32_t> token_ids;
  std::span<const std::byte> bytes;
};

// One page to load into `bytes` (page_bytes()), verified against the
// key and the token ids the caller expects. Borrowed until the ticket is done.
struct PageRead {
  PageKey key;
  std::span<const std::uint32_t> token_ids;
  std::span<std::byte> bytes;
};

enum class LoadResult : std::uint8_t {
  pending,   // not finished yet
  loaded,    // bytes hold the page
  missing,   // not in the tier (never stored, evicted, or the tier is disabled)
  mismatch,  // a value under this key holds other tokens or another namespace: refused
  corrupt,   // checksum failed (torn or damaged): refused and dropped from the tier
  failed,    // an I/O error
};
enum class StoreResult : std::uint8_t {
  pending,
  stored,    // the tier holds the page (for a disk tier: written, then recorded)
  present,   // already held under this key: nothing written
  rejected,  // not admitted (admission policy, or larger than the whole tier)
  failed,    // an I/O error or a full medium
};

std::string_view load_result_name(LoadResult r);
std::string_view store_result_name(StoreResult r);

// The completion of one store() or load() call: poll done() or wait(), then
// read one result per page, in the order passed. Copyable handle to shared
// state; a ticket outliving its tier stays valid (the tier finishes or
// fails its pages before it is destroyed).
class TierTicket {
 public:
  struct State;
  TierTicket() = default;
  explicit TierTicket(std::shared_ptr<State> state);

  bool done() const;
  void wait() const;
  // One result per page; these wait until done(). A default-made ticket is
  // done and has none.
  std::span<const LoadResult> load_results() const;
  std::span<const StoreResult> store_results() const;

 private:
  std::shared_ptr<State> state_;
};

// Counters since the tier opened; gauges are now.
struct TierStats {
  std::uint64_t pages_held = 0;      // gauge
  std::uint64_t bytes_held = 0;      // gauge (page bytes, headers excluded)
  std::uint64_t capacity_bytes = 0;  // gauge; UINT64_MAX for unlimited
  std::uint64_t lookups = 0;         // keys asked of contains()
  std::uint64_t hits = 0;            // of those, present
  std::uint64_t pages_stored = 0;
  std::uint64_t pages_loaded = 0;
  std::uint64_t bytes_stored = 0;
  std::uint64_t bytes_loaded = 0;
  std::uint64_t evictions = 0;  // pages the tier dropped for room
  std::uint64_t rejected = 0;   // stores not admitted
  std::uint64_t corrupt = 0;    // loads or recoveries refused by the checksum
  std::uint64_t io_errors = 0;
  std::uint64_t load_nanoseconds = 0;  // summed over loads (mean = / pages_loaded)
  bool enabled = true;
};

class Tier {
 public:
  virtual ~Tier() = default;
  Tier() = default;
  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  // "host", "disk", ...: the label of its metrics and events.
  virtual std::string_view name() const = 0;
  virtual const TierFingerprint& fingerprint() const = 0;
  // False once the tier disabled itself (see the file comment).
  virtual bool enabled() const = 0;

  // One flag per key (1: held now). Synchronous, no I/O.
  virtual std::vector<std::uint8_t> contains(std::span<const PageKey> keys) = 0;
  // Copies each page into the tier (asynchronously for the medium; the
  // caller's buffers are borrowed until the ticket is done).
  virtual TierTicket store(std::span<const PageWrite> pages) = 0;
  // Copies each page out of the tier into the caller's buffers.
  virtual TierTicket load(std::span<const PageRead> pages) = 0;

  virtual TierStats stats() const = 0;

  // Eviction reports: the keys of the pages this tier evicted for room since
  // the last call (not pages dropped as corrupt, nor those of a disabled
  // tier), appended to `out` oldest first, at most kEvictionReports of them:
  // a tier keeps that many between calls and lets the oldest go beyond. For
  // one consumer: the manager calls it under its own lock after each call
  // that writes back or finishes loads, and emits a `removed` PageEvent per
  // key (kvcache/prefix_cache.h). It never waits on I/O and never calls out
  // of the tier, so it cannot deadlock with a tier thread; the tiers here
  // record under a lock of their own that nothing else is taken under.
  // Throws only what growing `out` throws (none when `out` has room for
  // kEvictionReports more). The default reports nothing.
  static constexpr std::size_t kEvictionReports = 4096;
  virtual void take_evicted(std::vector<PageKey>& out) { (void)out; }
};

}  // namespace kvcache
