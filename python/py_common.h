// python/py_common.h — shared pieces of the `kvcache` Python binding.
//
// The binding is a thin layer: every check that matters lives in the C++
// library and surfaces as a kvcache.* Python exception carrying the C++
// message (see bind_errors). This layer only converts Python values to the
// C++ types (ints, int sequences / arrays, dtype names) and builds NumPy
// arrays that VIEW C++ memory (no copies): the cache blocks, and the batch's
// cache_lengths / lookup_table / is_cache_empty.
//
// Thread-safety: functions here run with the GIL held (except what
// `unlocked` runs).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvcache/kvcache.h"

namespace kvcache::python {

namespace py = pybind11;

// kvcache.KVCacheBatch: the C++ batch of one fetch, the byte the
// is_cache_empty arrays view, and a strong reference to the manager that owns
// the blocks. NumPy views of its memory use the KVCacheBatch's Python object
// as their base, so a view keeps the batch, and the batch the manager, alive:
// no view can dangle. (`fetch` returns a kvcache.KVCacheInputs, a list
// holding the views, whose `batch` attribute is this object; see inputs.cpp.)
struct PyBatch {
  KVCacheBatch batch;
  bool is_cache_empty = true;  // mirrors batch.is_cache_empty(); viewed by NumPy
  py::object manager;          // owner of the blocks the views point into

  void sync() { is_cache_empty = batch.is_cache_empty(); }
};

// The kvcache.KVCacheInputs for a filled batch (one tuple per device).
py::object make_inputs(std::unique_ptr<PyBatch> batch);

// MAX's increment_cache_lengths for `manager`: a new KVCacheInputs whose
// cache lengths are those of kv_cache_inputs advanced by the row offsets in
// prev_model_inputs (see inputs.cpp's row_offsets_of); kv_cache_inputs and
// the manager are left as they were. Throws InvalidArgument, CapacityExceeded.
py::object incremented_inputs(const py::handle& manager, const py::handle& kv_cache_inputs,
                              const py::handle& prev_model_inputs);

// MAX's input_symbols: per device, a tuple of four kvcache.TensorType.
py::list input_symbols(const KVCacheManager& m);

// The batch behind what a caller passes as `kv_cache_inputs`: a
// KVCacheInputs, a KVCacheBatch, one of the per-device tuples (then `device`
// is that tuple's device) or a list / tuple of them. Throws InvalidArgument
// naming `what` for anything else.
struct BatchRef {
  PyBatch& batch;
  std::optional<std::uint32_t> device;
};
BatchRef batch_of(const py::handle& inputs, const char* what);

// ---- calls into the library, safe at interpreter exit (shutdown.cpp) -------------

// Counts a stretch of a binding call (nestable), so that interpreter exit can
// wait until no thread is inside one. Constructed with the GIL held. Once exit
// has begun, a scope opened by the exiting thread is not counted (counted()
// false: keep the GIL), one nested in a counted scope is, and one opened by
// any other thread never returns: that thread is parked forever with the GIL
// released, as CPython 3.14 parks daemon threads at finalization.
class CallScope {
 public:
  CallScope();
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  bool counted() const { return counted_; }

 private:
  bool counted_ = false;
};

// Releases the GIL for its lifetime. Takes it back on destruction unless the
// interpreter is finalizing, in which case the thread is parked forever
// rather than unwound through a dying interpreter.
class ReleasedGil {
 public:
  ReleasedGil();
  ~ReleasedGil();
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;

