// The documented flow (docs/CUDA.md, device_collection.h) with a real
// PagedKVCacheManager: the manager on the host does the bookkeeping, the page
// pool lives on the GPU. Each step the same random K/V/q go through
// cuda::store_kv + cuda::attention on the device pool (via DeviceCollection,
// every layer) and through the references on the manager's own host pool;
// the two pools must stay equal byte for byte and the outputs within the
// kernels' bound (kernels_test.cpp). Steps: a ragged prefill, decodes, a
// release whose pages a new sequence then reuses (out of order), a
// speculative step of 3 tokens. Pages are handed out in shuffled order by
// releasing an interleaved set first.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kvcache/kvcache.h"

namespace kvcache::cuda::test {
namespace {

constexpr float kAbsTol = 1e-5f;
constexpr float kRelTol = 1e-5f;
constexpr std::uint32_t kLayers = 2, kKvHeads = 2, kGroup = 4, kDim = 64, kPage = 16;

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  return kvcache::test::random_floats(n, -1.0f, 1.0f, rng);
}

KVCacheParams flow_params(PoolArrangement arrangement) {
  KVCacheParams p = bf16_paged_params(kLayers, kKvHeads, kDim, kPage);
  p.pool_arrangement = arrangement;
  return p;
}

// Every flow on both pool arrangements (the device pool and copy_blocks follow it).
class ManagerFlow : public ::testing::TestWithParam<PoolArrangement> {
 protected:
  KVCacheParams params = flow_params(GetParam());
  PagedKVCacheManager manager{params, /*total_num_pages=*/96, /*max_batch_size=*/8,
                              /*max_seq_len=*/1024};
  std::mt19937 rng{2024};
  DeviceBuffer<BFloat16> pool;
  AttentionWorkspace ws;
  std::size_t copies_made = 0;

  // One step for `seqs` with `new_tokens` each, on both pools; commits it.
  void step(const std::vector<SeqId>& seqs, const std::vector<std::uint32_t>& new_tokens) {
    std::vector<std::uint32_t> rows(seqs.size() + 1, 0);
    std::partial_sum(new_tokens.begin(), new_tokens.end(), rows.begin() + 1);
    const std::size_t total = rows.back();
    const std::uint32_t n_q = kKvHeads * kGroup;
    KVCacheBatch batch = manager.fetch(seqs, new_tokens);
    auto host = batch.paged<BFloat16>();
    if (pool.empty()) {
      pool = DeviceBuffer<BFloat16>(host.desc().pool_elements());
      upload_host_pool(host);  // both pools start from the same bytes
    }
    DeviceCollection<BFloat16> dev(host.desc(), pool.data());
    // The fetch's copy-on-write copies, made in the device pool as on the host.
    copy_blocks(host.desc(), pool.data(), batch.block_copies());
    copies_made += batch.block_copies().size();
    const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(rows);
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      SCOPED_TRACE("layer " + std::to_string(layer));
      const auto k_new = random_floats(total * kKvHeads * kDim, rng);
      const auto v_new = random_floats(total * kKvHeads * kDim, rng);
      const auto q = random_floats(total * n_q * kDim, rng);
      const auto k_d = DeviceBuffer<float>::from_host(k_new);
      const auto v_d = DeviceBuffer<float>::from_host(v_new);
      const auto q_d = DeviceBuffer<float>::from_host(q);
      DeviceBuffer<float> out_d(q.size());
      out_d.fill_bytes(0xff);  // NaN poison
      cuda::store_kv(dev.key(layer), dev.value(layer), k_d.span(), v_d.span(), rows_d.span());
      cuda::attention(dev.key(layer), dev.value(layer), q_d.span(), n_q, rows_d.span(),
                      out_d.span(), {}, nullptr, &ws);
      const auto k_host = host.get_key_cache(layer), v_host = host.get_value_cache(layer);
      store_kv_reference(k_host, v_host, std::span<const float>(k_new),
                         std::span<const float>(v_new), std::span<const std::uint32_t>(rows));
      // Prefill steps (> 4 new rows) take the tensor-core prefill kernel: its
      // reference sees q rounded to bf16, its bound is prefill_abs_tol.
      const bool prefill =
          std::string(attention_kernel_name(dev.key(layer), dev.value(layer))) == "prefill";
      std::vector<float> q_ref = q;
      if (prefill) {
        for (float& x : q_ref) x = to_float(from_float<BFloat16>(x));
      }
      std::vector<float> ref(q.size());
      attention_reference(k_host, v_host, std::span<const float>(q_ref), n_q,
                          std::span<const std::uint32_t>(rows), std::span<float>(ref));
      synchronize();
      expect_close(out_d.to_host(), ref,
                   prefill ? prefill_abs_tol<BFloat16>(host.desc().max_cache_length) : kAbsTol,
                   kRelTol, "attention through the manager");
    }
    expect_pools_equal(host);
    manager.step(seqs, new_tokens);
  }

