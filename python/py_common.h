// python/py_common.h — shared pieces of the `kvcache` Python binding.
//
// The binding is a thin layer: every check that matters lives in the C++
// library and surfaces as a kvcache.* Python exception carrying the C++
// message (see bind_errors). This layer only converts Python values to the
// C++ types (ints, int sequences / arrays, dtype names) and builds NumPy
// arrays that VIEW C++ memory (no copies): the cache blocks, and the batch's
// cache_lengths / lookup_table / is_cache_empty.
//
// Thread-safety: functions here run with the GIL held.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "kvcache/kvcache.h"

namespace kvcache::python {

namespace py = pybind11;

// The Python object `fetch` returns: the C++ batch plus the byte the
// is_cache_empty array views. NumPy views of its vectors use the PyBatch's
// Python object as their base, so they keep it (and, through keep_alive, the
// manager owning the blocks) alive.
struct PyBatch {
  KVCacheBatch batch;
  bool is_cache_empty = true;  // mirrors batch.is_cache_empty(); viewed by NumPy

  void sync() { is_cache_empty = batch.is_cache_empty(); }
};

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

void bind_managers(py::module_& m);
void bind_kernels(py::module_& m);

}  // namespace kvcache::python
