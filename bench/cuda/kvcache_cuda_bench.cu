// kvcache_cuda_bench: decode / prefill attention and store_kv on the GPU.
//
//   kvcache_cuda_bench [--json FILE] [--repeats N] [--quick]
//   kvcache_cuda_bench --sweep          decode-kernel variants (detail::DecodeTuning)
//   kvcache_cuda_bench --once N_Q BATCH CONTEXT NEW   one bf16 decode shape, 3 calls
//                                       (for ncu: tools/cuda/profile_decode.sh)
//   kvcache_cuda_bench --host           per-call costs of one decode step's
//                                       store_kv and attention: event-timed
//                                       single calls, host time per call and
//                                       device time per call back to back, the
//                                       runtime queries the host checks make,
//                                       and the pair captured in a CUDA graph
//                                       and replayed (checked against direct
//                                       calls)
//
// Decode: head dim 128, 8 KV heads, 8 and 32 query heads, page 16 with a
// shuffled page table, bf16 and f16, several batch x context shapes, one new
// token per entry (and one speculative shape with 4); `kernel` says which
// attention kernel ran (kvcache::cuda::attention_kernel_name). Every decode
// shape is timed twice on the same data: with an AttentionWorkspace (ws yes,
// as an engine calls it) and without one (ws no: per-call device queries and
// stream-ordered scratch allocation when the call splits). Each
// timed call reads a different copy of the cache (the copies are the pool's
// "layers"), with enough copies that the working set is >= 4x the L2, so the
// figures are DRAM-resident. Timed with CUDA events around each call, after
// warm-up; the median of the repeats is reported. bytes_kv = unique K+V bytes
// read; gbps = bytes_kv / median_s; copy_gbps = device-to-device cudaMemcpy
// (read + write bytes / time) measured in the same run; fraction_of_copy =
// gbps / copy_gbps (copy_read_gbps = read bytes only / time is printed too).
// Prefill: 1 (bf16, f16) and 8 (bf16) entries of 2048 new tokens, no history,
// GQA 4 (32 query heads, 8 KV heads), head dim 128, with a workspace; the
// prefill (tensor-core) kernel, plus the same bf16 batch-1 shape forced
// through the generic kernel for comparison: GFLOP/s of the causal attention
// (4 * head_dim flops per (query head, visible key)). Working set (8 MB of
// K/V at batch 1) is L2-resident: prefill is compute-bound.
// store_kv: GB/s of (f32 input read + cache write) bytes, 8 x 2,048 new
// tokens (8 KV heads, head dim 128, bf16 / f16 / f32) without and with RoPE on
// K (kernel "rope_k": theta 10000, rotary_dim 128), and a 32-entry decode step.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/decode_tuning.h"
#include "kvcache/collection.h"
#include "kvcache/cuda/device.h"
#include "kvcache/cuda/device_buffer.h"
#include "kvcache/cuda/device_collection.h"
#include "kvcache/cuda/kernels.h"
#include "kvcache/cuda/workspace.h"

namespace {

using kvcache::BFloat16;
using kvcache::CacheElement;
using kvcache::DType;
using kvcache::Half;
namespace kc = kvcache::cuda;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw kc::DeviceError(std::string(what) + ": " + cudaGetErrorString(e));
}

// Non-zero pseudo-random values in +-[1/64, 1] (hash of the index).
template <class T>
__global__ void fill_kernel(T* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed ^
                      static_cast<std::uint32_t>(i >> 32) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float mag = float((h & 63u) + 1u) / 64.0f;
    const float x = (h >> 31) ? -mag : mag;
    if constexpr (std::is_same_v<T, float>) {
      p[i] = x;
    } else if constexpr (sizeof(T) == 1) {
      // 8-bit: finite fp8 codes (exponent field never all ones); for int8
      // pools every 4 bytes that hold a page scale read as a float in (0, 2).
      const auto byte = static_cast<std::uint8_t>(h & 0x37u);
      memcpy(p + i, &byte, 1);
    } else if constexpr (std::is_same_v<T, Half>) {
      p[i] = Half{__half_as_ushort(__float2half_rn(x))};
    } else {
      p[i] = BFloat16{static_cast<std::uint16_t>(__float_as_uint(x) >> 16)};  // exact: 7 bits
    }
  }
}

template <class T>
void fill(T* p, std::size_t n, std::uint32_t seed) {
  fill_kernel<T><<<1024, 256>>>(p, n, seed);
  check(cudaGetLastError(), "fill kernel");
}

