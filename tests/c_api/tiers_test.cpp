// The C interface's storage tiers (kvcache/c_api.h "storage tiers"): pages
// the pool evicts written back to a host tier and to a disk tier, loaded back
// by kvc_match_prefix and read through kvc_batch_describe bit for bit equal
// to what kvc_store_kv wrote; pending loads refused by fetch / fork /
// truncate; a second manager on the disk tier's directory after a restart;
// events with their medium; per-tier figures; every bad argument refused by
// name with nothing made.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcache/c_api.h"
#include "tier/tier_test_util.h"

namespace {

using kvcache::tier_test::TempDir;

constexpr std::uint32_t kLayers = 3;
constexpr std::uint32_t kHeads = 2;
constexpr std::uint32_t kDim = 4;
constexpr std::uint32_t kPage = 4;

kvc_params tier_params(std::int32_t arrangement = KVC_ARRANGEMENT_INTERLEAVED) {
  kvc_params p{};
  p.dtype = KVC_DTYPE_F32;
  p.num_layers = kLayers;
  p.n_kv_heads = kHeads;
  p.head_dim = kDim;
  p.strategy = KVC_STRATEGY_PAGED;
  p.page_size = kPage;
  p.enable_prefix_caching = 1;
  p.page_layout = KVC_LAYOUT_NHD;
  p.pool_arrangement = arrangement;
  return p;
}

// A failure's text for the assertion message.
std::string describe(kvc_status s, const kvc_error& err) {
  return std::string(kvc_status_name(s)) + ": " + err.message;
}

// Calls fn(&err); expects `status` and a message containing every needle.
template <class F>
void expect_status(F&& fn, kvc_status status, std::initializer_list<std::string> needles) {
  kvc_error err{};
  const kvc_status got = fn(&err);
  EXPECT_EQ(got, status) << describe(got, err);
  EXPECT_EQ(err.status, got);
  const std::string msg = err.message;
  for (const auto& n : needles) {
    EXPECT_NE(msg.find(n), std::string::npos) << "message '" << msg << "' lacks '" << n << "'";
  }
}

struct Event {
  std::int32_t kind;
  std::string medium;
  std::uint64_t key_hi;
  std::uint64_t key_lo;
};

void record_event(const kvc_page_event* e, void* user) {
  static_cast<std::vector<Event>*>(user)->push_back({e->kind, e->medium, e->key_hi, e->key_lo});
}

std::size_t count(const std::vector<Event>& events, std::int32_t kind, const std::string& medium) {
  std::size_t n = 0;
  for (const Event& e : events) n += e.kind == kind && e.medium == medium;
  return n;
}

// A paged manager of `pages` pages over `tiers`, with its batch and events.
struct Rig {
  Rig(std::vector<kvc_tier*> tiers, std::uint32_t pages = 4,
      std::int32_t arrangement = KVC_ARRANGEMENT_INTERLEAVED)
      : params(tier_params(arrangement)) {
    kvc_prefix_config c = kvc_prefix_config_default();
    c.on_event = &record_event;
    c.user_data = &events;
    c.tiers = tiers.data();
    c.n_tiers = static_cast<std::uint32_t>(tiers.size());
    c.model_id = "model";
    kvc_error err{};
    const kvc_status s = kvc_manager_create_prefix(&params, pages, 4, 64, &c, &m, &err);
    EXPECT_EQ(s, KVC_OK) << describe(s, err);
    EXPECT_EQ(kvc_batch_create(&batch, &err), KVC_OK);
  }
  ~Rig() {
    kvc_batch_destroy(batch);
    kvc_manager_destroy(m);
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  kvc_params params;
  std::vector<Event> events;
  kvc_manager* m = nullptr;
  kvc_batch* batch = nullptr;
};

// K and V written for a sequence: [layer][kv][token][head][dim].
using Written = std::vector<float>;

std::size_t at(std::uint32_t layer, std::uint32_t kv, std::uint32_t tok, std::uint32_t head,
               std::uint32_t d, std::uint32_t tokens) {
  return (((std::size_t{layer} * 2 + kv) * tokens + tok) * kHeads + head) * kDim + d;
}

std::vector<std::uint32_t> iota_tokens(std::uint32_t n, std::uint32_t from) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = from + i;
  return t;
}

std::uint64_t claim(Rig& r) {
  std::uint64_t seq = 0;
  kvc_error err{};
  const kvc_status s = kvc_claim(r.m, 1, &seq, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return seq;
}

// Fetches room for every token of a fresh seq, stores random K and V with
// kvc_store_kv, commits them with their ids.
Written prefill(Rig& r, std::uint64_t seq, const std::vector<std::uint32_t>& tokens,
                std::mt19937& rng) {
  const auto n = static_cast<std::uint32_t>(tokens.size());
  kvc_error err{};
  kvc_status s = kvc_fetch(r.m, r.batch, &seq, &n, 1, 1, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  std::uniform_real_distribution<float> dist(-4, 4);
  Written w(std::size_t{kLayers} * 2 * n * kHeads * kDim);
  for (float& x : w) x = dist(rng);
  const std::uint32_t rows[2] = {0, n};
  for (std::uint32_t l = 0; l < kLayers; ++l) {
    s = kvc_store_kv(r.batch, l, &w[at(l, 0, 0, 0, 0, n)], &w[at(l, 1, 0, 0, 0, n)], rows, nullptr,
                     nullptr, &err);
    EXPECT_EQ(s, KVC_OK) << describe(s, err);
  }
  s = kvc_step(r.m, &seq, &n, 1, tokens.data(), &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return w;
}

// Tokens [0, upto) of seq (fetched for one new token) hold, bit for bit,
// what `w` (written for `total` tokens from position 0) says.
void expect_holds(Rig& r, std::uint64_t seq, const Written& w, std::uint32_t total,
                  std::uint32_t upto) {
  const std::uint32_t one = 1;
  kvc_error err{};
  kvc_status s = kvc_fetch(r.m, r.batch, &seq, &one, 1, 1, &err);
  ASSERT_EQ(s, KVC_OK) << describe(s, err);
  kvc_cache_desc d{};
  s = kvc_batch_describe(r.batch, &d, &err);
  ASSERT_EQ(s, KVC_OK) << describe(s, err);
  std::size_t differ = 0;
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (std::uint32_t kv = 0; kv < 2; ++kv)
      for (std::uint32_t t = 0; t < upto; ++t)
        for (std::uint32_t h = 0; h < kHeads; ++h)
          for (std::uint32_t e = 0; e < kDim; ++e) {
            const std::uint32_t block = d.lookup_table[t / d.page_size];
            const std::uint64_t off = l * d.layer_stride + kv * d.kv_stride +
                                      block * d.block_stride + (t % d.page_size) * d.token_stride +
                                      h * d.head_stride + e;
            const float* cache = static_cast<const float*>(d.blocks) + off;
            differ += std::memcmp(cache, &w[at(l, kv, t, h, e, total)], sizeof(float)) != 0;
          }
  EXPECT_EQ(differ, 0u) << "elements that differ from what was written";
}

// Writes prompt a (13 tokens: 3 full pages), releases it, then fills the
// 4-page pool with another request's 16 tokens so a's pages are evicted.
Written write_and_evict(Rig& r, const std::vector<std::uint32_t>& a, std::mt19937& rng) {
  kvc_error err{};
  const std::uint64_t s = claim(r);
  Written w = prefill(r, s, a, rng);
  EXPECT_EQ(kvc_release(r.m, s, KVC_REUSE_UNKNOWN, &err), KVC_OK) << err.message;
  const std::uint64_t other = claim(r);
  prefill(r, other, iota_tokens(16, 1000), rng);
  EXPECT_EQ(kvc_release(r.m, other, KVC_REUSE_UNKNOWN, &err), KVC_OK) << err.message;
  EXPECT_EQ(kvc_check_invariants(r.m, &err), KVC_OK) << err.message;
  return w;
}

std::int32_t pending(Rig& r, std::uint64_t seq) {
  std::int32_t p = -1;
  kvc_error err{};
  EXPECT_EQ(kvc_has_pending_loads(r.m, seq, &p, &err), KVC_OK) << err.message;
  return p;
}

std::uint32_t cache_length(Rig& r, std::uint64_t seq) {
  std::uint32_t n = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_cache_length(r.m, seq, &n, &err), KVC_OK) << err.message;
  return n;
}

// Matches a on a fresh seq: 12 tokens, pending, and fetch / fork / truncate
// refused naming the seq without changing its length.
std::uint64_t match_pending(Rig& r, const std::vector<std::uint32_t>& a) {
  const std::uint64_t c = claim(r);
  std::uint32_t reused = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_match_prefix(r.m, c, a.data(), a.size(), 0, &reused, &err), KVC_OK) << err.message;
  EXPECT_EQ(reused, 12u);
  EXPECT_EQ(pending(r, c), 1);
  const std::string name = "seq " + std::to_string(c);
  const std::uint32_t one = 1;
  expect_status([&](kvc_error* e) { return kvc_fetch(r.m, r.batch, &c, &one, 1, 1, e); },
                KVC_INVALID_ARGUMENT, {name, "pending loads"});
  std::uint64_t child = 0;
  expect_status([&](kvc_error* e) { return kvc_fork(r.m, c, &child, e); }, KVC_INVALID_ARGUMENT,
                {name, "pending loads"});
  expect_status([&](kvc_error* e) { return kvc_truncate(r.m, c, 4, e); }, KVC_INVALID_ARGUMENT,
                {name, "pending loads"});
  EXPECT_EQ(cache_length(r, c), 12u) << "the refused calls changed nothing";
  EXPECT_EQ(pending(r, c), 1);
  return c;
}

std::vector<kvc_tier_figures> figures(Rig& r, std::uint32_t* pending_loads = nullptr) {
  std::uint32_t n = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_manager_tier_figures(r.m, nullptr, 0, &n, pending_loads, &err), KVC_OK);
  std::vector<kvc_tier_figures> f(n);
  EXPECT_EQ(kvc_manager_tier_figures(r.m, f.data(), n, &n, pending_loads, &err), KVC_OK)
      << err.message;
  return f;
}

kvc_tier* host_tier(const kvc_params& p, bool synchronous, const char* model = "model") {
  kvc_host_tier_options o = kvc_host_tier_options_default();
  o.synchronous = synchronous ? 1 : 0;
  std::uint64_t page_bytes = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_tier_page_bytes(&p, &page_bytes, &err), KVC_OK) << err.message;
  kvc_tier* t = nullptr;
  const kvc_status s = kvc_host_tier_create(&p, model, nullptr, 64 * page_bytes, &o, &t, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return t;
}

kvc_tier* disk_tier(const kvc_params& p, const std::string& dir, std::int32_t io) {
  kvc_disk_tier_options o = kvc_disk_tier_options_default();
  o.io = io;
  o.slab_bytes = 1 << 20;
  kvc_tier* t = nullptr;
  kvc_error err{};
  const kvc_status s =
      kvc_disk_tier_create(&p, "model", "", dir.c_str(), KVC_TIER_UNLIMITED, &o, &t, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return t;
}

class CTierRoundTrip : public ::testing::TestWithParam<std::int32_t> {};

INSTANTIATE_TEST_SUITE_P(Arrangements, CTierRoundTrip,
                         ::testing::Values(KVC_ARRANGEMENT_INTERLEAVED, KVC_ARRANGEMENT_PER_LAYER),
                         [](const auto& info) {
                           return info.param == KVC_ARRANGEMENT_INTERLEAVED ? "interleaved"
                                                                            : "per_layer";
                         });

TEST_P(CTierRoundTrip, HostTierWriteBackAndReloadByteExact) {
  const kvc_params p = tier_params(GetParam());
  kvc_tier* host = host_tier(p, /*synchronous=*/true);
  ASSERT_NE(host, nullptr);
  EXPECT_STREQ(kvc_tier_name(host), "host");
  Rig r({host}, 4, GetParam());
  kvc_tier_destroy(host);  // the manager keeps its own reference
  std::mt19937 rng(1);
  const auto a = iota_tokens(13, 7);
  const Written w = write_and_evict(r, a, rng);

  const std::uint64_t c = match_pending(r, a);
  std::uint32_t loading = 0;
  EXPECT_EQ(figures(r, &loading).size(), 1u);
  EXPECT_EQ(loading, 3u);
  std::vector<std::uint64_t> ready(4, 99);
  std::uint32_t n = 0;
  kvc_error err{};
  ASSERT_EQ(kvc_poll_loads(r.m, ready.data(), 4, &n, &err), KVC_OK) << err.message;
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(ready[0], c);
  EXPECT_EQ(pending(r, c), 0);
  EXPECT_EQ(cache_length(r, c), 12u);
  expect_holds(r, c, w, 13, 12);
  EXPECT_EQ(kvc_check_invariants(r.m, &err), KVC_OK) << err.message;

  const std::vector<kvc_tier_figures> f = figures(r, &loading);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_STREQ(f[0].name, "host");
  EXPECT_EQ(f[0].enabled, 1);
  EXPECT_EQ(f[0].pages_onboarded, 3u);
  EXPECT_EQ(f[0].pages_loaded, 3u);
  EXPECT_EQ(f[0].load_failures, 0u);
  EXPECT_GE(f[0].pages_offloaded, 3u);
  EXPECT_EQ(loading, 0u);
  EXPECT_EQ(count(r.events, KVC_PAGE_STORED, "host"), f[0].pages_offloaded);
  EXPECT_GE(count(r.events, KVC_PAGE_REMOVED, "device"), 3u);
  for (const Event& e : r.events) {
    EXPECT_TRUE(e.key_hi != 0 || e.key_lo != 0) << "with tiers every event carries its key";
  }
}

TEST(CTier, DiskTierWriteBackReloadAndRestart) {
  TempDir dir;
  const kvc_params p = tier_params();
  std::mt19937 rng(2);
  const auto a = iota_tokens(13, 7);
  Written w;
  {
    kvc_tier* disk = disk_tier(p, dir.path.string(), KVC_DISK_IO_AUTOMATIC);
    ASSERT_NE(disk, nullptr);
    EXPECT_STREQ(kvc_tier_name(disk), "disk");
    Rig r({disk}, 4);
    w = write_and_evict(r, a, rng);
    kvc_error err{};
    ASSERT_EQ(kvc_wait_tiers(r.m, &err), KVC_OK) << err.message;
    kvc_tier_stats st{};
    ASSERT_EQ(kvc_tier_stats_get(disk, &st, &err), KVC_OK) << err.message;
    EXPECT_GE(st.pages_stored, 3u);
    EXPECT_EQ(st.io_errors, 0u);
    EXPECT_EQ(st.capacity_bytes, KVC_TIER_UNLIMITED);

    const std::uint64_t c = match_pending(r, a);
    ASSERT_EQ(kvc_wait_loads(r.m, c, &err), KVC_OK) << err.message;
    EXPECT_EQ(pending(r, c), 0);
    expect_holds(r, c, w, 13, 12);
    EXPECT_EQ(count(r.events, KVC_PAGE_STORED, "disk"), st.pages_stored);

    // The directory is locked while this tier lives.
    kvc_tier* second = nullptr;
    expect_status(
        [&](kvc_error* e) {
          return kvc_disk_tier_create(&p, "model", "", dir.path.c_str(), KVC_TIER_UNLIMITED,
                                      nullptr, &second, e);
        },
        KVC_INVALID_ARGUMENT, {dir.path.string()});
    EXPECT_EQ(second, nullptr);
    ASSERT_EQ(kvc_wait_tiers(r.m, &err), KVC_OK) << err.message;
    kvc_tier_destroy(disk);
  }
  // A restart: a new tier on the directory finds the pages, a new manager loads them.
  kvc_tier* disk = disk_tier(p, dir.path.string(), KVC_DISK_IO_THREADS);
  ASSERT_NE(disk, nullptr);
  kvc_disk_tier_info info{};
  kvc_error err{};
  ASSERT_EQ(kvc_disk_tier_info_get(disk, &info, &err), KVC_OK) << err.message;
  EXPECT_EQ(info.fresh, 0);
  EXPECT_GE(info.pages_recovered, 3u);
  EXPECT_EQ(info.io, KVC_DISK_IO_THREADS);
  EXPECT_GT(info.slot_bytes, 0u);
  Rig r({disk}, 4);
  kvc_tier_destroy(disk);
  const std::uint64_t c = match_pending(r, a);
  ASSERT_EQ(kvc_wait_loads(r.m, c, &err), KVC_OK) << err.message;
  EXPECT_EQ(cache_length(r, c), 12u);
  expect_holds(r, c, w, 13, 12);
  const std::vector<kvc_tier_figures> f = figures(r);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_STREQ(f[0].name, "disk");
  EXPECT_EQ(f[0].pages_onboarded, 3u);
}

TEST(CTier, DefaultsAreTheCppOnes) {
  const kvc_prefix_config c = kvc_prefix_config_default();
  EXPECT_EQ(c.policy, KVC_EVICT_ADAPTIVE);
  EXPECT_EQ(c.tiers, nullptr);
  EXPECT_EQ(c.n_tiers, 0u);
  EXPECT_EQ(c.admission, KVC_ADMIT_EVERY_PAGE);
  EXPECT_EQ(c.staging_pages, 16u);
  const kvc_host_tier_options h = kvc_host_tier_options_default();
  EXPECT_EQ(h.threads, 2u);
  EXPECT_EQ(h.synchronous, 0);
  EXPECT_EQ(h.huge_pages, 1);
  EXPECT_EQ(h.checksums, 0);
  EXPECT_EQ(h.chunk_bytes, std::uint64_t{256} << 20);
  const kvc_disk_tier_options d = kvc_disk_tier_options_default();
  EXPECT_EQ(d.io, KVC_DISK_IO_AUTOMATIC);
  EXPECT_EQ(d.direct_io, 1);
  EXPECT_EQ(d.durable, 1);
  EXPECT_EQ(d.threads, 2u);
  EXPECT_EQ(d.queue_depth, 32u);
  EXPECT_EQ(d.max_consecutive_errors, 8u);
  EXPECT_EQ(d.slab_bytes, std::uint64_t{1} << 30);
  EXPECT_EQ(d.compact_min_records, 4096u);
  std::uint64_t bytes = 0;
  const kvc_params p = tier_params();
  ASSERT_EQ(kvc_tier_page_bytes(&p, &bytes, nullptr), KVC_OK);
  EXPECT_EQ(bytes, std::uint64_t{2} * kLayers * kPage * kHeads * kDim * sizeof(float));
}

TEST(CTier, NoTiersMeansNoFiguresAndNothingPending) {
  Rig r({});
  std::uint32_t n = 7, loading = 7;
  kvc_error err{};
  ASSERT_EQ(kvc_manager_tier_figures(r.m, nullptr, 0, &n, &loading, &err), KVC_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(loading, 0u);
  const std::uint64_t s = claim(r);
  EXPECT_EQ(pending(r, s), 0);
  ASSERT_EQ(kvc_poll_loads(r.m, nullptr, 0, &n, &err), KVC_OK) << err.message;
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(kvc_wait_loads(r.m, s, &err), KVC_OK);
  EXPECT_EQ(kvc_wait_tiers(r.m, &err), KVC_OK);
}

TEST(CTier, BadTierArgumentsAreRefusedByName) {
  const kvc_params p = tier_params();
  kvc_tier* t = nullptr;
  const auto host = [&](const kvc_params* params, std::uint64_t cap,
                        const kvc_host_tier_options* o) {
    return [=, &t](kvc_error* e) { return kvc_host_tier_create(params, "m", "", cap, o, &t, e); };
  };
  expect_status(host(nullptr, 1 << 20, nullptr), KVC_INVALID_ARGUMENT, {"params is NULL"});
  kvc_params continuous = p;
  continuous.strategy = KVC_STRATEGY_CONTINUOUS;
  continuous.page_size = 0;
  continuous.enable_prefix_caching = 0;
  expect_status(host(&continuous, 1 << 20, nullptr), KVC_INVALID_ARGUMENT, {"KVC_STRATEGY_PAGED"});
  kvc_params bad_dtype = p;
  bad_dtype.dtype = 9;
  expect_status(host(&bad_dtype, 1 << 20, nullptr), KVC_INVALID_ARGUMENT,
                {"params->dtype value 9"});
  kvc_host_tier_options o = kvc_host_tier_options_default();
  o.threads = 0;
  expect_status(host(&p, 1 << 20, &o), KVC_INVALID_ARGUMENT, {"threads is 0"});
  o.threads = 5000;
  expect_status(host(&p, 1 << 20, &o), KVC_INVALID_ARGUMENT, {"options->threads is 5000"});
  o = kvc_host_tier_options_default();
  o.checksums = 2;
  expect_status(host(&p, 1 << 20, &o), KVC_INVALID_ARGUMENT, {"options->checksums is 2"});
  expect_status(
      [&](kvc_error* e) { return kvc_host_tier_create(&p, "m", "", 1, nullptr, nullptr, e); },
      KVC_INVALID_ARGUMENT, {"out is NULL"});
  EXPECT_EQ(t, nullptr) << "no refused call made a tier";

  TempDir dir;
  const auto disk = [&](const char* path, const kvc_disk_tier_options* opt) {
    return [=, &t, &p](kvc_error* e) {
      return kvc_disk_tier_create(&p, "m", "", path, KVC_TIER_UNLIMITED, opt, &t, e);
    };
  };
  expect_status(disk(nullptr, nullptr), KVC_INVALID_ARGUMENT, {"dir is NULL"});
  expect_status(disk("", nullptr), KVC_INVALID_ARGUMENT, {"dir is empty"});
  kvc_disk_tier_options d = kvc_disk_tier_options_default();
  d.io = 7;
  expect_status(disk(dir.path.c_str(), &d), KVC_INVALID_ARGUMENT, {"options->io value 7"});
  d = kvc_disk_tier_options_default();
  d.queue_depth = 0;
  expect_status(disk(dir.path.c_str(), &d), KVC_INVALID_ARGUMENT, {"queue_depth 0"});
  d = kvc_disk_tier_options_default();
  d.durable = -1;
  expect_status(disk(dir.path.c_str(), &d), KVC_INVALID_ARGUMENT, {"options->durable is -1"});
  expect_status(disk("/proc/kvcache-no-such-dir", nullptr), KVC_INVALID_ARGUMENT,
                {"/proc/kvcache-no-such-dir"});
  EXPECT_EQ(t, nullptr);

  kvc_tier_stats st{};
  expect_status([&](kvc_error* e) { return kvc_tier_stats_get(nullptr, &st, e); },
                KVC_INVALID_ARGUMENT, {"tier is NULL"});
  kvc_tier* h = host_tier(p, true);
  expect_status([&](kvc_error* e) { return kvc_tier_stats_get(h, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"out is NULL"});
  kvc_disk_tier_info info{};
  expect_status([&](kvc_error* e) { return kvc_disk_tier_info_get(h, &info, e); },
                KVC_INVALID_ARGUMENT, {"'host' tier, not a disk tier"});
  EXPECT_EQ(kvc_tier_name(nullptr), nullptr);
  kvc_tier_destroy(h);
  kvc_tier_destroy(nullptr);
}

TEST(CTier, BadTierConfigurationsMakeNoManager) {
  const kvc_params p = tier_params();
  kvc_tier* host = host_tier(p, true);
  kvc_manager* m = nullptr;
  const auto create = [&](const kvc_prefix_config& c) {
    return [&m, &p, c](kvc_error* e) { return kvc_manager_create_prefix(&p, 4, 4, 64, &c, &m, e); };
  };
  kvc_prefix_config c = kvc_prefix_config_default();
  c.n_tiers = 1;
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"config->tiers is NULL with 1 elements"});
  kvc_tier* with_null[2] = {host, nullptr};
  c.tiers = with_null;
  c.n_tiers = 2;
  c.model_id = "model";
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"config->tiers[1] is NULL"});
  c.n_tiers = 1;
  c.admission = 5;
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"config->admission value 5"});
  c.admission = KVC_ADMIT_REUSED;
  c.staging_pages = 0;
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"staging_pages is 0"});
  c.staging_pages = 16;
  c.model_id = "other";
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"model_id", "'model'", "'other'"});
  c.model_id = "model";
  c.cache_salt = "tenant";
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"cache_salt"});
  EXPECT_EQ(m, nullptr) << "no refused call made a manager";
  c.cache_salt = nullptr;
  kvc_error err{};
  ASSERT_EQ(create(c)(&err), KVC_OK) << err.message;
  kvc_manager_destroy(m);
  kvc_tier_destroy(host);
}

