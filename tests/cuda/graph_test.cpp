// CUDA graphs over the manager flow (kvcache/cuda/device_collection.h, "CUDA
// graphs"; kvcache/cuda/kernels.h): a decode step's store_kv + attention for
// every layer is captured once on a DeviceCollection built with bounds, then
// replayed for later steps after DeviceCollection::update() uploaded each
// step's cache lengths and page table (whose stride grows as sequences cross
// page boundaries) and new inputs were copied into the captured buffers. Each
// replay is checked against the references on the manager's host pool (pools
// byte for byte, outputs within the kernels' bound) and against a direct
// attention call on the same data (bit for bit). A long entry among few
// makes the plan split its context, so the merge kernel and the split
// scratch are in the graph. With and without an AttentionWorkspace. Also: update()'s and the
// bounds' errors, which leave the device metadata unchanged.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kvcache/kvcache.h"

namespace kvcache::cuda::test {
namespace {

constexpr float kAbsTol = 1e-5f;
constexpr float kRelTol = 1e-5f;
constexpr std::uint32_t kLayers = 2, kKvHeads = 2, kGroup = 4, kDim = 64, kPage = 16;
constexpr std::uint32_t kMaxSeqLen = 1024;
constexpr std::uint32_t kNq = kKvHeads * kGroup;

void cuda_ok(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  return kvcache::test::random_floats(n, -1.0f, 1.0f, rng);
}

class GraphFlow : public ::testing::Test {
 protected:
  KVCacheParams params = bf16_paged_params(kLayers, kKvHeads, kDim, kPage);
  PagedKVCacheManager manager{params, /*total_num_pages=*/160, /*max_batch_size=*/8,
                              /*max_seq_len=*/kMaxSeqLen};
  std::mt19937 rng{77};
  DeviceBuffer<BFloat16> pool;
  cudaStream_t stream = nullptr;

