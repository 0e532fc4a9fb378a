// tools/tour.cpp — `kvcache tour`: a plan for a real model, then a narrated
// lifecycle walk-through on a small manager of each kind.
//
// The walk-through drives the public API exactly as an inference engine
// would: claim -> fetch (prefill) -> store_kv + attention per layer -> step ->
// decode fetch/step -> multistep decode with increment_cache_lengths ->
// release, then provokes errors on purpose and shows that they leave the
// manager unchanged. Everything is tiny so the demo runs in milliseconds.

#include <CLI/CLI.hpp>
#include <cmath>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "commands.h"
#include "kvcache/engine/units.h"
#include "kvcache/kvcache.h"
#include "plan.h"
#include "table.h"

namespace kvcache::tools {
namespace {

constexpr std::uint32_t kQHeads = 4;  // 2 query heads per KV head (GQA)

KVCacheParams demo_params(CacheStrategy strategy, std::uint32_t page_size) {
  KVCacheParams p;
  p.dtype = DType::f32;
  p.num_layers = 2;
  p.n_kv_heads = 2;
  p.head_dim = 16;
  p.cache_strategy = strategy;
  p.page_size = page_size;
  return p;
}

// What one round of kernels over every layer produced.
struct KernelRun {
  std::uint32_t rows = 0;   // new tokens written
  double mean_abs_out = 0;  // mean |attention output| of the last layer
  bool self_check = true;   // a first token's output equals its own V (softmax of one)
};

std::vector<float> random_floats(std::mt19937& rng, std::size_t n) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<std::uint32_t> row_offsets(std::span<const std::uint32_t> new_tokens) {
  std::vector<std::uint32_t> offsets{0};
  for (std::uint32_t n : new_tokens) offsets.push_back(offsets.back() + n);
  return offsets;
}

// A token at position 0 attends only to itself, so its output must be its V.
template <class Cache>
bool first_tokens_equal_v(const Cache& k, std::span<const std::uint32_t> offsets,
                          std::span<const float> v_new, std::span<const float> out) {
  const std::uint32_t dim = k.head_dim(), group = kQHeads / k.n_kv_heads();
  for (std::uint32_t b = 0; b < k.batch_size(); ++b) {
    if (k.cache_length(b) != 0 || offsets[b + 1] == offsets[b]) continue;
    const std::size_t r = offsets[b];
    for (std::uint32_t h = 0; h < kQHeads; ++h)
      for (std::uint32_t d = 0; d < dim; ++d)
        if (out[(r * kQHeads + h) * dim + d] != v_new[(r * k.n_kv_heads() + h / group) * dim + d])
          return false;
  }
  return true;
}

template <class Collection>
KernelRun run_layers(const Collection& c, std::span<const std::uint32_t> offsets,
                     std::mt19937& rng) {
  KernelRun run;
  run.rows = offsets.back();
  const auto k0 = c.get_key_cache(0);
  const std::size_t kv_elems = std::size_t{run.rows} * k0.n_kv_heads() * k0.head_dim();
  std::vector<float> out(std::size_t{run.rows} * kQHeads * k0.head_dim());
  for (std::uint32_t layer = 0; layer < c.num_layers(); ++layer) {
    const auto k = c.get_key_cache(layer);
    const auto v = c.get_value_cache(layer);
    const std::vector<float> k_new = random_floats(rng, kv_elems);
    const std::vector<float> v_new = random_floats(rng, kv_elems);
    const std::vector<float> q = random_floats(rng, out.size());
    store_kv_reference(k, v, k_new, v_new, offsets);
    attention_reference(k, v, q, kQHeads, offsets, out);
    run.self_check = run.self_check && first_tokens_equal_v(k, offsets, v_new, out);
  }
  double sum = 0;
  for (float x : out) sum += std::fabs(x);
  run.mean_abs_out = out.empty() ? 0 : sum / static_cast<double>(out.size());
  return run;
}

KernelRun run_kernels(const KVCacheBatch& batch, std::span<const std::uint32_t> offsets,
                      std::mt19937& rng) {
  if (batch.strategy() == CacheStrategy::paged)
    return run_layers(batch.paged<float>(), offsets, rng);
  return run_layers(batch.continuous<float>(), offsets, rng);
}

std::string blocks_of(const KVCacheBatch& batch, std::uint32_t b) {
  std::vector<std::uint32_t> ids;
  for (std::uint32_t j = 0; j < batch.lookup_stride(); ++j) {
    const std::uint32_t id = batch.lookup_table()[std::size_t{b} * batch.lookup_stride() + j];
    if (batch.strategy() == CacheStrategy::paged && id == batch.num_blocks()) break;
    ids.push_back(id);
  }
  return format_list(ids);
}

void print_batch(const KVCacheBatch& batch, std::span<const std::uint32_t> new_tokens,
                 std::ostream& os) {
  const bool paged = batch.strategy() == CacheStrategy::paged;
  Table t({"seq", "cache_length", "new", "reserved", paged ? "page table" : "slot"});
  for (std::uint32_t b = 0; b < batch.batch_size(); ++b) {
    t.add_row({std::to_string(batch.seq_ids()[b]), std::to_string(batch.cache_lengths()[b]),
               std::to_string(new_tokens[b]), std::to_string(batch.reserved_lengths()[b]),
               blocks_of(batch, b)});
  }
  t.print(os, "    ");
}

std::string lengths_of(const KVCacheManager& m, std::span<const SeqId> seqs) {
  std::vector<std::uint32_t> lengths;
  for (SeqId s : seqs) lengths.push_back(m.cache_length(s));
  return format_list(lengths);
}

std::string free_of(const KVCacheManager& m) {
  const char* unit = m.params().cache_strategy == CacheStrategy::paged ? " pages" : " slots";
  return std::to_string(m.free_blocks()) + "/" + std::to_string(m.total_blocks()) + unit + " free";
}

void prefill(KVCacheManager& m, std::span<const SeqId> seqs, std::mt19937& rng, std::ostream& os) {
  const std::vector<std::uint32_t> prompt = {5, 9, 3};
  const KVCacheBatch batch = m.fetch(seqs, prompt);
  os << "  fetch(prefill " << format_list(prompt) << ")  is_cache_empty=" << std::boolalpha
     << batch.is_cache_empty() << ", max_prompt_length=" << batch.max_seq_length() << '\n';
  print_batch(batch, prompt, os);
  const KernelRun run = run_kernels(batch, row_offsets(prompt), rng);
  os << "  store_kv + attention on " << m.params().num_layers << " layers: " << run.rows
     << " rows; first token's output == its V: " << (run.self_check ? "yes" : "NO") << '\n';
  m.step(seqs, prompt);
  os << "  step -> cache lengths " << lengths_of(m, seqs) << ", " << free_of(m) << '\n';
}

void decode(KVCacheManager& m, std::span<const SeqId> seqs, std::mt19937& rng, std::ostream& os) {
  const std::vector<std::uint32_t> one(seqs.size(), 1);
  os << "  decode: fetch 1 token each -> store_kv + attention -> step, three times\n";
  Table t({"decode step", "cache lengths", "free", "mean |out|"});
  for (int i = 1; i <= 3; ++i) {
    const KVCacheBatch batch = m.fetch(seqs, one);
    const KernelRun run = run_kernels(batch, row_offsets(one), rng);
    m.step(seqs, one);
    t.add_row({std::to_string(i), lengths_of(m, seqs), free_of(m),
               std::to_string(run.mean_abs_out).substr(0, 6)});
  }
  t.print(os, "    ");
}

void multistep(KVCacheManager& m, std::span<const SeqId> seqs, std::mt19937& rng,
               std::ostream& os) {
  constexpr std::uint32_t kSteps = 3;
  const std::vector<std::uint32_t> one(seqs.size(), 1);
  const std::vector<std::uint32_t> offsets = row_offsets(one);
  KVCacheBatch batch = m.fetch(seqs, one, kSteps);
  os << "  fetch(1 token, num_steps=" << kSteps << ") reserves "
     << format_list(batch.reserved_lengths()) << "; run 3 steps on one batch:\n";
  for (std::uint32_t s = 0; s < kSteps; ++s) {
    if (s > 0) m.increment_cache_lengths(batch, offsets);  // views advance, manager untouched
    run_kernels(batch, offsets, rng);
    os << "    step " << s + 1 << ": batch cache_lengths " << format_list(batch.cache_lengths())
       << ", manager still " << lengths_of(m, seqs) << '\n';
  }
  m.step(seqs, std::vector<std::uint32_t>(seqs.size(), kSteps));
  os << "  step(3 each) -> cache lengths " << lengths_of(m, seqs) << ", " << free_of(m) << '\n';
}

std::string error_kind(const Error& e) {
  if (dynamic_cast<const UnknownSequence*>(&e)) return "UnknownSequence";
  if (dynamic_cast<const OutOfPages*>(&e)) return "OutOfPages";
  if (dynamic_cast<const CapacityExceeded*>(&e)) return "CapacityExceeded";
  if (dynamic_cast<const InvalidArgument*>(&e)) return "InvalidArgument";
  return "Error";
}

// Runs `bad`, which must throw, and shows the error and that nothing changed.
template <class F>
void show_error(const KVCacheManager& m, const std::string& what, F&& bad, std::ostream& os) {
  const ManagerSnapshot before = m.snapshot();
  try {
    bad();
    os << "  " << what << ": no error?!\n";
  } catch (const Error& e) {
    os << "  " << what << " -> " << error_kind(e) << ": \"" << e.what()
       << "\"; state unchanged: " << (m.snapshot() == before ? "yes" : "NO") << '\n';
  }
}

void release_and_fail(KVCacheManager& m, std::span<const SeqId> seqs, std::ostream& os) {
  m.release(seqs[1]);
  os << "  release(seq " << seqs[1] << ") -> " << free_of(m) << '\n';
  m.release(seqs[0]);
  m.release(seqs[2]);
  os << "  release the others -> " << free_of(m) << ", " << m.num_active_sequences() << " active\n";
  const SeqId gone = seqs[0];
  const std::vector<std::uint32_t> one = {1};
  show_error(
      m, "fetch(released seq " + std::to_string(gone) + ")",
      [&] { m.fetch(std::span(&gone, 1), one); }, os);
  const SeqId fresh = m.claim(1)[0];
  // Paged: more than the whole pool (OutOfPages); continuous: past max_seq_len.
  const bool paged = m.params().cache_strategy == CacheStrategy::paged;
  const std::vector<std::uint32_t> huge = {paged ? m.total_blocks() * m.params().page_size + 4
                                                 : m.max_seq_len() + 1};
  show_error(
      m, "fetch(" + std::to_string(huge[0]) + " tokens)",
      [&] { m.fetch(std::span(&fresh, 1), huge); }, os);
  m.release(fresh);
  show_error(
      m, "release(seq " + std::to_string(fresh) + ") twice", [&] { m.release(fresh); }, os);
}

void walk_through(KVCacheManager& m, const std::string& title, std::ostream& os) {
  os << "\n== " << title << " (" << m.params().to_string() << ", " << kQHeads
     << " query heads) ==\n";
  std::mt19937 rng(42);
  const std::vector<SeqId> seqs = m.claim(3);
  os << "  claim(3) -> seqs " << format_list(seqs) << ", " << free_of(m) << '\n';
  prefill(m, seqs, rng, os);
  decode(m, seqs, rng, os);
  multistep(m, seqs, rng, os);
  release_and_fail(m, seqs, os);
  m.check_invariants();
  os << "  check_invariants: ok\n";
}

void run_tour(std::ostream& os) {
  PlanInput in;
  const ModelPreset& preset = find_preset("llama-3-8b");
  in.model = std::string(preset.name);
  in.params.dtype = DType::bf16;
  in.params.num_layers = preset.num_layers;
  in.params.n_kv_heads = preset.n_kv_heads;
  in.params.head_dim = preset.head_dim;
  in.memory_per_device = engine::parse_byte_size("16GiB");
  os << "$ kvcache plan --preset llama-3-8b --memory 16GiB\n";
  print_plan(compute_plan(in), os);

  os << "\nLifecycle walk-through: claim -> fetch -> store_kv/attention -> step -> ... -> "
        "release\n";
  ContinuousBatchingKVCacheManager continuous(demo_params(CacheStrategy::continuous, 0),
                                              /*max_batch_size=*/4, /*max_seq_len=*/64);
  walk_through(continuous, "continuous batching: 4 slots x 64 tokens", os);
  PagedKVCacheManager paged(demo_params(CacheStrategy::paged, 4), /*total_num_pages=*/12,
                            /*max_batch_size=*/4, /*max_seq_len=*/64);
  walk_through(paged, "paged: 12 pages x 4 tokens", os);
}

}  // namespace

void add_tour_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "tour", "Plan for llama-3-8b in 16GiB, then walk through the cache lifecycle");
  cmd->callback([] { run_tour(std::cout); });
}

}  // namespace kvcache::tools
