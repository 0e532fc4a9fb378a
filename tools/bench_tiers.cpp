// tools/bench_tiers.cpp — `kvcache bench tiers`: store / load bandwidth of
// the host and disk tiers for N pages of one geometry, beside a memcpy of
// the same bytes and a sequential O_DIRECT read of a file of the same size,
// measured in the same run (docs/tiers.md has figures).
//
// Each tier holds exactly N pages; two key sets over the same bytes take
// turns, so every timed store evicts the other set (steady state: memory
// touched, slabs preallocated) and every timed load reads the set stored
// last. The figures are medians of --repeats.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>

#include "bench.h"
#include "bench_harness.h"
#include "kvcache/disk_tier.h"
#include "kvcache/host_tier.h"
#include "table.h"

namespace kvcache::tools {

namespace {

struct TiersArgs {
  std::string dtype = "bf16";
  std::uint32_t layers = 32;
  std::uint32_t kv_heads = 8;
  std::uint32_t head_dim = 128;
  std::uint32_t page_size = 16;
  std::uint32_t pages = 64;
  std::size_t threads = 2;
  std::uint32_t repeats = 3;
  std::string dir;
  std::string tiers = "host,host-checksums,disk-io_uring,disk-threads";
  bool json = false;
};

constexpr std::uint64_t kMaxBenchTierBytes = std::uint64_t{1} << 36;  // 64 GiB of pages

double gbps(std::uint64_t bytes, double seconds) { return bytes / seconds / 1e9; }

// Two key sets (token chains) over the same page bytes.
struct Workload {
  TierFingerprint fp;
  std::size_t n = 0;
  std::unique_ptr<Buffer> src, dst;
  std::vector<std::vector<std::uint32_t>> tokens[2];
  std::vector<PageKey> keys[2];