class Events {
 public:
  Events() {
    check(cudaEventCreate(&a_), "cudaEventCreate");
    check(cudaEventCreate(&b_), "cudaEventCreate");
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  ~Events() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  template <class F>
  double time_s(F&& f) {
    check(cudaEventRecord(a_), "cudaEventRecord");
    f();
    check(cudaEventRecord(b_), "cudaEventRecord");
    check(cudaEventSynchronize(b_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a_, b_), "cudaEventElapsedTime");
    return ms * 1e-3;
  }

 private:
  cudaEvent_t a_{}, b_{};
};

template <class F>
double median_time(int warmup, int repeats, F&& f) {
  Events ev;
  for (int i = 0; i < warmup; ++i) ev.time_s([&] { f(i); });
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(ev.time_s([&] { f(warmup + i); }));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Record {
  std::string kind, dtype, kernel;
  std::uint32_t n_q = 0, n_kv = 0, dim = 0, page = 0, batch = 0, context = 0, new_tokens = 0,
                copies = 0;
  double median_s = 0, bytes = 0, gbps = 0, gflops = 0;
  bool skipped = false;
  bool workspace = false;  // attention called with an AttentionWorkspace
};

struct Env {
  std::size_t l2 = 0;
  int repeats = 20;
  double copy_gbps = 0, copy_read_gbps = 0;
};

double measure_copy(const Env& env, std::size_t bytes) {
  kc::DeviceBuffer<char> src(bytes), dst(bytes);
  fill(reinterpret_cast<float*>(src.data()), bytes / sizeof(float), 1);
  return median_time(2, env.repeats, [&](int) {
    check(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice), "memcpy");
  });
}

// A paged pool of `copies` layers for `batch` entries of `tokens` positions
// each, page table shuffled, and the device collection for cache lengths
// `lengths` (new tokens `new_tokens` per entry).
// Bytes of one (token, KV head) row of K (or V): values, and int8's scale.
template <CacheElement T>
constexpr std::size_t row_bytes(std::uint32_t dim) {
  return std::size_t{dim} * sizeof(T) + (kvcache::has_page_scales(kvcache::dtype_of_v<T>) ? 4 : 0);
}

template <CacheElement T>
struct Setup {
  kc::DeviceBuffer<T> pool;
  std::vector<std::uint32_t> lengths, lookup, offsets;
  std::vector<float> head_scales;  // fp8: all 1
  kvcache::CacheDesc desc;
  Setup(std::uint32_t batch, std::uint32_t history, std::uint32_t new_tokens, std::uint32_t page,
        std::uint32_t n_kv, std::uint32_t dim, std::uint32_t copies) {
    const std::uint32_t tokens = history + new_tokens;
    const std::uint32_t per_seq = (tokens + page - 1) / page;
    const std::uint32_t blocks = batch * per_seq;
    desc.num_blocks = blocks;
    desc.num_layers = copies;
    desc.page_size = page;
    desc.n_kv_heads = n_kv;
    desc.head_dim = dim;
    desc.batch_size = batch;
    desc.lookup_stride = per_seq;
    desc.max_seq_length = new_tokens;
    desc.max_cache_length = tokens;
    desc.max_full_context_length = tokens;
    desc.dtype = kvcache::dtype_of_v<T>;
    desc = desc.with_strides();
    pool = kc::DeviceBuffer<T>(desc.pool_elements());
    fill(pool.data(), pool.size(), 7);
    lookup.resize(blocks);
    std::iota(lookup.begin(), lookup.end(), 0u);
    std::mt19937 rng(3);
    std::shuffle(lookup.begin(), lookup.end(), rng);
    lengths.assign(batch, history);
    for (std::uint32_t b = 0; b <= batch; ++b) offsets.push_back(b * new_tokens);
    desc.blocks = pool.data();
    desc.cache_lengths = lengths.data();
    desc.lookup_table = lookup.data();
    if (kvcache::is_fp8(desc.dtype)) {
      head_scales.assign(std::size_t{copies} * 2 * n_kv, 1.0f);
      desc.head_scales = head_scales.data();
    }
  }
};

std::size_t free_bytes() {
  std::size_t f = 0, t = 0;
  check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  return f;
}

// Two records: with a workspace, then without.
template <CacheElement T>
std::vector<Record> bench_decode(const Env& env, std::uint32_t n_q, std::uint32_t batch,
                                 std::uint32_t ctx, std::uint32_t new_tokens) {
  const std::uint32_t n_kv = 8, dim = 128, page = 16;
  Record r{"decode", std::string(kvcache::dtype_name(kvcache::dtype_of_v<T>)),
           "",       n_q,
           n_kv,     dim,
           page,     batch,
           ctx,      new_tokens};
  const std::size_t one =
      std::size_t{batch} * ((ctx + page - 1) / page) * page * n_kv * row_bytes<T>(dim) * 2;
  r.copies = static_cast<std::uint32_t>(std::max<std::size_t>(1, (4 * env.l2 + one - 1) / one));
  if (one * r.copies > free_bytes() * 8 / 10) {
    r.skipped = true;
    return {r};
  }
  Setup<T> s(batch, ctx - new_tokens, new_tokens, page, n_kv, dim, r.copies);
  kc::DeviceCollection<T> dev(s.desc, s.pool.data());
  r.kernel = kc::attention_kernel_name(dev.key(0), dev.value(0));
  kc::DeviceBuffer<float> q(std::size_t{batch} * new_tokens * n_q * dim), out(q.size());
  fill(q.data(), q.size(), 11);
  auto offsets = kc::DeviceBuffer<std::uint32_t>::from_host(s.offsets);
  r.bytes = double(batch) * ctx * n_kv * row_bytes<T>(dim) * 2;
  kc::AttentionWorkspace ws;
  std::vector<Record> rs;
  for (kc::AttentionWorkspace* w : {&ws, static_cast<kc::AttentionWorkspace*>(nullptr)}) {
    Record x = r;
    x.workspace = w != nullptr;
    x.median_s = median_time(3, env.repeats, [&](int i) {
      const std::uint32_t layer = static_cast<std::uint32_t>(i) % r.copies;
      kc::attention(dev.key(layer), dev.value(layer), std::span<const float>(q.span()), n_q,
                    std::span<const std::uint32_t>(offsets.span()), out.span(), {}, nullptr, w);
    });
    x.gbps = x.bytes / x.median_s * 1e-9;
    rs.push_back(x);
  }
  return rs;
}

// Causal prefill of `batch` entries x `tokens` new tokens, no history;
// generic: force the generic kernel (detail::DecodeTuning::generic) for a
// same-run comparison. GFLOP/s counts 4 * head_dim flops per (query head,
// visible key): 2 for q.k and 2 for p.v.
template <CacheElement T>
Record bench_prefill(const Env& env, std::uint32_t batch, std::uint32_t tokens, bool generic) {
  const std::uint32_t n_kv = 8, n_q = 32, dim = 128, page = 16;
  Record r{"prefill", std::string(kvcache::dtype_name(kvcache::dtype_of_v<T>)),
           "",        n_q,
           n_kv,      dim,
           page,      batch,
           tokens,    tokens,
           1};
  Setup<T> s(batch, 0, tokens, page, n_kv, dim, 1);
  kc::DeviceCollection<T> dev(s.desc, s.pool.data());
  r.kernel = generic ? "generic" : kc::attention_kernel_name(dev.key(0), dev.value(0));
  kc::DeviceBuffer<float> q(std::size_t{batch} * tokens * n_q * dim), out(q.size());
  fill(q.data(), q.size(), 13);
  auto offsets = kc::DeviceBuffer<std::uint32_t>::from_host(s.offsets);
  kc::AttentionWorkspace ws;
  kc::detail::DecodeTuning t;
  t.generic = generic;
  r.median_s = median_time(2, std::max(3, env.repeats / 2), [&](int) {
    kc::detail::attention_cuda_tuned(
        kvcache::dtype_of_v<T>, dev.key(0), dev.value(0), std::span<const float>(q.span()), n_q,
        std::span<const std::uint32_t>(offsets.span()), out.span(), {}, nullptr, &ws, t);
  });
  const double pairs = double(batch) * tokens * (tokens + 1) / 2;
  r.gflops = 4.0 * n_q * dim * pairs / r.median_s * 1e-9;
  r.bytes = double(batch) * tokens * n_kv * dim * sizeof(T) * 2;
  r.gbps = r.bytes / r.median_s * 1e-9;
  return r;
}

template <CacheElement T>
Record bench_store(const Env& env, std::uint32_t batch, std::uint32_t tokens, bool rope) {
  const std::uint32_t n_kv = 8, dim = 128, page = 16;
  Record r{"store_kv",
           std::string(kvcache::dtype_name(kvcache::dtype_of_v<T>)),
           rope ? "rope_k" : "store_kv",
           0,
           n_kv,
           dim,
           page,
           batch,
           tokens,
           tokens,
           1};
  Setup<T> s(batch, 0, tokens, page, n_kv, dim, 1);
  kc::DeviceCollection<T> dev(s.desc, s.pool.data());
  const std::size_t n = std::size_t{batch} * tokens * n_kv * dim;
  kc::DeviceBuffer<float> k(n), v(n);
  fill(k.data(), n, 17);
  fill(v.data(), n, 19);
  auto offsets = kc::DeviceBuffer<std::uint32_t>::from_host(s.offsets);
  kvcache::StoreOptions options;
  options.rope_k.enabled = rope;  // theta 10000, rotary_dim = head_dim
  r.median_s = median_time(3, env.repeats, [&](int) {
    kc::store_kv(dev.key(0), dev.value(0), std::span<const float>(k.span()),
                 std::span<const float>(v.span()), std::span<const std::uint32_t>(offsets.span()),
                 options);
  });
  r.bytes = double(n) * 2 * (4 + sizeof(T)) +
            double(batch) * tokens * n_kv * 2 * double(row_bytes<T>(dim) - dim * sizeof(T));
  r.gbps = r.bytes / r.median_s * 1e-9;
  return r;
}

std::string json(const Record& r, const Env& env) {
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "{\"kind\": \"%s\", \"kernel\": \"%s\", \"dtype\": \"%s\", \"n_q_heads\": %u, "
                "\"n_kv_heads\": %u, "
                "\"head_dim\": %u, \"page_size\": %u, \"batch\": %u, \"context\": %u, "
                "\"new_tokens\": %u, \"cache_copies\": %u, \"skipped\": %s, "
                "\"workspace\": %s, \"median_s\": %.9g, "
                "\"bytes_kv\": %.0f, \"gbps\": %.2f, \"copy_gbps\": %.2f, "
                "\"copy_read_gbps\": %.2f, \"fraction_of_copy\": %.4f, \"gflops\": %.1f}",
                r.kind.c_str(), r.kernel.c_str(), r.dtype.c_str(), r.n_q, r.n_kv, r.dim, r.page,
                r.batch, r.context, r.new_tokens, r.copies, r.skipped ? "true" : "false",
                r.workspace ? "true" : "false", r.median_s, r.bytes, r.gbps, env.copy_gbps,
                env.copy_read_gbps, env.copy_gbps > 0 ? r.gbps / env.copy_gbps : 0, r.gflops);
  return buf;
}

