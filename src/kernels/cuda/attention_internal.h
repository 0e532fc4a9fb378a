// Internal: what the generic attention kernel (attention.cu), the decode
// kernel (decode_attention.cu) and the prefill kernel (prefill_attention.cu)
// share: the launch parameters, the split-KV
// scratch and merge, device limits, the workspace's state.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "decode_tuning.h"
#include "kvcache/cuda/workspace.h"
#include "kvcache/dtype.h"
#include "kvcache/kv_cache.h"

namespace kvcache::cuda::detail {

// The merge kernel's shared weight array bounds the splits of either kernel.
inline constexpr std::uint32_t kMaxSplits = 128;
// Rows per entry (new tokens) up to which the decode kernel serves a call.
inline constexpr std::uint32_t kDecodeMaxRows = 4;

struct AttnParams {
  const void* k_blocks;
  const void* v_blocks;
  const std::uint32_t* cache_lengths;
  const std::uint32_t* lookup;
  const std::uint32_t* row_offsets;
  const float* q;
  float* out;
  float* part_o;    // [n_splits][total_rows][n_q][dim], when n_splits > 1
  float* part_lse;  // [n_splits][total_rows][n_q], natural log
  std::size_t block_stride;
  std::size_t token_stride;
  std::size_t head_stride;
  std::uint32_t lookup_stride;
  std::uint32_t page_size;
  std::uint32_t page_shift;  // log2(page_size) when page_pow2
  bool page_pow2;
  std::uint32_t n_kv;
  std::uint32_t n_q;
  std::uint32_t group;
  std::uint32_t dim;
  std::uint32_t heads_per_block;
  std::uint32_t head_tiles;
  std::uint32_t rows_per_block;
  std::uint32_t row_tiles;
  std::uint32_t n_splits;
  std::uint32_t split_tokens;
  std::uint32_t total_rows;
  float scale;
  bool vec;  // 16-byte loads of K/V rows
  // 8-bit caches (generic kernel only): fp8's static scales of the layer's K
  // and V heads (device memory), int8's byte offset from a block's start to
  // its (row, head) scales.
  const float* k_head_scales;
  const float* v_head_scales;
  std::size_t scales_offset;
  std::size_t scale_token_stride;  // int8: token_stride / dim (scale index units)
  std::size_t scale_head_stride;   // int8: head_stride / dim
};

// Element offset of token tok's row (KV head kvh, dim 0) of entry b, through
// the page table (shared by the decode and prefill kernels).
// Where token tok of entry b lies: its page (block id) and row in the page.
struct TokenPlace {
  std::uint32_t page, in_page;
};
__device__ __forceinline__ TokenPlace token_place(const AttnParams& a, std::uint32_t b,
                                                  std::uint32_t tok) {
  const std::uint32_t j = a.page_pow2 ? tok >> a.page_shift : tok / a.page_size;
  return {__ldg(a.lookup + std::size_t{b} * a.lookup_stride + j), tok - j * a.page_size};
}
__device__ __forceinline__ std::size_t row_offset(const AttnParams& a, const TokenPlace& t,
                                                  std::uint32_t kvh) {
  return std::size_t{t.page} * a.block_stride + std::size_t{t.in_page} * a.token_stride +
         std::size_t{kvh} * a.head_stride;
}
__device__ __forceinline__ std::size_t row_offset(const AttnParams& a, std::uint32_t b,
                                                  std::uint32_t kvh, std::uint32_t tok) {
  return row_offset(a, token_place(a, b, tok), kvh);
}
// int8: byte offset of the (row, head) scale of a token (CacheDesc::scale_index).
__device__ __forceinline__ std::size_t scale_offset(const AttnParams& a, const TokenPlace& t,
                                                    std::uint32_t kvh) {
  const std::size_t index =
      std::size_t{t.in_page} * a.scale_token_stride + std::size_t{kvh} * a.scale_head_stride;
  return std::size_t{t.page} * a.block_stride + a.scales_offset + index * sizeof(float);
}

struct DeviceLimits {
  int sms = 0;
  int smem_optin = 0;
};

DeviceLimits device_limits();

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint32_t>((a + b - 1) / b);
}