  Workload(TierFingerprint f, std::size_t pages) : fp(std::move(f)), n(pages) {
    const std::size_t pb = fp.page_bytes();
    src = std::make_unique<Buffer>(n * pb, true);
    dst = std::make_unique<Buffer>(n * pb, true);
    std::mt19937 rng(7);
    auto* s = static_cast<std::uint32_t*>(src->p);
    for (std::size_t i = 0; i < n * pb / 4; ++i) s[i] = rng() | 0x01010101u;
    std::memset(dst->p, 0, n * pb);
    for (int set = 0; set < 2; ++set) {
      PageKey parent{};
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<std::uint32_t> t(fp.page_size);
        for (auto& x : t) x = rng() % 128000;
        parent = page_key(parent, t, fp.digest());
        keys[set].push_back(parent);
        tokens[set].push_back(std::move(t));
      }
    }
  }
  std::byte* page(Buffer& b, std::size_t i) const {
    return static_cast<std::byte*>(b.p) + i * fp.page_bytes();
  }
  std::vector<PageWrite> writes(int set) const {
    std::vector<PageWrite> w;
    for (std::size_t i = 0; i < n; ++i) {
      w.push_back({keys[set][i], tokens[set][i], {page(*src, i), fp.page_bytes()}});
    }
    return w;
  }
  std::vector<PageRead> reads(int set) const {
    std::vector<PageRead> r;
    for (std::size_t i = 0; i < n; ++i) {
      r.push_back({keys[set][i], tokens[set][i], {page(*dst, i), fp.page_bytes()}});
    }
    return r;
  }
};

double time_memcpy(const Workload& w, std::uint32_t repeats) {
  const std::size_t bytes = w.n * w.fp.page_bytes();
  std::memcpy(w.dst->p, w.src->p, bytes);  // touch both
  return bench::median(bench::time_calls(repeats, [&](std::size_t) {
    for (std::size_t i = 0; i < w.n; ++i) {
      std::memcpy(w.page(*w.dst, i), w.page(*w.src, i), w.fp.page_bytes());
    }
  }));
}

// A file of `bytes` read front to back in 1 MiB O_DIRECT reads (buffered,
// with the cache dropped first, where the filesystem refuses O_DIRECT).
nlohmann::json time_sequential_read(const std::filesystem::path& dir, std::uint64_t bytes,
                                    std::uint32_t repeats) {
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  const std::filesystem::path path = dir / "sequential.bin";
  const std::uint64_t size = (bytes + kChunk - 1) / kChunk * kChunk;
  Buffer chunk(kChunk, false);
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw InvalidArgument("bench tiers: cannot create " + path.string());
    for (std::uint64_t off = 0; off < size; off += kChunk) {
      if (::pwrite(fd, chunk.p, kChunk, static_cast<off_t>(off)) != static_cast<ssize_t>(kChunk)) {
        ::close(fd);
        throw InvalidArgument("bench tiers: cannot write " + path.string());
      }
    }
    ::fsync(fd);
    ::close(fd);
  }
  bool direct = true;
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    direct = false;
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  const double t = bench::median(bench::time_calls(repeats, [&](std::size_t) {
    if (!direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    for (std::uint64_t off = 0; off < size; off += kChunk) {
      if (::pread(fd, chunk.p, kChunk, static_cast<off_t>(off)) <= 0) break;
    }
  }));
  ::close(fd);
  std::filesystem::remove(path);
  return {{"gbps", gbps(size, t)}, {"direct", direct}, {"bytes", size}};
}

nlohmann::json time_tier(Tier& tier, const Workload& w, std::uint32_t repeats) {
  const std::uint64_t bytes = w.n * w.fp.page_bytes();
  int set = 0;
  tier.store(w.writes(set)).wait();  // warm-up: memory touched, slabs made
  bool stored_ok = true;
  const double ts = bench::median(bench::time_calls(repeats, [&](std::size_t) {
    set ^= 1;
    const TierTicket t = tier.store(w.writes(set));
    for (StoreResult r : t.store_results()) stored_ok = stored_ok && r == StoreResult::stored;
  }));
  bool loaded_ok = true;
  const double tl = bench::median(bench::time_calls(repeats, [&](std::size_t) {
    const TierTicket t = tier.load(w.reads(set));
    for (LoadResult r : t.load_results()) loaded_ok = loaded_ok && r == LoadResult::loaded;
  }));
  const bool exact = std::memcmp(w.dst->p, w.src->p, bytes) == 0;
  std::memset(w.dst->p, 0, bytes);
  const TierStats s = tier.stats();
  return {{"tier", std::string(tier.name())},
          {"store_gbps", gbps(bytes, ts)},
          {"load_gbps", gbps(bytes, tl)},
          {"check_ok", stored_ok && loaded_ok && exact},
          {"mean_load_ms", s.pages_loaded ? s.load_nanoseconds / 1e6 / s.pages_loaded : 0.0}};
}

TierFingerprint fingerprint_of(const TiersArgs& a) {
  TierFingerprint f;
  f.dtype = parse_dtype(a.dtype);
  f.layer_end = a.layers;
  f.n_kv_heads = a.kv_heads;
  f.head_dim = a.head_dim;
  f.page_size = a.page_size;
  f.model_id = "bench";
  const std::size_t pb = f.page_bytes();
  if (pb == 0) throw InvalidArgument("bench tiers: a page of this geometry has 0 bytes");
  if (a.pages == 0) throw InvalidArgument("--pages must be at least 1");
  if (a.repeats == 0) throw InvalidArgument("--repeats must be at least 1");
  if (a.threads == 0 || a.threads > 64) {
    throw InvalidArgument("--threads " + std::to_string(a.threads) + " is not in range 1 to 64");
  }
  const unsigned __int128 total = static_cast<unsigned __int128>(pb) * a.pages;
  if (total > kMaxBenchTierBytes) {
    throw InvalidArgument("--pages " + std::to_string(a.pages) + " x " + std::to_string(pb) +
                          " bytes a page is past the limit of " +
                          std::to_string(kMaxBenchTierBytes) + " bytes");
  }
  return f;
}

std::vector<std::string> parse_tiers(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string t; std::getline(ss, t, ',');) {
    if (t != "host" && t != "host-checksums" && t != "disk-io_uring" && t != "disk-threads") {
      throw InvalidArgument("--tiers: '" + t +
                            "' is not host, host-checksums, disk-io_uring or disk-threads");
    }
    out.push_back(t);
  }
  return out;
}