  void upload_host_pool(const PagedKVCacheCollection<BFloat16>& host) {
    pool.upload(std::span<const BFloat16>(host.blocks(), host.desc().pool_elements()));
  }

  void expect_pools_equal(const PagedKVCacheCollection<BFloat16>& host) {
    const std::vector<BFloat16> d = pool.to_host();
    EXPECT_EQ(std::memcmp(d.data(), host.blocks(), d.size() * sizeof(BFloat16)), 0)
        << "device pool differs from the manager's host pool";
  }
};

TEST_P(ManagerFlow, PrefillDecodeReleaseReuseSpeculative) {
  // Shuffle the free list: claim and fill 6 sequences, release every other.
  std::vector<SeqId> warm = manager.claim(6);
  step(warm, {17, 40, 3, 33, 16, 29});
  for (std::size_t i = 0; i < warm.size(); i += 2) manager.release(warm[i]);

  std::vector<SeqId> seqs = manager.claim(3);
  step(seqs, {37, 5, 20});  // ragged prefill into recycled pages
  step(seqs, {1, 1, 1});    // decode (the decode kernel)
  step(seqs, {1, 1, 1});
  manager.release(seqs[1]);
  const SeqId fresh = manager.claim(1)[0];
  step({seqs[0], fresh, seqs[2]}, {3, 12, 3});  // speculative rows + a prefill
  step({seqs[0], fresh, seqs[2]}, {1, 1, 1});
  manager.check_invariants();
}

// Parallel sampling and rollback: forked sequences share their parent's pages
// and every first write into a shared page is copied; the device pool follows
// through copy_blocks alone, so both pools stay equal byte for byte and the
// attention outputs agree with the host reference.
TEST_P(ManagerFlow, ForkAndTruncateCopiesReachTheDevicePool) {
  const SeqId parent = manager.claim(1)[0];
  step({parent}, {21});  // 16 + 5: the second page is partial
  const SeqId a = manager.fork(parent), b = manager.fork(parent);
  step({parent, a, b}, {1, 1, 1});  // parent and a copy the partial page, b keeps it
  EXPECT_EQ(copies_made, 2u);
  step({parent, a, b}, {3, 1, 2});
  manager.truncate(a, 10);  // a's first page: still shared with parent and b
  step({a}, {2});           // copied before a writes at position 10
  EXPECT_EQ(copies_made, 3u);
  step({parent, a, b}, {1, 1, 1});
  manager.check_invariants();
}

TEST_P(ManagerFlow, CopyBlocksRefusesBlocksOutsideThePool) {
  const SeqId s = manager.claim(1)[0];
  step({s}, {4});
  const std::uint32_t n = 0;
  const KVCacheBatch batch = manager.fetch(std::span(&s, 1), std::span(&n, 1));
  const auto host = batch.paged<BFloat16>();
  const std::vector<BlockCopy> bad = {{0, 1}, {2, 96}};
  EXPECT_THROW(
      {
        try {
          copy_blocks(host.desc(), pool.data(), bad);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("copies[1] names block 96, the pool has 96"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      InvalidArgument);
  expect_pools_equal(host);  // the valid first pair was not made either
  std::vector<BFloat16> on_host(16);
  EXPECT_THROW(copy_blocks(host.desc(), on_host.data(), std::span<const BlockCopy>(bad).first(1)),
               InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Arrangements, ManagerFlow,
                         ::testing::Values(PoolArrangement::interleaved,
                                           PoolArrangement::per_layer));

}  // namespace
}  // namespace kvcache::cuda::test