  void SetUp() override { cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate"); }
  void TearDown() override {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // A prefill of `lengths` tokens for `seqs` with direct calls (the pools are
  // then equal and the sequences have history), committed.
  void prefill(const std::vector<SeqId>& seqs, const std::vector<std::uint32_t>& lengths) {
    KVCacheBatch batch = manager.fetch(seqs, lengths);
    auto host = batch.paged<BFloat16>();
    if (pool.empty()) {  // once: a captured graph keeps the pool's address
      pool = DeviceBuffer<BFloat16>(host.desc().pool_elements());
      pool.upload(std::span<const BFloat16>(host.blocks(), host.desc().pool_elements()));
    }
    std::vector<std::uint32_t> rows(seqs.size() + 1, 0);
    std::partial_sum(lengths.begin(), lengths.end(), rows.begin() + 1);
    DeviceCollection<BFloat16> dev(host.desc(), pool.data());
    const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(rows);
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      const auto k = random_floats(std::size_t{rows.back()} * kKvHeads * kDim, rng);
      const auto v = random_floats(k.size(), rng);
      const auto k_d = DeviceBuffer<float>::from_host(k);
      const auto v_d = DeviceBuffer<float>::from_host(v);
      cuda::store_kv(dev.key(layer), dev.value(layer), k_d.span(), v_d.span(), rows_d.span());
      store_kv_reference(host.get_key_cache(layer), host.get_value_cache(layer),
                         std::span<const float>(k), std::span<const float>(v),
                         std::span<const std::uint32_t>(rows));
    }
    synchronize();
    manager.step(seqs, lengths);
  }

  // The pools byte for byte, except block `skip` (the padding block, which
  // only the device writes; kNoPaddingBlock: none).
  void expect_pools_equal(const PagedKVCacheCollection<BFloat16>& host,
                          std::uint32_t skip = kNoPaddingBlock) {
    const std::vector<BFloat16> d = pool.to_host();
    const std::size_t block = d.size() / host.desc().num_blocks;
    for (std::uint32_t b = 0; b < host.desc().num_blocks; ++b) {
      if (b == skip) continue;
      ASSERT_EQ(
          std::memcmp(d.data() + b * block, host.blocks() + b * block, block * sizeof(BFloat16)), 0)
          << "device pool differs from the manager's host pool in block " << b;
    }
  }

  // Decode steps (one token per sequence), step s over schedule[s], captured
  // at the first and replayed at every later one, on a collection of
  // `entries` entries (more than a step's sequences: padded with
  // padding_block); `ws` may be nullptr.
  void run_decode_steps(const std::vector<std::vector<SeqId>>& schedule, std::uint32_t entries,
                        std::uint32_t padding_block, AttentionWorkspace* ws) {
    std::vector<std::uint32_t> rows(entries + 1);  // padded entries get a row each too
    std::iota(rows.begin(), rows.end(), 0u);
    const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(rows);
    // The captured input and output buffers, one set per layer.
    std::vector<DeviceBuffer<float>> k_d, v_d, q_d, out_d;
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      k_d.emplace_back(std::size_t{entries} * kKvHeads * kDim);
      v_d.emplace_back(std::size_t{entries} * kKvHeads * kDim);
      q_d.emplace_back(std::size_t{entries} * kNq * kDim);
      out_d.emplace_back(std::size_t{entries} * kNq * kDim);
    }
    const DeviceCollectionBounds bounds{kMaxSeqLen / kPage, 1, kMaxSeqLen, entries, padding_block};
    std::unique_ptr<DeviceCollection<BFloat16>> dev;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    auto enqueue_step = [&] {
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        cuda::store_kv(dev->key(layer), dev->value(layer), k_d[layer].span(), v_d[layer].span(),
                       rows_d.span(), stream);
        cuda::attention(dev->key(layer), dev->value(layer), q_d[layer].span(), kNq, rows_d.span(),
                        out_d[layer].span(), {}, stream, ws);
      }
    };
    std::uint32_t max_stride = 0, first_stride = 0;
    for (std::size_t s = 0; s < schedule.size(); ++s) {
      SCOPED_TRACE("decode step " + std::to_string(s));
      const std::vector<SeqId>& seqs = schedule[s];
      const std::uint32_t batch = static_cast<std::uint32_t>(seqs.size());
      const std::vector<std::uint32_t> ones(batch, 1);
      KVCacheBatch kb = manager.fetch(seqs, ones);
      auto host = kb.paged<BFloat16>();
      if (s == 0) first_stride = host.desc().lookup_stride;
      max_stride = std::max(max_stride, host.desc().lookup_stride);
      if (!dev) {
        dev =
            std::make_unique<DeviceCollection<BFloat16>>(host.desc(), pool.data(), bounds, stream);
        ASSERT_EQ(dev->desc().lookup_stride, bounds.lookup_stride);
        ASSERT_EQ(dev->desc().max_full_context_length, bounds.max_full_context_length);
        ASSERT_EQ(dev->desc().batch_size, entries);
      } else {
        dev->update(host.desc(), stream);
      }
      std::vector<std::vector<float>> k(kLayers), v(kLayers), q(kLayers);
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        k[layer] = random_floats(k_d[layer].size(), rng);
        v[layer] = random_floats(v_d[layer].size(), rng);
        q[layer] = random_floats(q_d[layer].size(), rng);
        k_d[layer].upload(k[layer], stream);
        v_d[layer].upload(v[layer], stream);
        q_d[layer].upload(q[layer], stream);
        out_d[layer].fill_bytes(0xff, stream);  // NaN poison
      }
      if (s == 0) {
        enqueue_step();  // direct calls: the workspace grows here, not in the capture
        synchronize(stream);
        cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "BeginCapture");
        enqueue_step();
        cuda_ok(cudaStreamEndCapture(stream, &graph), "EndCapture");
        cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "GraphInstantiate");
      } else {
        cuda_ok(cudaGraphLaunch(exec, stream), "GraphLaunch");
      }
      synchronize(stream);
      // The references see the step's own entries: the first `batch` rows.
      const std::span<const std::uint32_t> real_rows(rows.data(), batch + 1);
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        SCOPED_TRACE("layer " + std::to_string(layer));
        const auto k_host = host.get_key_cache(layer), v_host = host.get_value_cache(layer);
        store_kv_reference(
            k_host, v_host,
            std::span<const float>(k[layer]).first(std::size_t{batch} * kKvHeads * kDim),
            std::span<const float>(v[layer]).first(std::size_t{batch} * kKvHeads * kDim),
            real_rows);
        const std::size_t n_out = std::size_t{batch} * kNq * kDim;
        std::vector<float> ref(n_out);
        attention_reference(k_host, v_host, std::span<const float>(q[layer]).first(n_out), kNq,
                            real_rows, std::span<float>(ref));
        std::vector<float> got = out_d[layer].to_host(stream);
        // A direct call on the same data gives the same bits (padded rows too).
        DeviceBuffer<float> direct(got.size());
        cuda::attention(dev->key(layer), dev->value(layer), q_d[layer].span(), kNq, rows_d.span(),
                        direct.span(), {}, stream, ws);
        const std::vector<float> d = direct.to_host(stream);
        EXPECT_EQ(std::memcmp(d.data(), got.data(), d.size() * sizeof(float)), 0)
            << "graph replay differs from a direct call";
        got.resize(n_out);
        expect_close(got, ref, kAbsTol, kRelTol, "graph replay against the reference");
      }
      expect_pools_equal(host, padding_block);
      manager.step(seqs, ones);
    }
    EXPECT_GT(max_stride, first_stride) << "no step grew the page table: the repacking is untested";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }

  // The same sequences every step, no padding.
  void run_decode_steps(const std::vector<SeqId>& seqs, int steps, AttentionWorkspace* ws) {
    run_decode_steps(std::vector<std::vector<SeqId>>(static_cast<std::size_t>(steps), seqs),
                     static_cast<std::uint32_t>(seqs.size()), kNoPaddingBlock, ws);
  }
};

