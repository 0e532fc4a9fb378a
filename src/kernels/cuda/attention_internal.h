// Internal: what the generic attention kernel (attention.cu) and the decode
// kernel (decode_attention.cu) share: the launch parameters, the split-KV
// workspace and merge, device limits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda_check.h"
#include "decode_tuning.h"
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
  std::uint32_t block_tokens;
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
};

struct DeviceLimits {
  int sms = 0;
  int smem_optin = 0;
};

DeviceLimits device_limits();

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint32_t>((a + b - 1) / b);
}

// Stream-ordered scratch memory (cudaMallocAsync / cudaFreeAsync).
class StreamScratch {
 public:
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
  cudaStream_t stream_;
};

// The split partials when p.n_splits > 1 (else nothing), p pointed at them:
// t.workspace when given and large enough (the scratch is then empty), else
// stream-ordered memory; the scratch must outlive the launches that use it
// (stream order does).
StreamScratch make_partials(AttnParams& p, cudaStream_t stream, const DecodeTuning& t);
// Combines p.n_splits partials (part_o, part_lse) into p.out.
void launch_merge(const AttnParams& p, cudaStream_t stream);

// Whether the decode kernel serves this call: at most kDecodeMaxRows new
// tokens per entry, head_dim a multiple of the 16-byte vector, 16-byte
// aligned K and V pools and pages. Reads no device memory.
bool decode_eligible(DType dtype, const LayerCacheDesc<float>& k, const LayerCacheDesc<float>& v);
// Launches the decode kernel (and the merge when it splits) for a call
// decode_eligible accepts; p as filled by attention_cuda (tiles and splits
// are planned here from k's batch_size, max_seq_length, max_cache_length).
void launch_decode(DType dtype, AttnParams p, const LayerCacheDesc<float>& k,
                   const DeviceLimits& lim, cudaStream_t stream, const DecodeTuning& t);

}  // namespace kvcache::cuda::detail