void print_table(const std::vector<Record>& rs, const Env& env) {
  std::printf("\ncopy (device to device): %.0f GB/s read+write, %.0f GB/s read-only equivalent\n",
              env.copy_gbps, env.copy_read_gbps);
  std::printf("%-9s %-8s %-5s %4s %6s %7s %4s %3s %11s %9s %8s %9s\n", "kind", "kernel", "dtype",
              "n_q", "batch", "context", "new", "ws", "median_us", "GB/s", "of_copy", "GFLOP/s");
  for (const Record& r : rs) {
    if (r.skipped) {
      std::printf("%-9s %-8s %-5s %4u %6u %7u   skipped (not enough device memory)\n",
                  r.kind.c_str(), r.kernel.c_str(), r.dtype.c_str(), r.n_q, r.batch, r.context);
      continue;
    }
    std::printf("%-9s %-8s %-5s %4u %6u %7u %4u %3s %11.1f %9.0f %8.3f %9.0f\n", r.kind.c_str(),
                r.kernel.c_str(), r.dtype.c_str(), r.n_q, r.batch, r.context, r.new_tokens,
                r.kind == "decode" ? (r.workspace ? "yes" : "no") : "-", r.median_s * 1e6, r.gbps,
                r.gbps / env.copy_gbps, r.gflops);
  }
}

