// tools/bench_manager_tiers.cpp — `kvcache bench-manager --tiers LIST`: the
// paged manager's cost per request with tiers that hold nothing a request
// asks for, against no tiers, in one run (tools/bench_manager.h says what is
// timed).
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_manager.h"
#include "kvcache/disk_tier.h"
#include "kvcache/error.h"
#include "kvcache/host_tier.h"
#include "kvcache/paged_manager.h"
#include "kvcache/write_through_tier.h"
#include "table.h"

namespace kvcache::tools {

namespace {

constexpr std::uint64_t kTierPages = 4096;  // pages each tier holds
constexpr std::uint32_t kPoolRequests = 4;  // requests' pages the device pool holds
constexpr std::uint32_t kWaitEvery = 32;    // requests between waits for the write-backs (about)

double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

KVCacheParams params_of(std::uint32_t page_size) {
  return KVCacheParams{.dtype = DType::f32,
                       .num_layers = 1,
                       .n_kv_heads = 1,
                       .head_dim = 1,
                       .cache_strategy = CacheStrategy::paged,
                       .page_size = page_size,
                       .enable_prefix_caching = true};
}

// Batches between waits for the write-backs: about kWaitEvery requests.
std::uint32_t wait_every(const ManagerTierBenchArgs& a) {
  return std::max<std::uint32_t>(1, kWaitEvery / a.batch);
}

std::uint32_t pages_per_request(const ManagerTierBenchArgs& a) {
  return (a.prompt + a.steps + a.page_size - 1) / a.page_size + 1;
}

// Holds nothing and finishes every store at once, without results (the
// manager counts them as dropped): the manager's side of the tiers alone,
// without a tier's copies and the wake-up of its threads.
class NullTier final : public Tier {
 public:
  explicit NullTier(TierFingerprint fp) : fp_(std::move(fp)) {}
  std::string_view name() const override { return "null"; }
  const TierFingerprint& fingerprint() const override { return fp_; }
  bool enabled() const override { return true; }
  std::vector<std::uint8_t> contains(std::span<const PageKey> keys) override {
    return std::vector<std::uint8_t>(keys.size(), 0);
  }
  TierTicket store(std::span<const PageWrite>) override { return {}; }
  TierTicket load(std::span<const PageRead>) override { return {}; }
  TierStats stats() const override { return {}; }

 private:
  TierFingerprint fp_;
};

// A temporary directory removed at the end (or the caller's, kept).
class BenchDir {
 public:
  explicit BenchDir(const std::string& given) {
    if (!given.empty()) {
      path_ = given;
      return;
    }
    std::string t = (std::filesystem::temp_directory_path() / "kvcache-bench-XXXXXX").string();
    if (mkdtemp(t.data()) == nullptr) {
      throw InvalidArgument("bench-manager: cannot make a temporary directory from " + t);
    }
    path_ = t;
    owned_ = true;
  }
  ~BenchDir() {
    std::error_code ec;
    if (owned_) std::filesystem::remove_all(path_, ec);
  }
  BenchDir(const BenchDir&) = delete;
  BenchDir& operator=(const BenchDir&) = delete;
  std::filesystem::path path(const std::string& sub) const { return path_ / sub; }

