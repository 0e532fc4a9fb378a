// tools/examples/consumer/engine_tokens.cpp — the engine from an installed
// kvcache (kvcache::engine): a seeded tiny model serves one prompt twice,
// greedily, on a paged cache with fast CPU kernels. Exits 0 when both runs
// give the same max_new_tokens tokens and release every page.
#include <cstdio>
#include <vector>

#include "kvcache/engine/model.h"
#include "kvcache/engine/scheduler.h"
#include "kvcache/paged_manager.h"

namespace {

std::vector<kvcache::engine::TokenId> generate(const kvcache::engine::Model& model,
                                               kvcache::PagedKVCacheManager& manager) {
  kvcache::engine::SchedulerConfig config;
  config.max_num_seqs = manager.max_batch_size();
  kvcache::engine::Scheduler scheduler(model, manager, config);
  kvcache::engine::Request request;
  request.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  request.max_new_tokens = 6;
  scheduler.add_request(std::move(request));
  scheduler.run_to_completion();
  return scheduler.take_finished().at(0).tokens;
}

}  // namespace

int main() {
  using namespace kvcache;
  const engine::Model model = engine::Model::from_seed(engine::model_preset("tiny"), 7);
  PagedKVCacheManager manager(model.config().cache_params(CacheStrategy::paged, 4),
                              /*total_num_pages=*/16, /*max_batch_size=*/2, /*max_seq_len=*/64);
  const auto first = generate(model, manager), second = generate(model, manager);
  for (auto t : first) std::printf("%d ", static_cast<int>(t));
  std::printf("\n%u of %u pages free\n", manager.free_blocks(), manager.total_blocks());
  const bool ok = first.size() == 6 && first == second && manager.free_blocks() == 16;
  return ok ? 0 : 1;
}
