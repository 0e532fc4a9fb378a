// python/repr.h — the repr() texts of the `kvcache` module's objects.
//
// Readable, one line, no locks taken: a manager's repr shows its constructor
// arguments only (all immutable), so it is safe anywhere, in an on_event
// callback (which runs under the manager's lock) included. Long lists are
// shortened ("[0, 1, 2, ..., 99] (100 entries)").
//
// Thread-safety: called with the GIL held.
#pragma once

#include <string>

#include "kvcache/kernels/rope_table.h"
#include "py_common.h"

namespace kvcache::python {

// KVCacheParams(dtype='float32', n_kv_heads=2, head_dim=16, num_layers=2, ...):
// the constructor call that makes equal params (defaults left out).
std::string params_repr(const KVCacheParams& p);

// PagedKVCacheManager(KVCacheParams(...), max_cache_batch_size=8, max_seq_len=512,
// total_num_pages=64) or ContinuousBatchingKVCacheManager(...).
std::string manager_repr(const KVCacheManager& m);

// KVCacheBatch(paged float32, seq_ids=[0, 1], cache_lengths=[5, 3], ...).
// class_name replaces "KVCacheBatch" (KVCacheInputs uses it).
std::string batch_repr(const PyBatch& b, const std::string& class_name = "KVCacheBatch");

// RopeTable(max_positions=4096, theta=10000.0, rotary_dim=128).
std::string rope_table_repr(const RopeTable& t);

}  // namespace kvcache::python