 private:
  std::filesystem::path path_;
  bool owned_ = false;
};

// One configuration: its manager and the requests' token source.
class Subject {
 public:
  Subject(std::string name, const ManagerTierBenchArgs& a, const BenchDir& dir)
      : name_(std::move(name)), args_(a) {
    const KVCacheParams p = params_of(a.page_size);
    PrefixCacheConfig cfg;
    cfg.policy = EvictionPolicyKind::lru;
    cfg.tiers.model_id = "kvcache-bench";
    if (a.admit_reused) cfg.tiers.admission = OffloadAdmission::reused;
    cfg.tiers.staging_pages = static_cast<std::uint32_t>(std::min<std::uint64_t>(
        std::uint64_t{wait_every(a)} * a.batch * pages_per_request(a), 65536));
    const TierFingerprint fp = TierFingerprint::of(p, cfg.tiers.model_id);
    const std::uint64_t cap = kTierPages * fp.page_bytes();
    if (name_ == "host") {
      cfg.tiers.tiers = {std::make_shared<HostTier>(fp, cap)};
    } else if (name_ == "null") {
      cfg.tiers.tiers = {std::make_shared<NullTier>(fp)};
    } else if (name_ == "host+disk") {
      auto disk = std::make_shared<DiskTier>(fp, dir.path("disk"), cap);
      auto host = std::make_shared<HostTier>(fp, cap);
      cfg.tiers.tiers = {std::make_shared<WriteThroughTier>(host, disk), disk};
    } else if (name_ != "none") {
      throw InvalidArgument("bench-manager --tiers: '" + name_ +
                            "' is not a configuration (none, null, host, host+disk)");
    }
    const std::uint32_t len = a.prompt + a.steps + 1;
    manager_ = std::make_unique<PagedKVCacheManager>(
        p, kPoolRequests * a.batch * pages_per_request(a), a.batch, len, std::move(cfg));
    prompts_.resize(std::size_t{a.batch} * a.prompt);
    for (std::uint32_t b = 0; b < a.batch; ++b)
      for (std::uint32_t i = 0; i < a.prompt; ++i) prompts_[std::size_t{b} * a.prompt + i] = i;
    rest_.resize(a.batch);
    ones_.assign(a.batch, 1);
    tokens_.resize(a.batch);
  }

  const std::string& name() const { return name_; }
  PagedKVCacheManager& manager() { return *manager_; }

  // Runs n requests (in batches of args.batch, at least one batch);
  // returns the calling thread's CPU ns per request. The write-backs are
  // waited for every wait_every batches (wait_tiers, its CPU time left out),
  // so the staging never runs out.
  double run(std::uint32_t n) {
    const std::uint32_t batches = std::max<std::uint32_t>(1, n / args_.batch);
    const double c0 = thread_cpu_ns();
    double waits = 0;
    for (std::uint32_t r = 1; r <= batches; ++r) {
      batch();
      if (r % wait_every(args_) != 0 && r != batches) continue;
      const double w0 = thread_cpu_ns();
      manager_->wait_tiers();
      waits += thread_cpu_ns() - w0;
    }
    return (thread_cpu_ns() - c0 - waits) / (double(batches) * args_.batch);
  }

 private:
  // args.batch requests served together, as an engine batches them: each
  // matched, the prompts fetched and committed in one call, then one fetch
  // and one step per decode step for the whole batch. Tokens no earlier
  // request used: each prompt's first token is its request's number.
  void batch() {
    PagedKVCacheManager& m = *manager_;
    const std::uint32_t n = args_.batch, len = args_.prompt;
    const std::vector<SeqId> seqs = m.claim(n);
    std::vector<std::uint32_t> rest_tokens;
    for (std::uint32_t b = 0; b < n; ++b) {
      const auto prompt = std::span(prompts_).subspan(std::size_t{b} * len, len);
      prompt[0] = next_++;
      const std::uint32_t reused = m.match_prefix(seqs[b], prompt);
      rest_[b] = len - reused;
      rest_tokens.insert(rest_tokens.end(), prompt.begin() + reused, prompt.end());
    }
    m.fetch_into(batch_, seqs, rest_);
    m.step(seqs, rest_, rest_tokens);
    for (std::uint32_t t = 0; t < args_.steps; ++t) {
      std::fill(tokens_.begin(), tokens_.end(), t);
      m.fetch_into(batch_, seqs, ones_);
      m.step(seqs, ones_, tokens_);
    }
    for (SeqId s : seqs) m.release(s);
  }