// Each sequence crosses a page boundary within the first two steps (527 + 2
// tokens: the page table's stride grows from 33 to 34); 3 entries x 2 KV heads
// leave most SMs idle, so the long entry's context is split.
TEST_F(GraphFlow, DecodeStepsReplayedWithWorkspace) {
  const std::vector<SeqId> seqs = manager.claim(3);
  prefill(seqs, {47, 15, 527});
  AttentionWorkspace ws;
  run_decode_steps(seqs, 6, &ws);
  manager.check_invariants();
}

TEST_F(GraphFlow, DecodeStepsReplayedWithoutWorkspace) {
  const std::vector<SeqId> seqs = manager.claim(3);
  prefill(seqs, {31, 607, 16});
  run_decode_steps(seqs, 5, nullptr);
  manager.check_invariants();
}

// Continuous batching under one graph: captured for 4 entries while 3
// sequences decode (the 4th entry padded), replayed while a 4th sequence
// joins (no padding) and after one stops taking part (padded again). The
// padding entry writes into a page of a sequence claimed for that.
TEST_F(GraphFlow, PaddedBatchKeepsOneGraphAsTheBatchChanges) {
  const std::vector<SeqId> s = manager.claim(4);
  prefill(s, {47, 15, 527, 200});
  const SeqId pad = manager.claim(1)[0];
  const std::vector<SeqId> pad_seq{pad};
  const std::vector<std::uint32_t> one{1};
  std::uint32_t padding_block = 0;
  {
    KVCacheBatch kb = manager.fetch(pad_seq, one);
    padding_block = kb.paged<BFloat16>().desc().lookup_table[0];
    manager.step(pad_seq, one);
  }
  AttentionWorkspace ws;
  run_decode_steps({{s[0], s[1], s[2]},
                    {s[0], s[1], s[2]},
                    {s[0], s[1], s[2], s[3]},
                    {s[0], s[1], s[2], s[3]},
                    {s[0], s[2], s[3]},
                    {s[0], s[2], s[3]}},
                   4, padding_block, &ws);
  manager.check_invariants();
}

