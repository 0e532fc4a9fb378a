// python/tiers.cpp — the storage tiers below the paged pool for Python
// (docs/tiers.md, docs/python.md "Storage tiers"): kvcache.Tier, the base,
// and kvcache.HostTier / kvcache.DiskTier (keyword constructors, reprs,
// stats()); the PagedKVCacheManager keywords tiers, model_id, cache_salt,
// admission, staging_pages (tier_config), offload_batch, offload_delay_us
// (offload_batching); its methods has_pending_loads,
// poll_loads, wait_loads, wait_tiers (the GIL released while they run); a
// manager's stats() as a dict (stats_dict), its "tiers" one dict per tier.
//
// Ownership: a tier is held by a shared_ptr, which the Python object and
// every manager configured with it share, so a tier lives as long as either.
// Its deleter releases the GIL (when this thread holds it and the
// interpreter is not finalizing) while the tier finishes its queued work and
// joins its threads: a tier thread may be waiting for the GIL to log through
// a Python log handler.
#include <chrono>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kvcache/disk_tier.h"
#include "kvcache/host_tier.h"
#include "py_common.h"

namespace kvcache::python {

namespace {

// Worker threads a tier may be asked for (as kvcache.ThreadPool).
constexpr std::uint32_t kMaxTierThreads = 1024;
// Tiers below one manager (the constructor refuses more).
constexpr std::uint32_t kMaxTiers = 8;

bool interpreter_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() != 0 && Py_IsFinalizing() == 0;
#else
  return Py_IsInitialized() != 0 && _Py_IsFinalizing() == 0;
#endif
}

template <class T>
std::shared_ptr<T> share(std::unique_ptr<T> tier) {
  return std::shared_ptr<T>(tier.release(), [](T* t) {
    if (interpreter_usable() && PyGILState_Check() != 0) {
      py::gil_scoped_release released;
      delete t;
    } else {
      delete t;
    }
  });
}

std::string to_str(const py::handle& obj, const char* what) {
  if (!py::isinstance<py::str>(obj)) {
    throw InvalidArgument(std::string(what) + " must be a str, got " +
                          py::str(py::type::of(obj)).cast<std::string>());
  }
  return obj.cast<std::string>();
}

// The fingerprint of a tier for the params, model id and salt.
TierFingerprint fingerprint(const KVCacheParams& p, const py::handle& model_id,
                            const py::handle& cache_salt) {
  if (p.cache_strategy != CacheStrategy::paged) {
    throw InvalidArgument(
        "params.cache_strategy is 'continuous'; a tier holds pages of the paged strategy");
  }
  if (p.num_layers == 0) {
    throw InvalidArgument("params.num_layers is unset: a tier needs it (pass it to KVCacheParams)");
  }
  return TierFingerprint::of(p, to_str(model_id, "model_id"), to_str(cache_salt, "cache_salt"));
}

// capacity_bytes, or capacity_pages pages, or `neither` when both are None.
std::uint64_t capacity(const TierFingerprint& f, const py::object& bytes, const py::object& pages,
                       std::uint64_t neither) {
  if (!bytes.is_none() && !pages.is_none()) {
    throw InvalidArgument("pass capacity_bytes or capacity_pages, not both");
  }
  if (!bytes.is_none()) return to_u64(bytes, "capacity_bytes");
  if (pages.is_none()) return neither;
  const std::uint64_t n = to_u64(pages, "capacity_pages");
  const std::uint64_t page = f.page_bytes();
  if (page != 0 && n > std::numeric_limits<std::uint64_t>::max() / page) {
    throw InvalidArgument("capacity_pages " + std::to_string(n) + " of " + std::to_string(page) +
                          " bytes is past 2^64 bytes");
  }
  return n * page;
}

std::size_t threads(const py::handle& obj) {
  const std::uint32_t n = to_u32(obj, "threads");
  if (n > kMaxTierThreads) {
    throw InvalidArgument("threads is " + std::to_string(n) + "; at most " +
                          std::to_string(kMaxTierThreads));
  }
  return n;
}

bool to_bool(const py::handle& obj, const char* what) {
  if (!py::isinstance<py::bool_>(obj)) {
    throw InvalidArgument(std::string(what) + " must be True or False, got " +
                          py::repr(obj).cast<std::string>());
  }
  return obj.cast<bool>();
}

// A duration in microseconds (the tier or manager refuses one past 1 s,
// naming it).
std::chrono::microseconds micros(const py::handle& obj, const char* what) {
  return std::chrono::microseconds{to_u32(obj, what)};
}

DiskIo parse_io(const std::string& name) {
  if (name == "auto" || name == "automatic") return DiskIo::automatic;
  if (name == "io_uring") return DiskIo::io_uring;
  if (name == "threads") return DiskIo::threads;
  throw InvalidArgument("io '" + name + "' is not 'auto', 'io_uring' or 'threads'");
}

OffloadAdmission parse_admission(const std::string& name) {
  if (name == "every_page") return OffloadAdmission::every_page;
  if (name == "reused") return OffloadAdmission::reused;
  throw InvalidArgument("admission '" + name + "' is not 'every_page' or 'reused'");
}

// A capacity in bytes as Python: None for unlimited.
py::object capacity_object(std::uint64_t bytes) {
  if (bytes == DiskTier::kUnlimited) return py::none();
  return py::int_(bytes);
}

py::dict tier_stats_dict(const TierStats& s) {
  py::dict d;
  d["enabled"] = s.enabled;
  d["pages_held"] = s.pages_held;
  d["bytes_held"] = s.bytes_held;
  d["capacity_bytes"] = capacity_object(s.capacity_bytes);
  d["lookups"] = s.lookups;
  d["hits"] = s.hits;
  d["pages_stored"] = s.pages_stored;
  d["pages_loaded"] = s.pages_loaded;
  d["bytes_stored"] = s.bytes_stored;
  d["bytes_loaded"] = s.bytes_loaded;
  d["evictions"] = s.evictions;
  d["rejected"] = s.rejected;
  d["corrupt"] = s.corrupt;
  d["io_errors"] = s.io_errors;
  d["load_nanoseconds"] = s.load_nanoseconds;
  return d;
}

py::dict figures_dict(const TierFigures& f) {
  py::dict d;
  d["name"] = f.name;
  d["enabled"] = f.enabled;
  d["pages_held"] = f.pages_held;
  d["bytes_held"] = f.bytes_held;
  d["capacity_bytes"] = capacity_object(f.capacity_bytes);
  d["lookups"] = f.lookups;
  d["hits"] = f.hits;
  d["pages_stored"] = f.pages_stored;
  d["bytes_stored"] = f.bytes_stored;
  d["pages_loaded"] = f.pages_loaded;
  d["bytes_loaded"] = f.bytes_loaded;
  d["evictions"] = f.evictions;
  d["corrupt"] = f.corrupt;
  d["io_errors"] = f.io_errors;
  d["load_nanoseconds"] = f.load_nanoseconds;
  d["pages_offloaded"] = f.pages_offloaded;
  d["offload_dropped"] = f.offload_dropped;
  d["pages_onboarded"] = f.pages_onboarded;
  d["load_failures"] = f.load_failures;
  return d;
}

// ", model_id='m', cache_salt='s'" (the salt only when set).
std::string namespace_repr(const Tier& t) {
  const TierFingerprint& f = t.fingerprint();
  std::string s = ", model_id=" + py::repr(py::str(f.model_id)).cast<std::string>();
  if (!f.cache_salt.empty()) {
    s += ", cache_salt=" + py::repr(py::str(f.cache_salt)).cast<std::string>();
  }
  return s;
}

std::string host_repr(const HostTier& t) {
  return "HostTier(capacity_bytes=" + std::to_string(t.stats().capacity_bytes) +
         ", page_bytes=" + std::to_string(t.fingerprint().page_bytes()) +
         ", num_slots=" + std::to_string(t.num_slots()) + namespace_repr(t) + ")";
}

std::string disk_repr(const DiskTier& t) {
  return "DiskTier(" + py::repr(py::str(t.dir().string())).cast<std::string>() +
         ", capacity_bytes=" +
         py::repr(capacity_object(t.stats().capacity_bytes)).cast<std::string>() +
         ", io_backend='" + std::string(t.io_backend()) +
         "', direct_io=" + (t.direct_io() ? "True" : "False") + namespace_repr(t) + ")";
}

std::shared_ptr<HostTier> make_host(const KVCacheParams& params, const py::object& bytes,
                                    const py::object& pages, const py::object& model_id,
                                    const py::object& cache_salt, const py::object& n_threads,
                                    const py::object& synchronous, const py::object& checksums,
                                    const py::object& huge_pages, const py::object& linger_us) {
  TierFingerprint f = fingerprint(params, model_id, cache_salt);
  if (bytes.is_none() && pages.is_none()) {
    throw InvalidArgument("a host tier needs capacity_bytes or capacity_pages");
  }
  const std::uint64_t cap = capacity(f, bytes, pages, 0);
  HostTierOptions o;
  o.threads = threads(n_threads);
  o.synchronous = to_bool(synchronous, "synchronous");
  o.checksums = to_bool(checksums, "checksums");
  o.huge_pages = to_bool(huge_pages, "huge_pages");
  o.linger = micros(linger_us, "linger_us");
  return share(unlocked([&] { return std::make_unique<HostTier>(std::move(f), cap, o); }));
}

struct DiskArgs {
  py::object capacity_bytes, capacity_pages, io, direct_io, durable, threads, queue_depth,
      slab_bytes, max_consecutive_errors, linger_us;
};

std::shared_ptr<DiskTier> make_disk(const KVCacheParams& params, const py::object& dir,
                                    const py::object& model_id, const py::object& cache_salt,
                                    const DiskArgs& a) {
  TierFingerprint f = fingerprint(params, model_id, cache_salt);
  const py::object fspath = py::module_::import("os").attr("fspath");
  if (!py::isinstance<py::str>(dir) && !py::hasattr(dir, "__fspath__")) {
    throw InvalidArgument("dir must be a str or an os.PathLike, got " +
                          py::str(py::type::of(dir)).cast<std::string>());
  }
  const std::filesystem::path path = to_str(fspath(dir), "dir");
  if (path.empty()) throw InvalidArgument("dir is empty");
  const std::uint64_t cap = capacity(f, a.capacity_bytes, a.capacity_pages, DiskTier::kUnlimited);
  DiskTierOptions o;
  o.io = parse_io(to_str(a.io, "io"));
  o.direct_io = to_bool(a.direct_io, "direct_io");
  o.durable = to_bool(a.durable, "durable");
  o.threads = threads(a.threads);
  o.queue_depth = to_u32(a.queue_depth, "queue_depth");
  o.slab_bytes = to_u64(a.slab_bytes, "slab_bytes");
  o.max_consecutive_errors = to_u32(a.max_consecutive_errors, "max_consecutive_errors");
  o.linger = micros(a.linger_us, "linger_us");
  return share(unlocked([&] { return std::make_unique<DiskTier>(std::move(f), path, cap, o); }));
}

void bind_base(py::module_& m) {
  py::class_<Tier, std::shared_ptr<Tier>>(
      m, "Tier",
      "A storage tier below a paged manager's pool (HostTier, DiskTier): pages the pool "
      "evicts are written to it, match_prefix loads them back. Not made directly.")
      .def_property_readonly("name", [](const Tier& t) { return std::string(t.name()); })
      .def_property_readonly("enabled", &Tier::enabled)
      .def_property_readonly("page_bytes",
                             [](const Tier& t) { return t.fingerprint().page_bytes(); })
      .def_property_readonly("model_id", [](const Tier& t) { return t.fingerprint().model_id; })
      .def_property_readonly("cache_salt", [](const Tier& t) { return t.fingerprint().cache_salt; })
      .def(
          "stats", [](const Tier& t) { return tier_stats_dict(t.stats()); },
          "The tier's counters since it opened and its gauges now, as a dict "
          "(capacity_bytes None: unlimited).");
}

void bind_host(py::module_& m) {
  py::class_<HostTier, Tier, std::shared_ptr<HostTier>>(
      m, "HostTier", "Pages in bounded host memory (kvcache::HostTier, docs/tiers.md).")
      .def(py::init(&make_host), py::arg("params"), py::kw_only(),
           py::arg("capacity_bytes") = py::none(), py::arg("capacity_pages") = py::none(),
           py::arg("model_id") = "", py::arg("cache_salt") = "", py::arg("threads") = 2,
           py::arg("synchronous") = false, py::arg("checksums") = false,
           py::arg("huge_pages") = true, py::arg("linger_us") = HostTierOptions{}.linger.count(),
           "A host tier for caches of params' shape (paged) under model_id and cache_salt, "
           "holding capacity_bytes of pages (or capacity_pages pages). threads: workers; "
           "synchronous: work in the caller's thread instead; checksums: verify every load; "
           "linger_us: a worker out of jobs naps this long (at most 1 s) before it sleeps, "
           "so a store meanwhile wakes no thread.")
      .def_property_readonly("num_slots", &HostTier::num_slots)
      .def_property_readonly("slot_bytes", &HostTier::slot_bytes)
      .def("__repr__", &host_repr);
}

void bind_disk(py::module_& m) {
  py::class_<DiskTier, Tier, std::shared_ptr<DiskTier>>(
      m, "DiskTier",
      "Pages in slab files under one directory, found again after a restart "
      "(kvcache::DiskTier, docs/tiers.md).")
      .def(py::init([](const KVCacheParams& params, const py::object& dir, const py::object& bytes,
                       const py::object& pages, const py::object& model_id,
                       const py::object& cache_salt, const py::object& io,
                       const py::object& direct_io, const py::object& durable,
                       const py::object& n_threads, const py::object& queue_depth,
                       const py::object& slab_bytes, const py::object& max_errors,
                       const py::object& linger_us) {
             return make_disk(params, dir, model_id, cache_salt,
                              {bytes, pages, io, direct_io, durable, n_threads, queue_depth,
                               slab_bytes, max_errors, linger_us});
           }),
           py::arg("params"), py::arg("dir"), py::kw_only(), py::arg("capacity_bytes") = py::none(),
           py::arg("capacity_pages") = py::none(), py::arg("model_id") = "",
           py::arg("cache_salt") = "", py::arg("io") = "auto", py::arg("direct_io") = true,
           py::arg("durable") = true, py::arg("threads") = 2, py::arg("queue_depth") = 32,
           py::arg("slab_bytes") = std::uint64_t{1} << 30, py::arg("max_consecutive_errors") = 8,
           py::arg("linger_us") = DiskTierOptions{}.linger.count(),
           "A disk tier in dir (created if missing; a str or os.PathLike) for caches of "
           "params' shape under model_id and cache_salt: capacity_bytes of pages, or "
           "capacity_pages pages, or (neither) as many as the disk holds. Pages a tier of the "
           "same shape and namespace left there are found again (recovery). One tier at a "
           "time per directory. io: 'auto', 'io_uring' or 'threads'. linger_us: as "
           "HostTier's.")
      .def_property_readonly("dir", [](const DiskTier& t) { return t.dir().string(); })
      .def_property_readonly("io_backend",
                             [](const DiskTier& t) { return std::string(t.io_backend()); })
      .def_property_readonly("direct_io", &DiskTier::direct_io)
      .def_property_readonly("slot_bytes", &DiskTier::slot_bytes)
      .def_property_readonly("recovery",
                             [](const DiskTier& t) {
                               const DiskRecovery& r = t.recovery();
                               py::dict d;
                               d["fresh"] = r.fresh;
                               d["pages"] = r.pages;
                               d["dropped"] = r.dropped;
                               d["torn_manifest_bytes"] = r.torn_manifest_bytes;
                               return d;
                             })
      .def("__repr__", &disk_repr);
}

std::vector<std::shared_ptr<Tier>> tier_list(const py::object& tiers) {
  std::vector<std::shared_ptr<Tier>> out;
  if (tiers.is_none()) return out;
  if (py::isinstance<py::str>(tiers) || !py::isinstance<py::sequence>(tiers)) {
    throw InvalidArgument("tiers must be a list of kvcache.HostTier / kvcache.DiskTier, got " +
                          py::str(py::type::of(tiers)).cast<std::string>());
  }
  std::size_t i = 0;
  for (const py::handle t : tiers.cast<py::sequence>()) {
    if (!py::isinstance<Tier>(t)) {
      throw InvalidArgument("tiers[" + std::to_string(i) + "] is a " +
                            py::str(py::type::of(t)).cast<std::string>() +
                            ", not a kvcache.HostTier or kvcache.DiskTier");
    }
    out.push_back(t.cast<std::shared_ptr<Tier>>());
    ++i;
  }
  return out;
}

// Stands for a tier in a configuration that is only measured
// (estimated_bookkeeping_size(tiers=n)); never given to a manager.
class CountedTier final : public Tier {
 public:
  explicit CountedTier(TierFingerprint f) : fingerprint_(std::move(f)) {}
  std::string_view name() const override { return "counted"; }
  const TierFingerprint& fingerprint() const override { return fingerprint_; }
  bool enabled() const override { return false; }
  std::vector<std::uint8_t> contains(std::span<const PageKey> keys) override {
    return std::vector<std::uint8_t>(keys.size(), 0);
  }
  TierTicket store(std::span<const PageWrite> /*pages*/) override { throw unused(); }
  TierTicket load(std::span<const PageRead> /*pages*/) override { throw unused(); }
  TierStats stats() const override { return {}; }