// A directory for the run: --dir, or a fresh one under the system's temp dir.
struct RunDir {
  std::filesystem::path path;
  bool owned = false;
  explicit RunDir(const std::string& dir) {
    if (!dir.empty()) {
      path = dir;
      std::filesystem::create_directories(path);
      return;
    }
    std::string t = (std::filesystem::temp_directory_path() / "kvcache-bench-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw InvalidArgument("bench tiers: mkdtemp failed");
    path = t;
    owned = true;
  }
  ~RunDir() {
    std::error_code ec;
    if (owned) std::filesystem::remove_all(path, ec);
  }
};

nlohmann::json bench_tiers(const TiersArgs& a) {
  const TierFingerprint fp = fingerprint_of(a);
  const std::vector<std::string> tiers = parse_tiers(a.tiers);
  RunDir run(a.dir);
  Workload w(fp, a.pages);
  const std::uint64_t bytes = w.n * fp.page_bytes();
  const double memcpy_gbps = gbps(bytes, time_memcpy(w, a.repeats));
  const nlohmann::json seq = time_sequential_read(run.path, bytes, a.repeats);
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& t : tiers) {
    nlohmann::json row;
    if (t == "host" || t == "host-checksums") {
      HostTierOptions o;
      o.threads = a.threads;
      o.checksums = t == "host-checksums";
      HostTier tier(fp, bytes, o);
      row = time_tier(tier, w, a.repeats);
      row["io"] = "memory";
    } else {
      DiskTierOptions o;
      o.threads = a.threads;
      o.io = t == "disk-io_uring" ? DiskIo::io_uring : DiskIo::threads;
      const std::filesystem::path d = run.path / t;
      std::filesystem::remove_all(d);
      {
        DiskTier tier(fp, d, bytes, o);
        row = time_tier(tier, w, a.repeats);
        row["io"] = std::string(tier.io_backend());
        row["direct_io"] = tier.direct_io();
      }
      std::filesystem::remove_all(d);
    }
    row["name"] = t;
    row["store_over_memcpy"] = row["store_gbps"].get<double>() / memcpy_gbps;
    row["load_over_memcpy"] = row["load_gbps"].get<double>() / memcpy_gbps;
    row["load_over_sequential_read"] = row["load_gbps"].get<double>() / seq["gbps"].get<double>();
    rows.push_back(row);
  }
  return {{"bench", "tiers"},
          {"dtype", std::string(dtype_name(fp.dtype))},
          {"layers", a.layers},
          {"kv_heads", a.kv_heads},
          {"head_dim", a.head_dim},
          {"page_size", a.page_size},
          {"page_bytes", fp.page_bytes()},
          {"pages", a.pages},
          {"bytes", bytes},
          {"threads", a.threads},
          {"repeats", a.repeats},
          {"memcpy_gbps", memcpy_gbps},
          {"sequential_read_gbps", seq["gbps"]},
          {"sequential_read_direct", seq["direct"]},
          {"tiers", rows}};
}

std::string fixed(double v, int digits = 2) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void print_tiers_table(const nlohmann::json& j, std::ostream& os) {
  os << "bench tiers: " << j["pages"].get<std::uint32_t>() << " pages of "
     << format_bytes(j["page_bytes"].get<std::uint64_t>()) << " ("
     << format_bytes(j["bytes"].get<std::uint64_t>()) << "), " << j["threads"].get<std::size_t>()
     << " tier threads, median of " << j["repeats"].get<std::uint32_t>() << "\n";
  os << "  memcpy " << fixed(j["memcpy_gbps"].get<double>()) << " GB/s, sequential "
     << (j["sequential_read_direct"].get<bool>() ? "O_DIRECT" : "buffered") << " read "
     << fixed(j["sequential_read_gbps"].get<double>()) << " GB/s\n\n";
  Table t({"tier", "io", "store GB/s", "load GB/s", "store/memcpy", "load/memcpy", "load/seq read",
           "check"});
  for (const auto& r : j["tiers"]) {
    t.add_row({r["name"].get<std::string>(), r["io"].get<std::string>(),
               fixed(r["store_gbps"].get<double>()), fixed(r["load_gbps"].get<double>()),
               fixed(r["store_over_memcpy"].get<double>()),
               fixed(r["load_over_memcpy"].get<double>()),
               fixed(r["load_over_sequential_read"].get<double>()),
               r["check_ok"].get<bool>() ? "ok" : "FAILED"});
  }
  t.print(os);
}

}  // namespace

void add_bench_tiers_command(CLI::App* bench) {
  auto a = std::make_shared<TiersArgs>();
  CLI::App* c = bench->add_subcommand(
      "tiers", "Host and disk tier store/load vs memcpy and a sequential O_DIRECT read");
  c->add_option("--dtype", a->dtype, "Cache element type: " + std::string(kDTypeNames))
      ->capture_default_str();
  c->add_option("--layers", a->layers, "Layers in a page")->capture_default_str();
  c->add_option("--kv-heads", a->kv_heads, "KV heads")->capture_default_str();
  c->add_option("--head-dim", a->head_dim, "Head dimension")->capture_default_str();
  c->add_option("--page-size", a->page_size, "Tokens per page")->capture_default_str();
  c->add_option("--pages", a->pages, "Pages stored and loaded per call")->capture_default_str();
  c->add_option("--threads", a->threads, "Worker threads of each tier")->capture_default_str();
  c->add_option("--repeats", a->repeats, "Timed calls (the median is reported)")
      ->capture_default_str();
  c->add_option("--dir", a->dir, "Directory for the disk tiers (default: a fresh temp dir)");
  c->add_option("--tiers", a->tiers,
                "Comma list of host, host-checksums, disk-io_uring, disk-threads")
      ->capture_default_str();
  c->add_flag("--json", a->json, "Print one JSON object instead of the table");
  c->callback([a] {
    const nlohmann::json j = bench_tiers(*a);
    if (a->json) {
      std::cout << j.dump() << '\n';
    } else {
      print_tiers_table(j, std::cout);
    }
  });
}

}  // namespace kvcache::tools