  std::string name_;
  ManagerTierBenchArgs args_;
  std::unique_ptr<PagedKVCacheManager> manager_;
  std::vector<std::uint32_t> prompts_;  // one prompt per request of a batch
  std::vector<std::uint32_t> rest_, ones_, tokens_;
  KVCacheBatch batch_;
  std::uint32_t next_ = 1;
};

struct Figures {
  std::vector<double> ns, ratio;  // per round
};

std::string fmt(const char* f, double v) {
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

void report(const ManagerTierBenchArgs& a, std::vector<Subject>& subjects,
            const std::vector<Figures>& fig) {
  nlohmann::json j;
  Table t({"tiers", "ns/request", "over none", "min", "max", "pages offloaded", "dropped",
           "tier evictions"});
  for (std::size_t i = 0; i < subjects.size(); ++i) {
    const ManagerStats s = subjects[i].manager().stats();
    std::uint64_t offloaded = 0, dropped = 0, evictions = 0;
    for (const TierFigures& f : s.tiers) {
      offloaded += f.pages_offloaded;
      dropped += f.offload_dropped;
      evictions += f.evictions;
    }
    const Figures& f = fig[i];
    nlohmann::json row = {{"tiers", subjects[i].name()},
                          {"ns_per_request", median(f.ns)},
                          {"pages_offloaded", offloaded},
                          {"offload_dropped", dropped},
                          {"tier_evictions", evictions}};
    std::vector<std::string> cells(3, "-");  // the ratios, without "none" in the run
    if (!f.ratio.empty()) {
      const auto [lo, hi] = std::minmax_element(f.ratio.begin(), f.ratio.end());
      row["over_none"] = median(f.ratio);
      row["over_none_min"] = *lo;
      row["over_none_max"] = *hi;
      cells = {fmt("%.3f", median(f.ratio)), fmt("%.3f", *lo), fmt("%.3f", *hi)};
    }
    t.add_row({subjects[i].name(), fmt("%.0f", median(f.ns)), cells[0], cells[1], cells[2],
               with_commas(offloaded), with_commas(dropped), with_commas(evictions)});
    j["configs"].push_back(std::move(row));
  }
  j["page_size"] = a.page_size;
  j["prompt"] = a.prompt;
  j["steps"] = a.steps;
  j["requests"] = a.requests;
  j["repeats"] = a.repeats;
  j["batch"] = a.batch;
  j["admission"] = a.admit_reused ? "reused" : "every_page";
  if (a.json) {
    std::cout << j.dump(2) << '\n';
    return;
  }
  std::printf(
      "manager cost per request with tiers, nothing to load: %u-token prompt + %u decode "
      "steps, batches of %u, page size %u, admission %s, %u requests x %u rounds; CPU time of "
      "the calling thread (median of rounds; ratios: median of per-round ratios)\n",
      a.prompt, a.steps, a.batch, a.page_size, a.admit_reused ? "reused" : "every_page", a.requests,
      a.repeats);
  t.print(std::cout);
}

}  // namespace

void run_manager_tier_bench(const ManagerTierBenchArgs& a) {
  const BenchDir dir(a.disk_dir);
  std::vector<Subject> subjects;
  subjects.reserve(a.configs.size());
  for (const std::string& c : a.configs) subjects.emplace_back(c, a, dir);
  std::size_t base = subjects.size();  // "none", if listed: the ratios' denominator
  for (std::size_t i = 0; i < subjects.size(); ++i)
    if (subjects[i].name() == "none") base = i;
  for (Subject& s : subjects) s.run(a.requests);  // untimed: pools and tiers fill
  std::vector<Figures> fig(subjects.size());
  for (std::uint32_t round = 0; round < a.repeats; ++round) {
    std::vector<double> ns(subjects.size());
    for (std::size_t k = 0; k < subjects.size(); ++k) {
      const std::size_t i = (k + round) % subjects.size();  // rotate the order
      ns[i] = subjects[i].run(a.requests);
    }
    for (std::size_t i = 0; i < subjects.size(); ++i) {
      fig[i].ns.push_back(ns[i]);
      if (base != subjects.size()) fig[i].ratio.push_back(ns[i] / ns[base]);
    }
  }
  report(a, subjects, fig);
}

}  // namespace kvcache::tools