 private:
  static Error unused() { return Error("a counted tier only sizes a configuration"); }
  TierFingerprint fingerprint_;
};

void require_prefix_caching(const KVCacheParams& p, bool any) {
  if (any && !p.enable_prefix_caching) {
    throw InvalidArgument(
        "tiers / model_id / cache_salt / admission / staging_pages / pool_apart / "
        "offload_batch / offload_delay_us need params.enable_prefix_caching=True");
  }
}

}  // namespace

TierConfig tier_config(const KVCacheParams& p, const py::object& tiers, const py::object& model_id,
                       const py::object& cache_salt, const py::object& admission,
                       const py::object& staging_pages, const py::object& pool_apart) {
  TierConfig c;
  require_prefix_caching(p, !tiers.is_none() || !model_id.is_none() || !cache_salt.is_none() ||
                                !admission.is_none() || !staging_pages.is_none() ||
                                !pool_apart.is_none());
  c.tiers = tier_list(tiers);
  // model_id and cache_salt default to the first tier's.
  const TierFingerprint* first = c.tiers.empty() ? nullptr : &c.tiers.front()->fingerprint();
  c.model_id = model_id.is_none() ? (first ? first->model_id : "") : to_str(model_id, "model_id");
  c.cache_salt =
      cache_salt.is_none() ? (first ? first->cache_salt : "") : to_str(cache_salt, "cache_salt");
  if (!admission.is_none()) c.admission = parse_admission(to_str(admission, "admission"));
  if (!staging_pages.is_none()) c.staging_pages = to_u32(staging_pages, "staging_pages");
  if (!pool_apart.is_none()) c.pool_apart = to_bool(pool_apart, "pool_apart");
  return c;
}