struct Args {
  std::string json_path;
  int repeats = 20;
  bool quick = false;
  bool sweep = false;
  bool host = false;
  std::uint32_t once[4] = {0, 0, 0, 0};  // n_q, batch, context, new
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--json" && i + 1 < argc) {
      a.json_path = argv[++i];
    } else if (s == "--repeats" && i + 1 < argc) {
      a.repeats = std::max(3, std::atoi(argv[++i]));
    } else if (s == "--quick") {
      a.quick = true;
    } else if (s == "--sweep") {
      a.sweep = true;
    } else if (s == "--host") {
      a.host = true;
    } else if (s == "--once" && i + 4 < argc) {
      for (auto& x : a.once) x = static_cast<std::uint32_t>(std::atol(argv[++i]));
    } else {
      throw std::invalid_argument("unknown argument '" + s +
                                  "'; usage: kvcache_cuda_bench [--json FILE] [--repeats N] "
                                  "[--quick] [--sweep] [--host] [--once N_Q BATCH CONTEXT NEW]");
    }
  }
  return a;
}

template <CacheElement T>
void decode_suite(const Env& env, bool quick, std::vector<Record>& out) {
  struct Shape {
    std::uint32_t batch, ctx, new_tokens;
  };
  // new_tokens 4: a speculative step (4 rows per entry, causal among them).
  const std::vector<Shape> full{{32, 4096, 1}, {128, 4096, 1}, {32, 16384, 1}, {128, 16384, 1},
                                {1, 32768, 1}, {1, 131072, 1}, {32, 4096, 4}};
  const std::vector<Shape> small{{32, 4096, 1}, {1, 32768, 1}};
  for (std::uint32_t n_q : {8u, 32u}) {
    for (const Shape& s : quick ? small : full) {
      for (const Record& r : bench_decode<T>(env, n_q, s.batch, s.ctx, s.new_tokens)) {
        out.push_back(r);
      }
      std::fprintf(stderr, ".");
    }
  }
}

