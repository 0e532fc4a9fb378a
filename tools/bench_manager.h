// tools/bench_manager.h — what `kvcache bench-manager` (tools/bench_manager.cpp)
// shares with its tier comparison (tools/bench_manager_tiers.cpp).
//
// run_manager_tier_bench: the manager's cost per request with tiers below
// the device pool and nothing in them that a request asks for, against the
// same requests without tiers, in one run. Each configuration ("none",
// "host", "host+disk") gets its own manager over the same tiny model shape
// (page bytes 8 x page_size: the bookkeeping is timed, not the copies of
// real pages). Requests come in batches of `batch`, as an engine serves
// them: each is claimed and matched (match_prefix over a prompt of tokens no
// earlier request used, so no tier holds what it asks for), the batch's
// prompts are fetched and committed with their token ids in one fetch and
// one step, then `steps` one-token decode steps of the whole batch (a fetch
// and a step each), then each is released. The pool holds 4 batches, so
// every batch evicts about as many published pages as it fills, and with
// tiers each of them is written back (with admit_reused none is: no page is
// ever attached again). "null" is a tier
// that holds nothing and finishes every store at once: the manager's side
// alone. The host tier holds 4096 pages and the disk 4096 more (a host
// writing through to the disk, as `kvcache replay` configures them), both
// evicting. Timed: the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID),
// so the tiers' own threads do not count; the write-backs are waited for
// about every 32 requests (at least every batch; staging for the pages of
// the requests in between, so none is dropped), that wait left out. After an untimed round,
// `repeats` rounds each run `requests` requests of every configuration, the order rotating per
// round; per configuration the median ns per request and the median of the per-round ratios to
// "none". Throws InvalidArgument for an unknown configuration name or a disk directory that cannot
// be made.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvcache::tools {

struct ManagerTierBenchArgs {
  std::uint32_t page_size = 16;
  std::uint32_t prompt = 512;
  std::uint32_t steps = 16;  // decode steps per request
  std::uint32_t batch = 1;   // requests served together
  std::uint32_t requests = 200;
  std::uint32_t repeats = 7;
  std::vector<std::string> configs;  // "none", "null", "host", "host+disk"
  bool admit_reused = false;         // OffloadAdmission::reused: nothing is written back
  std::string disk_dir;              // empty: a temporary directory, removed afterwards
  bool json = false;
};

void run_manager_tier_bench(const ManagerTierBenchArgs& args);

}  // namespace kvcache::tools