void offload_batching(const KVCacheParams& p, TierConfig& c, const py::object& batch,
                      const py::object& delay_us) {
  require_prefix_caching(p, !batch.is_none() || !delay_us.is_none());
  if (!batch.is_none()) c.offload_batch = to_u32(batch, "offload_batch");
  if (!delay_us.is_none()) c.offload_delay = micros(delay_us, "offload_delay_us");
}

TierConfig sized_tier_config(const KVCacheParams& p, const py::object& tiers,
                             const py::object& staging_pages, const py::object& pool_apart) {
  if (!PyLong_Check(tiers.ptr()) || py::isinstance<py::bool_>(tiers)) {
    return tier_config(p, tiers, py::none(), py::none(), py::none(), staging_pages, pool_apart);
  }
  TierConfig c =
      tier_config(p, py::none(), py::none(), py::none(), py::none(), staging_pages, pool_apart);
  require_prefix_caching(p, true);
  const std::uint32_t n = to_u32(tiers, "tiers");
  if (n > kMaxTiers) {
    throw InvalidArgument("tiers is " + std::to_string(n) + "; a manager takes at most " +
                          std::to_string(kMaxTiers));
  }
  if (n > 0) {
    const auto counted = std::make_shared<CountedTier>(TierFingerprint::of(p, "", ""));
    c.tiers.assign(n, counted);
  }
  return c;
}