// ---- --sweep / --once: decode-kernel variants through detail::DecodeTuning ----

struct Variant {
  const char* name;
  kc::detail::DecodeTuning t;
  bool workspace = true;  // the rig's AttentionWorkspace (false: none, per-call scratch)
};

// Calls attention on cache copy `layer` with tuning t.
template <CacheElement T>
struct DecodeRig {
  std::uint32_t n_q, batch, ctx, new_tokens, copies;
  Setup<T> s;
  kc::DeviceCollection<T> dev;
  kc::DeviceBuffer<float> q, out;
  kc::DeviceBuffer<std::uint32_t> offsets;
  kc::AttentionWorkspace ws;
  DecodeRig(const Env& env, std::uint32_t n_q_, std::uint32_t batch_, std::uint32_t ctx_,
            std::uint32_t new_, std::uint32_t copies_)
      : n_q(n_q_),
        batch(batch_),
        ctx(ctx_),
        new_tokens(new_),
        copies(copies_),
        s(batch_, ctx_ - new_, new_, 16, 8, 128, copies_),
        dev(s.desc, s.pool.data()),
        q(std::size_t{batch_} * new_ * n_q_ * 128),
        out(q.size()),
        offsets(kc::DeviceBuffer<std::uint32_t>::from_host(s.offsets)) {
    (void)env;
    fill(q.data(), q.size(), 11);
  }
  void call(std::uint32_t layer, const kc::detail::DecodeTuning& t, bool use_ws = true) {
    kc::detail::attention_cuda_tuned(kvcache::dtype_of_v<T>, dev.key(layer), dev.value(layer),
                                     std::span<const float>(q.span()), n_q,
                                     std::span<const std::uint32_t>(offsets.span()), out.span(), {},
                                     nullptr, use_ws ? &ws : nullptr, t);
  }
  double bytes() const { return double(batch) * ctx * 8 * 128 * sizeof(T) * 2; }
};

std::uint32_t copies_for(const Env& env, std::uint32_t batch, std::uint32_t ctx, std::size_t elem) {
  const std::size_t one = std::size_t{batch} * ((ctx + 15) / 16) * 16 * 8 * 128 * elem * 2;
  return static_cast<std::uint32_t>(std::max<std::size_t>(1, (4 * env.l2 + one - 1) / one));
}