 private:
  PyThreadState* state_;
};

// Runs f() in a CallScope with the GIL released (held if the scope is not
// counted). f must not touch Python objects.
template <class F>
decltype(auto) unlocked(F&& f) {
  CallScope scope;
  std::optional<ReleasedGil> released;
  if (scope.counted()) released.emplace();
  return std::forward<F>(f)();
}

namespace counted_detail {
template <class F>
struct Signature : Signature<decltype(&F::operator())> {};
template <class C, class R, class... A>
struct Signature<R (C::*)(A...) const> {
  using type = R(A...);
};
template <class R, class... A>
struct Signature<R (*)(A...)> {
  using type = R(A...);
};
template <class Sig>
struct Wrap;
template <class R, class... A>
struct Wrap<R(A...)> {
  template <class F>
  static auto make(F f) {
    return [f = std::move(f)](A... args) -> py::object {
      CallScope scope;
      if constexpr (std::is_void_v<R>) {
        f(std::forward<A>(args)...);
        return py::none();
      } else if constexpr (std::is_base_of_v<py::handle, std::decay_t<R>>) {
        return f(std::forward<A>(args)...);  // already a Python object
      } else {
        return py::cast(f(std::forward<A>(args)...));
      }
    };
  }
};
}  // namespace counted_detail

// A callable for pybind11 with f's parameters whose whole body, and the
// conversion of its result to Python, run in a CallScope: for the calls that
// build many Python objects (a collection run while building them could run
// Python code, and let exit begin, with the thread inside our frames).
template <class F>
auto counted(F f) {
  return counted_detail::Wrap<typename counted_detail::Signature<F>::type>::make(std::move(f));
}

// Registers the atexit handler behind CallScope (once, at import).
void register_shutdown_handler();

// NumPy storage type of a cache dtype: float32, float16, and uint16 for bf16
// (NumPy has no bfloat16; see kvcache.bf16_to_float32).
py::dtype numpy_dtype(DType t);

// A non-negative Python int below 2^32; InvalidArgument naming `what` otherwise.
std::uint32_t to_u32(py::handle obj, const char* what);

// Converts an int, a sequence of ints or an integer array into n uint32
// values; an int is repeated n times, None gives `fallback` n times. Throws
// InvalidArgument naming `what` for non-integers, negatives or values past
// 2^32 - 1, and for a length other than n (n == npos: any length).
inline constexpr std::size_t any_length = static_cast<std::size_t>(-1);
std::vector<std::uint32_t> to_u32_vector(py::handle obj, const char* what,
                                         std::size_t n = any_length, std::uint32_t fallback = 0);

// A non-negative Python int below 2^64; InvalidArgument naming `what` otherwise.
std::uint64_t to_u64(py::handle obj, const char* what);

// A sequence / array of non-negative integer sequence ids.
std::vector<SeqId> to_seq_ids(py::handle obj);

// prefix.cpp: the PagedKVCacheManager constructor's prefix-cache keywords
// (any of them without params.enable_prefix_caching is an InvalidArgument),
// PageEvent / PrefixCacheMetrics, and the prefix-caching methods.
PrefixCacheConfig prefix_config(const KVCacheParams& p, const py::object& policy,
                                const py::object& on_event, const py::object& small_fraction,
                                const py::object& ghost_factor);
void bind_prefix_types(py::module_& m);
void bind_prefix_methods(py::class_<PagedKVCacheManager>& cls);

// tiers.cpp: kvcache.Tier / HostTier / DiskTier; the PagedKVCacheManager
// keywords tiers, model_id, cache_salt, admission, staging_pages, pool_apart
// (any of them without params.enable_prefix_caching is an InvalidArgument;
// model_id and cache_salt default to the first tier's); has_pending_loads,
// poll_loads, wait_loads, wait_tiers, complete_offloads; a manager's stats()
// as a dict.
TierConfig tier_config(const KVCacheParams& p, const py::object& tiers, const py::object& model_id,
                       const py::object& cache_salt, const py::object& admission,
                       const py::object& staging_pages, const py::object& pool_apart);
// The keywords offload_batch and offload_delay_us into c (None: unchanged;
// either without params.enable_prefix_caching is an InvalidArgument, one out
// of range is refused by the manager's constructor, naming it).
void offload_batching(const KVCacheParams& p, TierConfig& c, const py::object& batch,
                      const py::object& delay_us);
// The tiers part estimated_bookkeeping_size sizes: tiers a list of tiers or
// their number (at most 8), staging_pages, pool_apart (None: the defaults).
TierConfig sized_tier_config(const KVCacheParams& p, const py::object& tiers,
                             const py::object& staging_pages, const py::object& pool_apart);
void bind_tier_types(py::module_& m);
void bind_tier_methods(py::class_<PagedKVCacheManager>& cls);
py::dict stats_dict(const ManagerStats& s);

void bind_inputs(py::module_& m);
void bind_managers(py::module_& m);
void bind_kernels(py::module_& m);
// metrics.cpp: metrics_text on the managers (after bind_managers), the log level and handler.
void bind_metrics_and_logging(py::module_& m);

}  // namespace kvcache::python
