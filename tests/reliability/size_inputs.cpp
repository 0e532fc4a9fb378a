#include "reliability/size_inputs.h"

#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvcache/kvcache.h"

namespace kvcache::testing {

namespace {

using u128 = unsigned __int128;

class Bytes {
 public:
  explicit Bytes(std::span<const std::uint8_t> b) : b_(b) {}
  std::uint8_t next() { return i_ < b_.size() ? b_[i_++] : 0; }
  // An edge value or a small one, chosen by the next bytes.
  std::uint32_t size() {
    static constexpr std::uint32_t kEdges[] = {0u,          1u,          2u,          3u,
                                               16u,         65535u,      65536u,      1u << 20,
                                               2147483647u, 2147483648u, 4294967294u, 4294967295u};
    const std::uint8_t pick = next();
    if (pick < 128) return 1 + next() % 64;  // small
    return kEdges[pick % std::size(kEdges)];
  }

 private:
  std::span<const std::uint8_t> b_;
  std::size_t i_ = 0;
};

[[noreturn]] void fail(const std::string& what) { throw std::logic_error(what); }

// The exact product, or an InvalidArgument: nothing else is acceptable.
template <class F>
void expect_exact(const char* what, u128 exact, F&& compute) {
  const bool fits = exact <= std::numeric_limits<std::uint64_t>::max();
  try {
    const std::uint64_t got = compute();
    if (!fits)
      fail(std::string(what) + " returned " + std::to_string(got) + " for a product past 2^64");
    if (got != exact)
      fail(std::string(what) + " returned " + std::to_string(got) + ", not the exact product");
  } catch (const InvalidArgument&) {
    if (fits) return;  // refusing a large but valid size is allowed (e.g. params limits)
  }
}

constexpr std::uint64_t kBuildBudget = 8u << 20;  // bytes of pool the driver may allocate

void exercise(const KVCacheParams& p, std::uint32_t blocks, std::uint32_t max_seq) {
  std::unique_ptr<KVCacheManager> m;
  try {
    if (p.cache_strategy == CacheStrategy::paged) {
      m = std::make_unique<PagedKVCacheManager>(p, blocks, 2, max_seq);
    } else {
      m = std::make_unique<ContinuousBatchingKVCacheManager>(p, blocks, max_seq);
    }
  } catch (const Error&) {
    return;  // refused with a typed error: fine
  }
  const std::vector<SeqId> ids = m->claim(1);
  const std::uint32_t room = p.cache_strategy == CacheStrategy::paged
                                 ? static_cast<std::uint32_t>(std::min<std::uint64_t>(
                                       max_seq, std::uint64_t{blocks} * p.page_size))
                                 : max_seq;
  if (room == 0) return;
  const std::uint32_t n = room;
  KVCacheBatch batch;
  try {
    batch = m->fetch(ids, std::span<const std::uint32_t>(&n, 1));
  } catch (const Error&) {
    return;
  }
  // Write the last element of the last row of every layer's K and V.
  for (std::uint32_t layer = 0; layer < p.num_layers; ++layer) {
    visit_dtype(p.dtype, [&](auto tag) {
      using T = decltype(tag);
      auto write = [&](const auto& coll) {
        for (const auto& c : {coll.get_key_cache(layer), coll.get_value_cache(layer)})
          *c.ptr(0, c.n_kv_heads() - 1, n - 1, c.head_dim() - 1) = from_float<T>(1.0f);
      };
      if (p.cache_strategy == CacheStrategy::paged) {
        write(batch.paged<T>());
      } else {
        write(batch.continuous<T>());
      }
    });
  }
  m->check_invariants();
}

}  // namespace

void run_size_inputs(std::span<const std::uint8_t> bytes) {
  Bytes in(bytes);
  KVCacheParams p;
  p.dtype = static_cast<DType>(in.next() % 3);
  p.num_layers = in.size();
  p.n_kv_heads = in.size();
  p.head_dim = in.size();
  p.cache_strategy = in.next() % 2 ? CacheStrategy::paged : CacheStrategy::continuous;
  p.page_size = in.size();
  p.n_devices = 1;
  p.page_layout = in.next() % 2 ? PageLayout::hnd : PageLayout::nhd;
  p.pool_arrangement = in.next() % 2 ? PoolArrangement::per_layer : PoolArrangement::interleaved;
  const std::uint32_t blocks = in.size(), max_seq = in.size();
  try {
    p.validate();
  } catch (const InvalidArgument&) {
    return;
  }
  const u128 token = u128{2} * p.num_layers * p.n_kv_heads * p.head_dim * dtype_size(p.dtype);
  if (p.bytes_per_token() != token) fail("bytes_per_token wrapped");
  if (p.cache_strategy == CacheStrategy::paged) {
    const u128 exact = u128{blocks} * p.page_size * token;
    expect_exact("PagedKVCacheManager::estimated_memory_size", exact,
                 [&] { return PagedKVCacheManager::estimated_memory_size(p, blocks); });
    const std::uint64_t budget = (std::uint64_t{in.next()} << 56) | in.size();
    const std::uint32_t pages = PagedKVCacheManager::pages_for_memory(p, budget);
    if (u128{pages} * p.page_size * token > budget) fail("pages_for_memory overshoots its budget");
    if (exact <= kBuildBudget) exercise(p, blocks, max_seq);
  } else {
    const u128 exact = u128{blocks} * max_seq * token;
    expect_exact("ContinuousBatchingKVCacheManager::estimated_memory_size", exact, [&] {
      return ContinuousBatchingKVCacheManager::estimated_memory_size(p, blocks, max_seq);
    });
    if (exact <= kBuildBudget) exercise(p, blocks, max_seq);
  }
}

}  // namespace kvcache::testing