// update() and the bounds reject what does not fit, naming the value and the
// limit, and leave the device metadata as it was.
TEST_F(GraphFlow, UpdateAndBoundsErrorsChangeNothing) {
  const std::vector<SeqId> seqs = manager.claim(2);
  prefill(seqs, {40, 8});
  const std::vector<std::uint32_t> ones{1, 1};
  KVCacheBatch kb = manager.fetch(seqs, ones);
  const CacheDesc h = kb.paged<BFloat16>().desc();
  auto expect_throw = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no exception; expected one naming " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_throw(
      [&] {
        DeviceCollection<BFloat16>(h, pool.data(), {h.lookup_stride - 1, 1, 64});
      },
      "lookup_stride " + std::to_string(h.lookup_stride));
  expect_throw(
      [&] {
        DeviceCollection<BFloat16>(h, pool.data(), {8, 1, 8 * kPage + 1});
      },
      "max_full_context_length " + std::to_string(8 * kPage + 1));
  expect_throw(
      [&] {
        DeviceCollection<BFloat16>(h, pool.data(), {8, 65, 64});
      },
      "max_seq_length 65 exceeds max_full_context_length 64");

  expect_throw(
      [&] {
        DeviceCollection<BFloat16>(h, pool.data(), {8, 1, 64, 3});
      },
      "batch_size 3 exceeds the host batch's 2 without a padding_block");
  expect_throw(
      [&] {
        DeviceCollection<BFloat16>(h, pool.data(), {8, 1, 64, 3, h.num_blocks});
      },
      "padding_block " + std::to_string(h.num_blocks) + " is past the pool's");

  CacheDesc empty = h;  // an empty host batch padded to 2 entries
  empty.batch_size = 0;
  empty.lookup_stride = 0;
  empty.max_seq_length = 0;
  empty.max_cache_length = 0;
  empty.max_full_context_length = 0;
  expect_throw(
      [&] {
        DeviceCollection<BFloat16>(empty, pool.data(), {0, 0, 0, 2, 0});
      },
      "lookup_stride 0 for a batch of 2 entries");

  DeviceCollection<BFloat16> dev(h, pool.data(), {8, 1, 8 * kPage});
  auto metadata = [&] {
    std::vector<std::uint32_t> m(2 + 2 * 8);
    cuda_ok(cudaMemcpy(m.data(), dev.desc().cache_lengths, 2 * sizeof(std::uint32_t),
                       cudaMemcpyDeviceToHost),
            "lengths");
    cuda_ok(cudaMemcpy(m.data() + 2, dev.desc().lookup_table, 16 * sizeof(std::uint32_t),
                       cudaMemcpyDeviceToHost),
            "lookup");
    return m;
  };
  const std::vector<std::uint32_t> before = metadata();
  // Repacked: each row's pages, then the sentinel.
  for (std::uint32_t b = 0; b < 2; ++b) {
    EXPECT_EQ(before[b], h.cache_lengths[b]);
    for (std::uint32_t j = 0; j < 8; ++j) {
      EXPECT_EQ(before[2 + b * 8 + j],
                j < h.lookup_stride ? h.lookup_table[b * h.lookup_stride + j] : h.num_blocks);
    }
  }
  CacheDesc other = h;
  std::vector<std::uint32_t> lengths(h.cache_lengths, h.cache_lengths + 2);
  lengths[0] = 0;  // a different content that would show if uploaded
  other.cache_lengths = lengths.data();
  CacheDesc wider = other;
  wider.max_full_context_length = 8 * kPage + 1;
  std::vector<std::uint32_t> wide_lookup(2 * 9, h.num_blocks);
  for (std::uint32_t b = 0; b < 2; ++b) {
    for (std::uint32_t j = 0; j < h.lookup_stride; ++j)
      wide_lookup[b * 9 + j] = h.lookup_table[b * h.lookup_stride + j];
  }
  wider.lookup_table = wide_lookup.data();
  wider.lookup_stride = 9;
  expect_throw([&] { dev.update(wider); }, "lookup_stride 9 exceeds the collection's bound 8");
  CacheDesc one = other;
  one.batch_size = 1;
  expect_throw([&] { dev.update(one); }, "batch_size 1 differs from the collection's 2");
  CacheDesc layers = other;
  layers.num_layers = 1;
  layers = layers.with_strides();  // a valid desc of another pool shape
  expect_throw([&] { dev.update(layers); }, "num_layers 1 differs");
  CacheDesc seq = other;
  seq.max_seq_length = 2;
  expect_throw([&] { dev.update(seq); }, "max_seq_length 2 exceeds the collection's bound 1");
  EXPECT_EQ(metadata(), before) << "a rejected update changed the device metadata";
  dev.update(other);  // accepted: the new lengths arrive
  EXPECT_EQ(metadata()[0], 0u);
}

}  // namespace
}  // namespace kvcache::cuda::test