// What an AttentionWorkspace (kvcache/cuda/workspace.h) holds.
struct WorkspaceState {
  struct Occupancy {
    const void* kernel;
    std::size_t smem;
    int blocks_per_sm;
  };
  int device = 0;
  DeviceLimits lim;
  void* scratch = nullptr;  // cudaMalloc, capacity bytes
  std::size_t capacity = 0;
  std::vector<const void*> attributes_set;  // kernels whose smem attribute is set
  std::vector<Occupancy> occupancy;
  WorkspaceState() = default;
  WorkspaceState(const WorkspaceState&) = delete;
  WorkspaceState& operator=(const WorkspaceState&) = delete;
  ~WorkspaceState() {
    if (scratch != nullptr) (void)cudaFree(scratch);
  }
};

// One attention call's device facts: from the workspace, or read now.
struct CallContext {
  DeviceLimits lim;
  WorkspaceState* ws = nullptr;  // nullptr: per-call queries and scratch
  cudaStream_t stream = nullptr;
};

// The context of a call with workspace ws (nullptr: none). Throws
// InvalidArgument for a moved-from workspace or one of another device.
CallContext make_context(AttentionWorkspace* ws, cudaStream_t stream);

// Blocks of `kernel` per SM with `threads` threads and `smem` dynamic shared
// bytes. First sets the kernel's MaxDynamicSharedMemorySize attribute to
// attr_smem (>= smem; always the same value per kernel, so calls with and
// without workspaces never lower it under each other): once per workspace
// and kernel, or every call without a workspace. Throws DeviceError.
int blocks_per_sm(CallContext& c, const void* kernel, int threads, std::size_t smem,
                  std::size_t attr_smem);

// Stream-ordered scratch memory (cudaMallocAsync / cudaFreeAsync).
class StreamScratch {
 public:
  StreamScratch() = default;
  StreamScratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes != 0) check_cuda(cudaMallocAsync(&p_, bytes, stream), "cudaMallocAsync", bytes);
  }
  StreamScratch(StreamScratch&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), stream_(o.stream_) {}
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  StreamScratch& operator=(StreamScratch&&) = delete;
  ~StreamScratch() {
    if (p_ != nullptr) (void)cudaFreeAsync(p_, stream_);
  }
  float* floats() const { return static_cast<float*>(p_); }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// The split partials when p.n_splits > 1 (else nothing), p pointed at them:
// the workspace's scratch (grown if needed; the returned scratch is then
// empty), else stream-ordered memory; the scratch must outlive the launches
// that use it (stream order does).
StreamScratch make_partials(AttnParams& p, CallContext& c);
// Combines p.n_splits partials (part_o, part_lse) into p.out.
void launch_merge(const AttnParams& p, cudaStream_t stream);

// Whether the decode kernel serves this call: at most kDecodeMaxRows new
// tokens per entry, head_dim a multiple of the 16-byte vector, 16-byte
// aligned K and V pools and pages. Reads no device memory.
bool decode_eligible(DType dtype, const CacheDesc& k, const CacheDesc& v);
// Launches the decode kernel (and the merge when it splits) for a call
// decode_eligible accepts; p as filled by attention_cuda (tiles and splits
// are planned here from k's batch_size, max_seq_length, max_cache_length).
void launch_decode(DType dtype, AttnParams p, const CacheDesc& k, CallContext& c,
                   const DecodeTuning& t);

// Whether the tensor-core prefill kernel (prefill_attention.cu) serves a call
// the decode kernel does not: f16 / bf16 cache, head_dim in {64, 80, 96,
// 128}, max_seq_length > kDecodeMaxRows, 16-byte aligned K and V pools and
// pages. Reads no device memory.
bool prefill_eligible(DType dtype, const CacheDesc& k, const CacheDesc& v);
// Launches the prefill kernel for a call prefill_eligible accepts (no
// split-KV: one block covers its query vectors' whole context).
void launch_prefill(DType dtype, const AttnParams& a, const CacheDesc& k, CallContext& c);

}  // namespace kvcache::cuda::detail