TEST(CTier, BadPendingLoadCallsAreRefused) {
  kvc_tier* host = host_tier(tier_params(), true);
  Rig r({host});
  kvc_tier_destroy(host);
  std::int32_t p = 0;
  expect_status([&](kvc_error* e) { return kvc_has_pending_loads(r.m, 42, &p, e); },
                KVC_UNKNOWN_SEQUENCE, {"seq 42"});
  expect_status([&](kvc_error* e) { return kvc_has_pending_loads(r.m, 0, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"pending is NULL"});
  expect_status([&](kvc_error* e) { return kvc_wait_loads(r.m, 42, e); }, KVC_UNKNOWN_SEQUENCE,
                {"seq 42"});
  std::uint64_t ids[3];
  std::uint32_t n = 0;
  expect_status([&](kvc_error* e) { return kvc_poll_loads(r.m, ids, 3, &n, e); },
                KVC_INVALID_ARGUMENT, {"seq_ids holds 3", "max_batch_size (4)"});
  expect_status([&](kvc_error* e) { return kvc_poll_loads(r.m, nullptr, 3, &n, e); },
                KVC_INVALID_ARGUMENT, {"seq_ids is NULL with 3"});
  expect_status([&](kvc_error* e) { return kvc_poll_loads(r.m, ids, 4, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"count is NULL"});
  expect_status([&](kvc_error* e) { return kvc_wait_tiers(nullptr, e); }, KVC_INVALID_ARGUMENT,
                {"manager is NULL"});
  kvc_tier_figures f[1];
  expect_status([&](kvc_error* e) { return kvc_manager_tier_figures(r.m, f, 0, &n, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"figures holds 0 entries", "1 tiers"});
  EXPECT_EQ(n, 1u) << "the count is set even when the figures do not fit";
  expect_status(
      [&](kvc_error* e) { return kvc_manager_tier_figures(r.m, nullptr, 2, &n, nullptr, e); },
      KVC_INVALID_ARGUMENT, {"figures is NULL with cap 2"});

  kvc_params cp = tier_params();
  cp.strategy = KVC_STRATEGY_CONTINUOUS;
  cp.page_size = 0;
  cp.enable_prefix_caching = 0;
  kvc_manager* cm = nullptr;
  kvc_error err{};
  ASSERT_EQ(kvc_manager_create(&cp, 0, 2, 16, &cm, &err), KVC_OK) << err.message;
  expect_status([&](kvc_error* e) { return kvc_poll_loads(cm, nullptr, 0, &n, e); },
                KVC_INVALID_ARGUMENT, {"kvc_poll_loads needs the paged strategy"});
  ASSERT_EQ(kvc_manager_tier_figures(cm, nullptr, 0, &n, nullptr, &err), KVC_OK);
  EXPECT_EQ(n, 0u);
  kvc_manager_destroy(cm);
}

}  // namespace
