// tools/bench.h — `kvcache bench attention|store`: the fast kernels timed
// against the machine's own limits, measured in the same run with the same
// threads (DESIGN.md §6). The command (bench.cpp) parses the flags into the
// structs below, runs bench_attention (bench_attention.cpp) or bench_store
// (bench_store.cpp), each of which returns one JSON object, and prints it:
// as a table (print_bench_table) by default, as the object with --json.
// The caches are built by the harness the Google Benchmark programs share
// (bench_harness.h). Bad flags throw kvcache::InvalidArgument naming the
// value and the limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "kvcache/kernels/attention.h"
#include "kvcache/kvcache.h"
#include "kvcache/thread_pool.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvcache::tools {

// `kvcache bench tiers` (bench_tiers.cpp), registered on the bench command.
void add_bench_tiers_command(CLI::App* bench);

// Flags both benchmarks take.
struct Common {
  std::string dtype = "bf16";
  std::uint32_t head_dim = 128;
  std::uint32_t kv_heads = 8;
  std::uint32_t batch = 1;
  std::uint32_t page_size = 16;
  std::string page_order = "shuffled";
  std::size_t threads = 2;
  std::string strategy = "paged";
  std::string layout = "nhd";
  std::string arrangement = "interleaved";
  std::string huge_pages = "on";
  std::string isa = "auto";   // instruction set of the fast kernels (select_isa)
  std::uint32_t repeats = 0;  // 0: automatic
  bool json = false;
};

struct AttentionArgs : Common {
  std::uint32_t q_heads = 32;
  std::uint32_t context = 4096;
  std::string mode = "decode";
  std::string resident = "dram";
  std::string prefetch = "auto";
  std::string precision = "fp32";
};

struct StoreArgs : Common {
  std::string prefetch = "auto";
  std::uint32_t tokens = 4096;
  bool rope = false;
  bool rope_table = false;
};

// Limits of the bench's sizes (each a cache the bench allocates and fills).
inline constexpr std::uint32_t kMaxBenchBatch = 65536;
inline constexpr std::uint32_t kMaxBenchTokens = 1u << 24;
inline constexpr std::uint64_t kMaxBenchSetBytes = std::uint64_t{1} << 38;  // 256 GiB

// The cache parameters of the flags (one layer), checked: dtype, strategy,
// layout, arrangement, page order, threads and batch.
KVCacheParams bench_params(const Common& a);
// Tokens per sequence (`what`: --context or --tokens) within kMaxBenchTokens,
// and one set of the batch's caches within kMaxBenchSetBytes.
void check_bench_tokens(const Common& a, const KVCacheParams& p, const char* what,
                        std::uint32_t tokens);
// --huge-pages on | off.
bool huge_pages_on(const Common& a);
// AnonHugePages of this process, kB (/proc/self/smaps_rollup).
std::size_t anon_huge_kb();
// fp32 FMA peak of the pool's threads, GFLOP/s (median of 5).
double fma_peak_gflops(ThreadPool& pool);

// An mmap'ed buffer with the same huge-page advice as the cache.
struct Buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  Buffer(std::size_t n, bool huge);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

template <CacheElement T>
nlohmann::json bench_attention(const AttentionArgs& a);
template <CacheElement T>
nlohmann::json bench_store(const StoreArgs& a);

// The figures of a bench result (either benchmark), as aligned tables.
void print_bench_table(const nlohmann::json& j, std::ostream& os);

}  // namespace kvcache::tools