void sweep_shape(const Env& env, std::uint32_t n_q, std::uint32_t batch, std::uint32_t ctx,
                 std::uint32_t new_tokens, const std::vector<Variant>& vs) {
  const std::uint32_t copies = copies_for(env, batch, ctx, 2);
  const std::size_t one = std::size_t{batch} * ((ctx + 15) / 16) * 16 * 8 * 128 * 2 * 2;
  if (one * copies > free_bytes() * 8 / 10) {
    std::printf("n_q %u batch %u ctx %u new %u: skipped (device memory)\n", n_q, batch, ctx,
                new_tokens);
    return;
  }
  DecodeRig<BFloat16> rig(env, n_q, batch, ctx, new_tokens, copies);
  std::printf("-- bf16 n_q %u batch %u ctx %u new %u (%u copies)\n", n_q, batch, ctx, new_tokens,
              copies);
  std::vector<float> ref;
  for (const Variant& v0 : vs) {
    const kc::detail::DecodeTuning& t = v0.t;
    const bool w = v0.workspace;
    rig.out.fill_bytes(0xff);  // NaN: a variant that writes nothing shows as nan
    rig.call(0, t, w);
    check(cudaDeviceSynchronize(), "sweep variant");
    const std::vector<float> got = rig.out.to_host();
    if (ref.empty()) ref = got;
    double diff = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double d = std::abs(double(got[i]) - double(ref[i]));
      diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    }
    const double med = median_time(3, 10, [&](int i) { rig.call(i % copies, t, w); });
    Events ev;
    constexpr int kBack = 20;
    const double pipe = ev.time_s([&] {
      for (int i = 0; i < kBack; ++i) rig.call(i % copies, t, w);
    }) / kBack;
    const double gbps = rig.bytes() / med * 1e-9;
    std::printf("  %-14s %9.1f %9.1f %6.0f %7.3f %9.2e\n", v0.name, med * 1e6, pipe * 1e6, gbps,
                gbps / env.copy_gbps, diff);
  }
}