py::dict stats_dict(const ManagerStats& s) {
  py::dict d;
  d["blocks_total"] = s.blocks_total;
  d["blocks_free"] = s.blocks_free;
  d["blocks_used"] = s.blocks_used;
  d["blocks_cached"] = s.blocks_cached;
  d["blocks_pinned"] = s.blocks_pinned;
  d["page_size"] = s.page_size;
  d["active_sequences"] = s.active_sequences;
  d["pool_bytes"] = s.pool_bytes;
  d["sequences_claimed"] = s.sequences_claimed;
  d["sequences_forked"] = s.sequences_forked;
  d["sequences_released"] = s.sequences_released;
  d["fetches"] = s.fetches;
  d["steps"] = s.steps;
  d["committed_tokens"] = s.committed_tokens;
  d["prefix_lookups"] = s.prefix_lookups;
  d["prefix_prompt_tokens"] = s.prefix_prompt_tokens;
  d["prefix_hit_tokens"] = s.prefix_hit_tokens;
  d["blocks_published"] = s.blocks_published;
  d["evictions"] = s.evictions;
  d["cow_copies"] = s.cow_copies;
  d["pending_loads"] = s.pending_loads;
  py::list tiers;
  for (const TierFigures& f : s.tiers) tiers.append(figures_dict(f));
  d["tiers"] = tiers;
  return d;
}

