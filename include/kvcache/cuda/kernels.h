// kvcache/cuda/kernels.h — store_kv and attention on an NVIDIA GPU.
//
// Same semantics and argument conventions as the CPU kernels
// (kvcache/kernels/attention.h, oracle kvcache/kernels/reference.h): ragged
// batch given by row_offsets (batch_size + 1 entries), q / out
// [total_new_tokens][n_q_heads][head_dim] f32, k_new / v_new
// [total_new_tokens][n_kv_heads][head_dim] f32, new token i of entry b at
// position cache_lengths[b] + i, causal over history + new tokens, GQA
// (query head h reads KV head h / (n_q_heads / n_kv_heads)), fp32
// accumulation, f32 / f16 / bf16 and 8-bit (fp8_e4m3, fp8_e5m2, int8:
// quantized by store_kv exactly as the CPU kernels do, dequantized in
// attention; fp8 needs CacheDesc::head_scales in device memory, which
// DeviceCollection provides) cache elements, NHD and HND, paged and
// continuous descriptors; 8-bit caches take the generic attention kernel.
// The difference: EVERY pointer inside the CacheDesc and every span is
// DEVICE memory (see device_collection.h for making such descriptors from a
// host manager's batch).
//
// Validation on the host, before anything is launched (InvalidArgument naming
// the value and the limit; the call then changes nothing): K and V
// descriptors of the same shape; non-null blocks / cache_lengths /
// lookup_table that are device memory; 1 <= head_dim <= kMaxHeadDim;
// n_kv_heads, page_size, lookup_stride >= 1; K and V of one dtype; token
// and head strides those of the geometry; row_offsets.size() ==
// batch_size + 1; n_q_heads a positive multiple of n_kv_heads; span sizes a
// whole number of rows (q.size() == out.size(), k_new.size() ==
// v_new.size()), spans in device memory; AttentionOptions::precision fp32.
// NOT validated (device-resident, reading it would cost a synchronisation):
// the contents of cache_lengths, lookup_table and row_offsets. The caller
// guarantees what a host collection guarantees: row_offsets non-decreasing
// from 0 with row_offsets[batch_size] == total_new_tokens (q.size() /
// (n_q_heads * head_dim)), every entry's new tokens <= max_seq_length, and
// cache_lengths[b] + new tokens within the entry's page table. Violations
// are undefined behaviour (rows past max_seq_length are not computed; bad
// page ids read or write out of bounds).
//
// Asynchrony: both functions only enqueue work on `stream` (nullptr: the
// null stream) and return; the results are ready once the stream is
// synchronised. Launch failures throw DeviceError; faults inside a kernel
// surface at the next synchronisation.
// CUDA graphs: both functions may be captured on a stream
// (cudaStreamBeginCapture) and the graph replayed. What they read on the
// host at capture is fixed in the graph: the descriptors' pointers and shapes
// (batch_size, lookup_stride, max_seq_length, max_cache_length: the launch
// shape and the split plan come from them), the spans' pointers and sizes,
// the options. What the kernels read on the device is read at each replay:
// cache_lengths, lookup_table, row_offsets, q, k_new, v_new, the pool. So
// between replays change contents only, within the captured shape:
// DeviceCollection with DeviceCollectionBounds and update()
// (kvcache/cuda/device_collection.h) does that for the cache metadata. With a
// workspace, make one call of the captured shape before capturing, so that
// its split scratch is allocated outside the capture, and keep it alive and
// unused by other work while the graph may run; without one, a splitting
// call's cudaMallocAsync / cudaFreeAsync become nodes of the graph. Tested
// over decode steps with growing page tables (tests/cuda/graph_test.cpp);
// measured: docs/CUDA.md.
// Workspace: attention takes an optional AttentionWorkspace*
// (kvcache/cuda/workspace.h; its header states the contract). With one, the
// split-KV scratch, device limits and per-kernel occupancy are reused across
// calls. With nullptr (the default) each call queries the device and, when it
// splits the context, allocates and frees its scratch stream-ordered
// (cudaMallocAsync / cudaFreeAsync): ~50 us of host time per such call,
// measured. Results are bit-identical either way.
//
// Results: store_kv writes exactly what store_kv_reference writes (the same
// round-to-nearest-even f16 / bf16 conversion, bit for bit); with
// StoreOptions::rope_k, V bit for bit and K what apply_rope_reference then
// store_kv_reference write up to cos / sin: the device computes them as
// rope_cos_sin does (angle pos * inv_freq in double, cos / sin in double,
// rounded to float) but with CUDA's double sincos (<= 2 ulp of double)
// instead of the host's libm, so a float cos / sin can differ by 1 float ulp
// in rare near-tie cases (tests/cuda/store_test.cpp states the bound). attention
// matches attention_reference within fp32 rounding (different summation
// order, split-KV log-sum-exp merge) on the decode and generic kernels; the
// prefill kernel (f16 / bf16 caches, > 4 new rows) rounds q and the softmax
// weights to the cache's 16-bit type for the tensor cores (as FlashAttention
// does): docs/CUDA.md and tests/cuda/prefill_test.cpp state that bound. That
// path does so although AttentionOptions::precision is fp32 (the only value
// the CUDA kernels accept, which on the CPU means q and the weights stay
// f32): a known difference from the CPU contract, listed in docs/CUDA.md.
// Not supported yet: AttentionPrecision::bf16 (InvalidArgument);
// AttentionOptions::prefetch and StoreOptions::prefetch are ignored.
// Thread-safety: concurrent calls on disjoint outputs are safe.
#pragma once