// Every variant uses the rig's workspace unless its name says "nows".
// "default" is what kvcache::cuda::attention runs (ring depth 3, one-wave
// split plan); "old" is the previous default's ring and plan (4 stages, 4
// waves) without a workspace, for comparison (the merge kernel is the new
// one either way).
int run_sweep(const Env& env) {
  using kc::detail::DecodeTuning;
  auto V = [](const char* n, std::uint32_t vec, std::uint32_t st, std::uint32_t lanes,
              std::uint32_t waves, std::uint32_t min_split, bool ws = true) {
    DecodeTuning t;
    t.max_vectors = vec;
    t.stages = st;
    t.lanes = lanes;
    t.split_waves = waves;
    t.min_split_tokens = min_split;
    return Variant{n, t, ws};
  };
  const Variant def = V("default", 0, 0, 0, 0, 0);
  const std::vector<Variant> common{def,
                                    V("nows", 0, 0, 0, 0, 0, false),
                                    V("stages4", 0, 4, 0, 0, 0),
                                    V("stages2", 0, 2, 0, 0, 0),
                                    V("lanes8", 0, 0, 8, 0, 0),
                                    V("lanes8+st2", 0, 2, 8, 0, 0),
                                    V("waves2", 0, 0, 0, 2, 0),
                                    V("waves4", 0, 0, 0, 4, 0),
                                    V("old", 0, 4, 0, 4, 0, false)};
  const std::vector<Variant> heads{V("vec2", 2, 0, 0, 0, 0), V("vec1", 1, 0, 0, 0, 0)};
  const std::vector<Variant> single{V("split512", 0, 0, 0, 0, 512),
                                    V("split1024", 0, 0, 0, 0, 1024),
                                    V("split2048", 0, 0, 0, 0, 2048)};
  auto cat = [](std::vector<Variant> a, const std::vector<Variant>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  std::printf(
      "copy %.0f GB/s; columns: variant median_us pipelined_us GB/s of_copy "
      "max_abs_diff_vs_default\n",
      env.copy_gbps);
  for (std::uint32_t n_q : {8u, 32u}) {
    const std::vector<Variant> base = n_q == 8 ? common : cat(common, heads);
    sweep_shape(env, n_q, 32, 4096, 1, base);
    sweep_shape(env, n_q, 128, 16384, 1, base);
    sweep_shape(env, n_q, 1, 32768, 1, cat(base, single));
  }
  sweep_shape(
      env, 32, 32, 4096, 4,
      {def, V("nows", 0, 0, 0, 0, 0, false), V("stages4", 0, 4, 0, 0, 0), V("vec4", 4, 0, 0, 0, 0),
       V("vec4+lanes8", 4, 0, 8, 0, 0), V("vec2", 2, 0, 0, 0, 0), V("waves2", 0, 0, 0, 2, 0)});
  return 0;
}

// ---- --host: what a decode step's calls cost besides their kernels ----

double host_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Host microseconds per call of f, over n calls.
template <class F>
double host_us(int n, F&& f) {
  const double t0 = host_now_s();
  for (int i = 0; i < n; ++i) f(i);
  return (host_now_s() - t0) / n * 1e6;
}

// Prints, for f: the event-timed single call (median), host time per call
// issued back to back (before the synchronisation) and device time per call
// back to back (events around n calls).
template <class F>
void report_calls(const char* what, cudaStream_t st, F&& f) {
  constexpr int kN = 200;
  const double single = median_time(5, 31, [&](int i) { f(i); }) * 1e6;
  check(cudaStreamSynchronize(st), "sync");
  Events ev;
  double issue = 0;
  const double piped = ev.time_s([&] { issue = host_us(kN, f); }) / kN * 1e6;
  check(cudaDeviceSynchronize(), "sync");
  std::printf("%-34s single %7.2f us   host per call %7.2f us   back to back %7.2f us\n", what,
              single, issue, piped);
}

int run_host(const Env& env) {
  (void)env;
  constexpr std::uint32_t kBatch = 32, kCtx = 512, kNq = 8, kNkv = 8, kDim = 128, kPage = 16;
  Setup<BFloat16> s(kBatch, kCtx - 1, 1, kPage, kNkv, kDim, 1);
  kc::DeviceCollection<BFloat16> dev(s.desc, s.pool.data());
  const std::size_t kv_n = std::size_t{kBatch} * kNkv * kDim;
  kc::DeviceBuffer<float> k_new(kv_n), v_new(kv_n), q(std::size_t{kBatch} * kNq * kDim),
      out(q.size());
  fill(k_new.data(), kv_n, 21);
  fill(v_new.data(), kv_n, 22);
  fill(q.data(), q.size(), 23);
  auto offsets = kc::DeviceBuffer<std::uint32_t>::from_host(s.offsets);
  kc::AttentionWorkspace ws;
  cudaStream_t st = nullptr;
  // A blocking stream: the events on the null stream (Events, median_time)
  // order against its work; graphs are captured on it.
  check(cudaStreamCreate(&st), "cudaStreamCreate");
  kvcache::StoreOptions rope;
  rope.rope_k.enabled = true;
  auto store = [&](int) {
    kc::store_kv(dev.key(0), dev.value(0), std::span<const float>(k_new.span()),
                 std::span<const float>(v_new.span()),
                 std::span<const std::uint32_t>(offsets.span()), kvcache::StoreOptions{}, st);
  };
  auto store_rope = [&](int) {
    kc::store_kv(dev.key(0), dev.value(0), std::span<const float>(k_new.span()),
                 std::span<const float>(v_new.span()),
                 std::span<const std::uint32_t>(offsets.span()), rope, st);
  };
  auto attend = [&](int) {
    kc::attention(dev.key(0), dev.value(0), std::span<const float>(q.span()), kNq,
                  std::span<const std::uint32_t>(offsets.span()), out.span(), {}, st, &ws);
  };
  auto step = [&](int i) {
    store_rope(i);
    attend(i);
  };
  std::printf(
      "-- per-call costs: bf16, %u entries x %u context, 1 new token, n_q %u, %u KV "
      "heads, head dim %u, page %u, stream of its own\n",
      kBatch, kCtx, kNq, kNkv, kDim, kPage);
  report_calls("store_kv", st, store);
  report_calls("store_kv + RoPE", st, store_rope);
  report_calls("attention (workspace)", st, attend);
  report_calls("store_kv + RoPE, then attention", st, step);

  // The runtime queries a call's host checks make.
  int device = 0, sms = 0;
  cudaPointerAttributes attr{};
  const double ptr_us = host_us(1000, [&](int) {
    check(cudaPointerGetAttributes(&attr, k_new.data()), "cudaPointerGetAttributes");
  });
  const double dev_us = host_us(1000, [&](int) { check(cudaGetDevice(&device), "cudaGetDevice"); });
  const double attr_us = host_us(1000, [&](int) {
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "attribute");
  });
  std::printf(
      "cudaPointerGetAttributes %.3f us, cudaGetDevice %.3f us, "
      "cudaDeviceGetAttribute %.3f us (host, each)\n",
      ptr_us, dev_us, attr_us);

  // The step captured into a CUDA graph and replayed.
  check(cudaStreamSynchronize(st), "sync");
  const std::vector<float> direct = out.to_host(st);
  out.fill_bytes(0xff, st);
  check(cudaStreamSynchronize(st), "sync");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::string failure;
  try {
    check(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    try {
      step(0);
    } catch (...) {
      cudaStreamEndCapture(st, &graph);
      throw;
    }
    check(cudaStreamEndCapture(st, &graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  } catch (const std::exception& e) {
    failure = e.what();
    (void)cudaGetLastError();
  }
  if (!failure.empty()) {
    std::printf("graph capture of store_kv + attention: FAILED: %s\n", failure.c_str());
  } else {
    check(cudaGraphLaunch(exec, st), "cudaGraphLaunch");
    check(cudaStreamSynchronize(st), "sync");
    const std::vector<float> replayed = out.to_host(st);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < direct.size(); ++i) {
      differ += std::memcmp(&direct[i], &replayed[i], sizeof(float)) != 0;
    }
    report_calls("graph replay (store + RoPE, attention)", st,
                 [&](int) { check(cudaGraphLaunch(exec, st), "cudaGraphLaunch"); });
    std::printf("graph replay output: %zu of %zu floats differ from the direct calls'\n", differ,
                direct.size());
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  check(cudaStreamDestroy(st), "cudaStreamDestroy");
  return failure.empty() ? 0 : 2;
}

int run_once(const Env& env, const std::uint32_t (&o)[4]) {
  DecodeRig<BFloat16> rig(env, o[0], o[1], o[2], o[3], copies_for(env, o[1], o[2], 2));
  for (std::uint32_t i = 0; i < 3; ++i) rig.call(i % rig.copies, {});  // with the workspace
  check(cudaDeviceSynchronize(), "once");
  std::printf("once: bf16 n_q %u batch %u ctx %u new %u: 3 calls done\n", o[0], o[1], o[2], o[3]);
  return 0;
}

int run(int argc, char** argv) {
  const Args args = parse(argc, argv);
  if (kc::device_count() == 0) {
    std::fprintf(stderr, "kvcache_cuda_bench: no CUDA device\n");
    return 1;
  }
  Env env;
  env.repeats = args.repeats;
  int dev = 0, l2 = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "L2 size");
  env.l2 = static_cast<std::size_t>(l2);
  std::fprintf(stderr, "kvcache_cuda_bench on %s\n", kc::device_description().c_str());
  if (args.once[0] != 0) return run_once(env, args.once);
  if (args.host) return run_host(env);
  const double copy_s = measure_copy(env, std::size_t{1} << 30);
  env.copy_gbps = 2.0 * double(std::size_t{1} << 30) / copy_s * 1e-9;
  env.copy_read_gbps = env.copy_gbps / 2;
  if (args.sweep) return run_sweep(env);
  std::vector<Record> rs;
  decode_suite<BFloat16>(env, args.quick, rs);
  decode_suite<Half>(env, args.quick, rs);
  rs.push_back(bench_prefill<BFloat16>(env, 1, 2048, false));
  rs.push_back(bench_prefill<Half>(env, 1, 2048, false));
  rs.push_back(bench_prefill<BFloat16>(env, 8, 2048, false));
  rs.push_back(bench_prefill<BFloat16>(env, 1, 2048, true));  // the generic kernel, same shape
  for (bool rope : {false, true}) {
    rs.push_back(bench_store<BFloat16>(env, 8, 2048, rope));
    rs.push_back(bench_store<Half>(env, 8, 2048, rope));
    rs.push_back(bench_store<float>(env, 8, 2048, rope));
  }
  // 8-bit caches (the generic attention kernel; docs/CUDA.md).
  decode_suite<kvcache::Fp8E4M3>(env, args.quick, rs);
  decode_suite<kvcache::Int8>(env, args.quick, rs);
  for (bool rope : {false, true}) {
    rs.push_back(bench_store<kvcache::Fp8E4M3>(env, 8, 2048, rope));
    rs.push_back(bench_store<kvcache::Int8>(env, 8, 2048, rope));
  }
  rs.push_back(bench_store<BFloat16>(env, 32, 1, false));  // a decode step's store
  rs.push_back(bench_store<BFloat16>(env, 32, 1, true));
  std::fprintf(stderr, "\n");
  std::string doc = "{\"device\": \"" + kc::device_description() + "\", \"results\": [\n";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    doc += "  " + json(rs[i], env) + (i + 1 < rs.size() ? ",\n" : "\n");
  }
  doc += "]}\n";
  if (!args.json_path.empty()) {
    std::ofstream(args.json_path) << doc;
  } else {
    std::fputs(doc.c_str(), stdout);
  }
  print_table(rs, env);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvcache_cuda_bench: %s\n", e.what());
    return 1;
  }
}
