// python/repr.cpp — repr() texts of the `kvcache` module's objects (repr.h).
#include "repr.h"

#include <cstdio>
#include <span>
#include <string>

namespace kvcache::python {

namespace {

// Lists longer than this are shortened to their first kHead and last kTail entries.
constexpr std::size_t kHead = 6, kTail = 2;

template <class T>
std::string list_text(std::span<const T> values) {
  const auto item = [&](std::size_t i) { return std::to_string(values[i]); };
  std::string s = "[";
  const bool shorten = values.size() > kHead + kTail + 1;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (shorten && i == kHead) {
      s += "..., ";
      i = values.size() - kTail;
    }
    s += item(i) + ", ";
  }
  if (!values.empty()) s.resize(s.size() - 2);
  s += "]";
  if (shorten) s += " (" + std::to_string(values.size()) + " entries)";
  return s;
}

std::string float_text(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", static_cast<double>(x));
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 10000 -> 10000.0
  return s;
}

}  // namespace

std::string params_repr(const KVCacheParams& p) {
  std::string s =
      "KVCacheParams(dtype='" + std::string(dtype_name(p.dtype)) +
      "', n_kv_heads=" + std::to_string(p.n_kv_heads) + ", head_dim=" + std::to_string(p.head_dim) +
      ", num_layers=" + (p.num_layers ? std::to_string(p.num_layers) : std::string("None")) +
      ", cache_strategy='" + std::string(strategy_name(p.cache_strategy)) + "'";
  if (p.cache_strategy == CacheStrategy::paged) s += ", page_size=" + std::to_string(p.page_size);
  if (p.enable_prefix_caching) s += ", enable_prefix_caching=True";
  if (p.n_devices != 1) s += ", n_devices=" + std::to_string(p.n_devices);
  if (p.page_layout == PageLayout::hnd) s += ", page_layout='hnd'";
  if (p.pool_arrangement == PoolArrangement::per_layer) s += ", pool_arrangement='per_layer'";
  return s + ")";
}

std::string manager_repr(const KVCacheManager& m) {
  const bool paged = m.paged() != nullptr;
  std::string s =
      std::string(paged ? "PagedKVCacheManager(" : "ContinuousBatchingKVCacheManager(") +
      params_repr(m.params()) + ", max_cache_batch_size=" + std::to_string(m.max_batch_size()) +
      ", max_seq_len=" + std::to_string(m.max_seq_len());
  if (paged) s += ", total_num_pages=" + std::to_string(m.total_blocks());
  return s + ")";
}

std::string batch_repr(const PyBatch& pb, const std::string& class_name) {
  const KVCacheBatch& b = pb.batch;
  const KVCacheParams& p = b.params();
  std::string s = class_name + "(" + std::string(strategy_name(b.strategy())) + " " +
                  std::string(dtype_name(p.dtype)) + ", seq_ids=" + list_text(b.seq_ids()) +
                  ", cache_lengths=" + list_text(b.cache_lengths()) +
                  ", reserved_lengths=" + list_text(b.reserved_lengths()) +
                  ", max_seq_length=" + std::to_string(b.max_seq_length()) +
                  ", max_cache_length=" + std::to_string(b.max_cache_length()) +
                  ", is_cache_empty=" + (pb.is_cache_empty ? "True" : "False");
  if (!b.block_copies().empty()) s += ", block_copies=" + std::to_string(b.block_copies().size());
  if (p.n_devices != 1) s += ", devices=" + std::to_string(p.n_devices);
  return s + ")";
}

std::string rope_table_repr(const RopeTable& t) {
  return "RopeTable(max_positions=" + std::to_string(t.max_positions()) +
         ", theta=" + float_text(t.theta()) + ", rotary_dim=" + std::to_string(t.rotary_dim()) +
         ")";
}

}  // namespace kvcache::python
