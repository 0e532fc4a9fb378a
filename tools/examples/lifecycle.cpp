// tools/examples/lifecycle.cpp — the README's usage example, compiled and run
// by ctest (example.lifecycle) so it always matches the headers.
#include <cstdio>
#include <vector>

#include "kvcache/kvcache.h"

int main() {
  using namespace kvcache;
  KVCacheParams params{.dtype = DType::f32,
                       .num_layers = 2,
                       .n_kv_heads = 2,
                       .head_dim = 64,
                       .cache_strategy = CacheStrategy::paged,
                       .page_size = 16};
  PagedKVCacheManager manager(params, /*total_num_pages=*/64, /*max_batch_size=*/8,
                              /*max_seq_len=*/512);

  std::vector<SeqId> seqs = manager.claim(2);        // two new sequences, length 0
  std::vector<std::uint32_t> prompt = {7, 20};       // prefill lengths
  std::vector<std::uint32_t> rows = {0, 7, 27};      // row_offsets of the ragged batch
  KVCacheBatch batch = manager.fetch(seqs, prompt);  // allocates pages, all or nothing
  auto cache = batch.paged<float>();                 // views for kernels

  const std::size_t kv = 27 * 2 * 64, qo = 27 * 4 * 64;  // 4 query heads (GQA)
  std::vector<float> k(kv, 0.5f), v(kv, 0.25f), q(qo, 1.0f), out(qo);
  for (std::uint32_t layer = 0; layer < cache.num_layers(); ++layer) {
    auto k_cache = cache.get_key_cache(layer), v_cache = cache.get_value_cache(layer);
    store_kv_reference(k_cache, v_cache, k, v, rows);  // write new K/V at cache_length + i
    attention_reference(k_cache, v_cache, q, /*n_q_heads=*/4, rows, out);
  }
  manager.step(seqs, prompt);  // commit: cache_length += 7, 20

  std::printf("cache lengths %u, %u; out[0] = %.3f; %u of %u pages free\n",
              manager.cache_length(seqs[0]), manager.cache_length(seqs[1]), out[0],
              manager.free_blocks(), manager.total_blocks());
  for (SeqId s : seqs) manager.release(s);  // pages go back to the pool
  return out[0] == 0.25f ? 0 : 1;
}