void bind_tier_types(py::module_& m) {
  bind_base(m);
  bind_host(m);
  bind_disk(m);
}

void bind_tier_methods(py::class_<PagedKVCacheManager>& cls) {
  using M = PagedKVCacheManager;
  cls.def_property_readonly("has_tiers", &M::has_tiers)
      .def(
          "has_pending_loads",
          [](const M& m, const py::handle& seq) {
            const SeqId id = to_seq_ids(seq).at(0);
            return unlocked([&] { return m.has_pending_loads(id); });
          },
          py::arg("seq_id"),
          "Whether seq has pages still loading from a tier (match_prefix started them): "
          "leave it out of the batch until this is False; fetch, fork and truncate raise "
          "InvalidArgument meanwhile.")
      .def("poll_loads", counted([](M& m) { return unlocked([&] { return m.poll_loads(); }); }),
           "Finishes the loads (and write-backs) that are done, never waits; returns the "
           "sequences whose loads it finished (ready for fetch; a failed load truncated its "
           "sequence: read cache_length).")
      .def(
          "wait_loads",
          [](M& m, const py::handle& seq) {
            const SeqId id = to_seq_ids(seq).at(0);
            unlocked([&] { m.wait_loads(id); });
          },
          py::arg("seq_id"),
          "Waits (the GIL released) until seq's loads are done, then finishes them.")
      .def(
          "wait_tiers", [](M& m) { unlocked([&] { m.wait_tiers(); }); },
          "Waits (the GIL released) for every load and write-back in flight and finishes them.")
      .def(
          "complete_offloads",
          [](M& m, const py::handle& inputs) {
            const KVCacheBatch& b = batch_of(inputs, "kv_cache_inputs").batch.batch;
            return unlocked([&] { return m.complete_offloads(b); });
          },
          py::arg("kv_cache_inputs"),
          "pool_apart: hands the write-backs this fetch's block_offloads listed to the first "
          "tier, once their pages were copied into the slots; returns how many (0 for a "
          "batch without offloads or one completed already). Raises InvalidArgument, changing "
          "nothing, for a batch fetched from another manager.");
}

}  // namespace kvcache::python