#include <cstdint>
#include <span>

#include "kvcache/cuda/device.h"
#include "kvcache/cuda/workspace.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kv_cache.h"

namespace kvcache::cuda {

inline constexpr std::uint32_t kMaxHeadDim = 256;

namespace detail {
// The implementations (src/kernels/cuda/); dtype is k.dtype.
void attention_cuda(DType dtype, const CacheDesc& k, const CacheDesc& v, std::span<const float> q,
                    std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                    std::span<float> out, const AttentionOptions& options, CUstream_st* stream,
                    AttentionWorkspace* workspace);
void store_kv_cuda(DType dtype, const CacheDesc& k, const CacheDesc& v,
                   std::span<const float> k_new, std::span<const float> v_new,
                   std::span<const std::uint32_t> row_offsets, const StoreOptions& options,
                   CUstream_st* stream);
const char* attention_kernel_name_cuda(DType dtype, const CacheDesc& k, const CacheDesc& v);
}  // namespace detail

// Which attention kernel a call with these per-layer descriptors runs:
// "decode" (at most 4 new tokens per entry, i.e. the view's max_seq_length
// <= 4, head_dim a multiple of 16 bytes, 16-byte aligned pools), "prefill"
// (f16 / bf16 caches, max_seq_length > 4, head_dim 64, 80, 96 or 128,
// 16-byte aligned pools: tensor cores, q and the softmax weights rounded to
// the cache's 16-bit type, see docs/CUDA.md) or "generic" (everything else).
// Host-only: reads no device memory, launches nothing.
inline const char* attention_kernel_name(const CacheDesc& k_cache, const CacheDesc& v_cache) {
  return detail::attention_kernel_name_cuda(k_cache.dtype, k_cache, v_cache);
}

// Attention on per-layer descriptors of device memory (DeviceCollection's
// key(layer) / value(layer)).
inline void attention(const CacheDesc& k_cache, const CacheDesc& v_cache, std::span<const float> q,
                      std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                      std::span<float> out, const AttentionOptions& options = {},
                      CUstream_st* stream = nullptr, AttentionWorkspace* workspace = nullptr) {
  detail::attention_cuda(k_cache.dtype, k_cache, v_cache, q, n_q_heads, row_offsets, out, options,
                         stream, workspace);
}

template <KVCacheT Cache>
void attention(const Cache& k_cache, const Cache& v_cache, std::span<const float> q,
               std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
               std::span<float> out, const AttentionOptions& options = {},
               CUstream_st* stream = nullptr, AttentionWorkspace* workspace = nullptr) {
  attention(k_cache.desc(), v_cache.desc(), q, n_q_heads, row_offsets, out, options, stream,
            workspace);
}

// store_kv options: the CPU's kvcache::StoreOptions (kernels/options.h).
// rope_k rotates K (not V) in fp32 before the conversion, as the CPU store
// does (NeoX pairs (i, i + rotary_dim / 2), position cache_lengths[b] + i,
// kernels/rope.h), validated like the CPU's (rotary_dim even and <= head_dim,
// theta > 0: InvalidArgument). rope_table must be nullptr (a RopeTable is host
// memory; the device computes cos / sin per token): InvalidArgument
// otherwise. prefetch is a CPU strategy: ignored (a value outside the enum
// is rejected, as on the CPU).
inline void store_kv(const CacheDesc& k_cache, const CacheDesc& v_cache,
                     std::span<const float> k_new, std::span<const float> v_new,
                     std::span<const std::uint32_t> row_offsets, const StoreOptions& options = {},
                     CUstream_st* stream = nullptr) {
  detail::store_kv_cuda(k_cache.dtype, k_cache, v_cache, k_new, v_new, row_offsets, options,
                        stream);
}

// The same with default StoreOptions (no RoPE), on `stream`.
inline void store_kv(const CacheDesc& k_cache, const CacheDesc& v_cache,
                     std::span<const float> k_new, std::span<const float> v_new,
                     std::span<const std::uint32_t> row_offsets, CUstream_st* stream) {
  store_kv(k_cache, v_cache, k_new, v_new, row_offsets, StoreOptions{}, stream);
}

template <KVCacheT Cache>
void store_kv(const Cache& k_cache, const Cache& v_cache, std::span<const float> k_new,
              std::span<const float> v_new, std::span<const std::uint32_t> row_offsets,
              const StoreOptions& options = {}, CUstream_st* stream = nullptr) {
  store_kv(k_cache.desc(), v_cache.desc(), k_new, v_new, row_offsets, options, stream);
}

template <KVCacheT Cache>
void store_kv(const Cache& k_cache, const Cache& v_cache, std::span<const float> k_new,
              std::span<const float> v_new, std::span<const std::uint32_t> row_offsets,
              CUstream_st* stream) {
  store_kv(k_cache.desc(), v_cache.desc(), k_new, v_new, row_offsets, StoreOptions{}, stream);
}

}  // namespace kvcache::cuda
