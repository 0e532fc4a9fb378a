// python/managers.cpp — ContinuousBatchingKVCacheManager and
// PagedKVCacheManager for Python, in the shape of MAX's
// continuous_batching_cache page: constructor (params, max_cache_batch_size,
// max_seq_len, num_layers, devices, session), classmethod
// estimated_memory_size, fetch returning one tuple per device (KVCacheInputs,
// inputs.cpp), increment_cache_lengths returning new tuples, input_symbols;
// seq ids in [0, max_cache_batch_size) (SeqIdPolicy::lowest_free). The richer
// API (num_new_tokens, num_steps, paging, prefix caching, fork, truncate)
// sits beside it (prefix caching in prefix.cpp).
//
// GIL: every call into a manager releases the GIL while it runs (`unlocked`,
// py_common.h), so a thread waiting for the manager's mutex never holds the
// GIL. That is what makes the prefix cache's on_event callback safe: it runs
// under the manager's mutex and takes the GIL itself (prefix.cpp). The calls
// that build many Python objects run wholly `counted`, so interpreter exit
// waits for them (shutdown.cpp).
#include <memory>
#include <string>
#include <type_traits>

#include "py_common.h"
#include "repr.h"

namespace kvcache::python {

namespace {

// ---- manager construction arguments ----------------------------------------------

// Resolves MAX's separate num_layers / devices arguments against the params.
KVCacheParams resolve_params(KVCacheParams p, const py::object& num_layers,
                             const py::object& devices) {
  if (!num_layers.is_none()) {
    const std::uint32_t n = to_u32(num_layers, "num_layers");
    if (p.num_layers != 0 && p.num_layers != n) {
      throw InvalidArgument("num_layers " + std::to_string(n) + " differs from params.num_layers " +
                            std::to_string(p.num_layers));
    }
    p.num_layers = n;
  }
  if (p.num_layers == 0) {
    throw InvalidArgument("num_layers is unset: pass it to KVCacheParams or to the manager");
  }
  if (!devices.is_none()) {
    const std::size_t n =
        PyLong_Check(devices.ptr()) ? to_u32(devices, "devices") : py::len(devices);
    if (n != p.n_devices) {
      throw InvalidArgument("devices names " + std::to_string(n) +
                            " devices but params.n_devices is " + std::to_string(p.n_devices));
    }
  }
  p.validate();
  return p;
}

// Pool size of a paged manager: total_num_pages, or what fits in cache_memory,
// or (neither given) enough for every sequence to reach max_seq_len.
std::uint32_t resolve_pages(const KVCacheParams& p, std::uint32_t max_batch,
                            std::uint32_t max_seq_len, const py::object& total_num_pages,
                            const py::object& cache_memory) {
  if (!total_num_pages.is_none() && !cache_memory.is_none()) {
    throw InvalidArgument("pass total_num_pages or cache_memory, not both");
  }
  if (!total_num_pages.is_none()) return to_u32(total_num_pages, "total_num_pages");
  if (!cache_memory.is_none()) {
    return PagedKVCacheManager::pages_for_memory(p, to_u64(cache_memory, "cache_memory"));
  }
  const std::uint64_t per_seq = (std::uint64_t{max_seq_len} + p.page_size - 1) / p.page_size;
  const std::uint64_t pages = per_seq * max_batch;
  if (pages > std::numeric_limits<std::uint32_t>::max()) {
    throw InvalidArgument("max_cache_batch_size * pages per sequence = " + std::to_string(pages) +
                          " pages, more than 2^32 - 1: pass total_num_pages");
  }
  return static_cast<std::uint32_t>(pages);
}

// ---- the lifecycle, shared by both managers ------------------------------------------

py::dict snapshot_dict(const ManagerSnapshot& s) {
  py::list seqs;
  for (const SequenceSnapshot& q : s.sequences) {
    py::dict d;
    d["id"] = q.id;
    d["cache_length"] = q.cache_length;
    d["reserved_length"] = q.reserved_length;
    d["blocks"] = q.blocks;
    seqs.append(d);
  }
  py::dict out;
  out["sequences"] = seqs;
  out["free_blocks"] = s.free_blocks;
  out["ref_counts"] = s.ref_counts;
  out["next_seq_id"] = s.next_seq_id;
  out["cached_blocks"] = s.cached_blocks;
  out["cached_priorities"] = s.cached_priorities;
  return out;
}

// fetch: a KVCacheInputs whose batch holds a reference to the manager `self`.
template <class Manager>
py::object fetch(const py::object& self, const py::handle& seq_ids,
                 const py::handle& num_new_tokens, const py::handle& num_steps) {
  Manager& m = self.cast<Manager&>();
  const std::vector<SeqId> seqs = to_seq_ids(seq_ids);
  const auto news = to_u32_vector(num_new_tokens, "num_new_tokens", seqs.size(), 1);
  auto out = std::make_unique<PyBatch>();
  const std::uint32_t steps = to_u32(num_steps, "num_steps");
  unlocked([&] { m.fetch_into(out->batch, seqs, news, steps); });
  out->sync();
  out->manager = self;
  return make_inputs(std::move(out));
}

struct StepArgs {
  std::vector<SeqId> seqs;
  std::vector<std::uint32_t> valid;
};

StepArgs step_args(const py::handle& seq_ids, const py::handle& valid_lengths) {
  StepArgs a;
  std::vector<SeqId>& seqs = a.seqs;
  std::vector<std::uint32_t>& valid = a.valid;
  if (py::isinstance<py::dict>(seq_ids) && valid_lengths.is_none()) {  // step({seq: n, ...})
    for (auto [k, v] : seq_ids.cast<py::dict>()) {
      seqs.push_back(to_seq_ids(k)[0]);
      valid.push_back(to_u32(v, "valid_lengths"));
    }
  } else {
    if (valid_lengths.is_none()) {
      throw InvalidArgument(
          "valid_lengths is missing: step(seq_ids, valid_lengths) or "
          "step({seq_id: valid_length})");
    }
    seqs = to_seq_ids(seq_ids);
    valid = to_u32_vector(valid_lengths, "valid_lengths", seqs.size());
  }
  return a;
}

void step(KVCacheManager& m, const py::handle& seq_ids, const py::handle& valid_lengths) {
  const StepArgs a = step_args(seq_ids, valid_lengths);
  unlocked([&] { m.step(a.seqs, a.valid); });
}

// True for a list / tuple / array whose first entry is itself a sequence.
bool is_nested(const py::handle& obj) {
  if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj)) return false;
  if (py::len(obj) == 0) return false;
  const py::handle first = obj.cast<py::sequence>()[0];
  return PySequence_Check(first.ptr()) != 0 && !py::isinstance<py::str>(first);
}

// A step's token ids: flat (sum(valid) ids in batch order) or one sequence
// of valid[b] ids per batch entry, flattened.
std::vector<std::uint32_t> step_tokens(const py::handle& obj,
                                       std::span<const std::uint32_t> valid) {
  if (!is_nested(obj)) return to_u32_vector(obj, "token_ids");
  const auto rows = obj.cast<py::sequence>();
  if (rows.size() != valid.size()) {
    throw InvalidArgument("token_ids has " + std::to_string(rows.size()) +
                          " per-sequence lists but the batch has " + std::to_string(valid.size()) +
                          " seq ids");
  }
  std::vector<std::uint32_t> flat;
  for (std::size_t b = 0; b < valid.size(); ++b) {
    const auto row = to_u32_vector(rows[b], "token_ids");
    if (row.size() != valid[b]) {
      throw InvalidArgument("token_ids[" + std::to_string(b) + "] has " +
                            std::to_string(row.size()) + " ids but valid_lengths[" +
                            std::to_string(b) + "] is " + std::to_string(valid[b]));
    }
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return flat;
}

void step_paged(PagedKVCacheManager& m, const py::handle& seq_ids, const py::handle& valid_lengths,
                const py::handle& token_ids) {
  const StepArgs a = step_args(seq_ids, valid_lengths);
  if (token_ids.is_none()) {
    unlocked([&] { m.step(a.seqs, a.valid); });
    return;
  }
  const auto tokens = step_tokens(token_ids, a.valid);
  unlocked([&] { m.step(a.seqs, a.valid, tokens); });
}

// cls.name = classmethod(f): f's first parameter receives the class.
template <class Manager, class F, class... Extra>
void def_classmethod(py::class_<Manager>& cls, const char* name, F&& f, const Extra&... extra) {
  py::cpp_function fn(std::forward<F>(f), py::name(name), py::scope(cls), extra...);
  cls.attr(name) = py::reinterpret_steal<py::object>(PyClassMethod_New(fn.ptr()));
}

template <class Manager>
void bind_lifecycle(py::class_<Manager>& cls) {
  cls.def("claim", counted([](Manager& m, const py::handle& n) {
            const std::uint32_t count = to_u32(n, "n");
            return unlocked([&] { return m.claim(count); });
          }),
          py::arg("n") = 1, "n new sequence ids with cache length 0 (all or nothing).")
      .def("fetch", counted(&fetch<Manager>), py::arg("seq_ids"),
           py::arg("num_new_tokens") = py::none(), py::arg("num_steps") = 1,
           "Room for cache_length + num_new_tokens + num_steps - 1 tokens per sequence "
           "(continuous: the whole max_seq_len slot); returns a KVCacheInputs, a list with one "
           "(blocks, cache_lengths, lookup_table, is_cache_empty) tuple per device. "
           "num_new_tokens: an int for all, one per seq, or None (1). Raises ValueError "
           "(kvcache.UnknownSequence) for an id not claimed.")
      .def(
          "release",
          [](Manager& m, const py::handle& seq) {
            const SeqId id = to_seq_ids(seq).at(0);
            unlocked([&] { m.release(id); });
          },
          py::arg("seq_id"))
      .def(
          "cache_length",
          [](const Manager& m, const py::handle& s) {
            const SeqId id = to_seq_ids(s).at(0);
            return unlocked([&] { return m.cache_length(id); });
          },
          py::arg("seq_id"))
      .def(
          "contains",
          [](const Manager& m, SeqId s) { return unlocked([&] { return m.contains(s); }); },
          py::arg("seq_id"))
      .def(
          "__contains__",
          [](const Manager& m, SeqId s) { return unlocked([&] { return m.contains(s); }); },
          py::arg("seq_id"))
      .def(
          "block_shape",
          [](const Manager& m, const py::handle& n) {
            return m.block_shape(to_u32(n, "n_sequences"));
          },
          py::arg("n_sequences"))
      .def("increment_cache_lengths", counted(&incremented_inputs), py::arg("kv_cache_inputs"),
           py::arg("prev_model_inputs"),
           "Multistep: new per-device tuples whose cache_lengths are kv_cache_inputs' plus "
           "the previous step's tokens, and is_cache_empty False. The row offsets (batch + 1 "
           "values) are prev_model_inputs[-1] when it is a tuple / list of arrays (MAX's "
           "(tokens, input_row_offsets)), prev_model_inputs.input_row_offsets if it has that "
           "attribute, else prev_model_inputs itself. Neither kv_cache_inputs nor the manager "
           "changes; no device synchronisation.")
      .def("input_symbols", counted([](const Manager& m) { return input_symbols(m); }),
           "Per device, the TensorType of the four fetch outputs.")
      .def("snapshot", counted([](const Manager& m) {
             return snapshot_dict(unlocked([&] { return m.snapshot(); }));
           }))
      .def("check_invariants", [](const Manager& m) { unlocked([&] { m.check_invariants(); }); })
      .def("stats", counted([](const Manager& m) {
             return stats_dict(unlocked([&] { return m.stats(); }));
           }),
           "One reading of the manager's figures as a dict (docs/metrics.md); paged with "
           "tiers: 'pending_loads' and 'tiers', one dict per tier.")
      .def_property_readonly("params", [](const Manager& m) { return m.params(); })
      .def_property_readonly("num_layers", [](const Manager& m) { return m.params().num_layers; })
      .def_property_readonly("max_cache_batch_size", &Manager::max_batch_size)
      .def_property_readonly("max_seq_len", &Manager::max_seq_len)
      .def_property_readonly(
          "num_active_sequences",
          [](const Manager& m) { return unlocked([&] { return m.num_active_sequences(); }); })
      .def_property_readonly("total_blocks", &Manager::total_blocks)
      .def_property_readonly(
          "free_blocks", [](const Manager& m) { return unlocked([&] { return m.free_blocks(); }); })
      .def_property_readonly(
          "used_blocks", [](const Manager& m) { return unlocked([&] { return m.used_blocks(); }); })
      .def("__repr__", [](const Manager& m) { return manager_repr(m); });
  if constexpr (std::is_same_v<Manager, PagedKVCacheManager>) {
    cls.def(
        "step",
        [](Manager& m, const py::handle& seqs, const py::handle& valid, const py::handle& tokens) {
          step_paged(m, seqs, valid, tokens);
        },
        py::arg("seq_ids"), py::arg("valid_lengths") = py::none(), py::kw_only(),
        py::arg("token_ids") = py::none(),
        "Commits valid_lengths[b] tokens for seq_ids[b] (or step({seq_id: n})). token_ids: "
        "the committed tokens' ids, flat in batch order or one list per sequence; with "
        "prefix caching, pages that became full are published, and a step without token_ids "
        "raises InvalidArgument (see step_without_token_ids).");
    cls.def(
        "step_without_token_ids",
        [](Manager& m, const py::handle& seqs, const py::handle& valid) {
          const StepArgs a = step_args(seqs, valid);
          unlocked([&] { m.step_without_token_ids(a.seqs, a.valid); });
        },
        py::arg("seq_ids"), py::arg("valid_lengths") = py::none(),
        "step without the tokens' ids, on purpose: with prefix caching these sequences stop "
        "publishing (their later pages stay private).");
  } else {
    cls.def(
        "step",
        [](Manager& m, const py::handle& seqs, const py::handle& valid) { step(m, seqs, valid); },
        py::arg("seq_ids"), py::arg("valid_lengths") = py::none(),
        "Commits valid_lengths[b] tokens for seq_ids[b] (or step({seq_id: n})).");
  }
}

void bind_continuous(py::module_& m) {
  using M = ContinuousBatchingKVCacheManager;
  py::class_<M> cls(m, "ContinuousBatchingKVCacheManager",
                    "MAX's continuous-batching manager: one max_seq_len slot per sequence.");
  cls.def(
      py::init([](const KVCacheParams& params, const py::handle& max_batch,
                  const py::handle& max_seq_len, const py::object& num_layers,
                  const py::object& devices, const py::object& /*session*/) {
        return std::make_unique<M>(resolve_params(params, num_layers, devices),
                                   to_u32(max_batch, "max_cache_batch_size"),
                                   to_u32(max_seq_len, "max_seq_len"), SeqIdPolicy::lowest_free);
      }),
      py::arg("params"), py::arg("max_cache_batch_size"), py::arg("max_seq_len"),
      py::arg("num_layers") = py::none(), py::arg("devices") = py::none(),
      py::arg("session") = py::none(), "session (MAX's InferenceSession) is accepted and ignored.");
  def_classmethod(
      cls, "estimated_memory_size",
      [](const py::object& /*cls*/, const KVCacheParams& params, const py::handle& max_batch,
         const py::handle& max_seq_len, const py::object& num_layers, const py::object& devices) {
        return M::estimated_memory_size(resolve_params(params, num_layers, devices),
                                        to_u32(max_batch, "max_cache_batch_size"),
                                        to_u32(max_seq_len, "max_seq_len"));
      },
      py::arg("cls"), py::arg("params"), py::arg("max_cache_batch_size"), py::arg("max_seq_len"),
      py::arg("num_layers") = py::none(), py::arg("devices") = py::none(),
      py::doc("Bytes of the blocks over all devices (a classmethod, as in MAX)."));
  bind_lifecycle(cls);
}

void bind_paged(py::module_& m) {
  using M = PagedKVCacheManager;
  py::class_<M> cls(m, "PagedKVCacheManager",
                    "A paged manager: one pool of page_size-token pages, one page table per "
                    "sequence. The pool is total_num_pages, or what fits in cache_memory bytes, "
                    "or (neither) enough for every sequence to reach max_seq_len.");
  cls.def(py::init([](const KVCacheParams& params, const py::handle& max_batch,
                      const py::handle& max_seq_len, const py::object& num_layers,
                      const py::object& devices, const py::object& /*session*/,
                      const py::object& total_num_pages, const py::object& cache_memory,
                      const py::object& policy, const py::object& on_event,
                      const py::object& small_fraction, const py::object& ghost_factor,
                      const py::object& tiers, const py::object& model_id,
                      const py::object& cache_salt, const py::object& admission,
                      const py::object& staging_pages, const py::object& pool_apart,
                      const py::object& offload_batch, const py::object& offload_delay_us) {
            const KVCacheParams p = resolve_params(params, num_layers, devices);
            const std::uint32_t batch = to_u32(max_batch, "max_cache_batch_size");
            const std::uint32_t seq = to_u32(max_seq_len, "max_seq_len");
            const std::uint32_t pages = resolve_pages(p, batch, seq, total_num_pages, cache_memory);
            PrefixCacheConfig config =
                prefix_config(p, policy, on_event, small_fraction, ghost_factor);
            config.tiers =
                tier_config(p, tiers, model_id, cache_salt, admission, staging_pages, pool_apart);
            offload_batching(p, config.tiers, offload_batch, offload_delay_us);
            return std::make_unique<M>(p, pages, batch, seq, std::move(config),
                                       SeqIdPolicy::lowest_free);
          }),
          py::arg("params"), py::arg("max_cache_batch_size"), py::arg("max_seq_len"),
          py::arg("num_layers") = py::none(), py::arg("devices") = py::none(),
          py::arg("session") = py::none(), py::kw_only(), py::arg("total_num_pages") = py::none(),
          py::arg("cache_memory") = py::none(), py::arg("eviction_policy") = py::none(),
          py::arg("on_event") = py::none(), py::arg("s3fifo_small_fraction") = py::none(),
          py::arg("ghost_factor") = py::none(), py::arg("tiers") = py::none(),
          py::arg("model_id") = py::none(), py::arg("cache_salt") = py::none(),
          py::arg("admission") = py::none(), py::arg("staging_pages") = py::none(),
          py::arg("pool_apart") = py::none(), py::arg("offload_batch") = py::none(),
          py::arg("offload_delay_us") = py::none(),
          "session (MAX's InferenceSession) is accepted and ignored. tiers: storage tiers "
          "below the pool, nearest first (kvcache.HostTier, kvcache.DiskTier; "
          "docs/tiers.md). pool_apart: the K/V live in a pool of the caller's (a GPU's), "
          "the manager's pool is the loads' host buffer; fetch hands out block_offloads and "
          "block_loads, complete_offloads finishes the write-backs. offload_batch, "
          "offload_delay_us: write-backs wait in staging until offload_batch of them do or "
          "the oldest waited offload_delay_us (or wait_tiers).");
  def_classmethod(
      cls, "estimated_memory_size",
      [](const py::object& /*cls*/, const KVCacheParams& params, const py::handle& max_batch,
         const py::handle& max_seq_len, const py::object& num_layers, const py::object& devices,
         const py::object& total_num_pages, const py::object& cache_memory) {
        const KVCacheParams p = resolve_params(params, num_layers, devices);
        const std::uint32_t pages =
            resolve_pages(p, to_u32(max_batch, "max_cache_batch_size"),
                          to_u32(max_seq_len, "max_seq_len"), total_num_pages, cache_memory);
        return M::estimated_memory_size(p, pages);
      },
      py::arg("cls"), py::arg("params"), py::arg("max_cache_batch_size"), py::arg("max_seq_len"),
      py::arg("num_layers") = py::none(), py::arg("devices") = py::none(), py::kw_only(),
      py::arg("total_num_pages") = py::none(), py::arg("cache_memory") = py::none(),
      py::doc("Bytes of the pool the constructor would allocate with the same arguments (a "
              "classmethod, as in MAX)."));
  cls.def_static(
         "pages_for_memory",
         [](const KVCacheParams& params, std::size_t bytes) {
           return M::pages_for_memory(params, bytes);
         },
         py::arg("params"), py::arg("memory_bytes"))
      .def_static(
          "estimated_bookkeeping_size",
          [](const KVCacheParams& params, const py::handle& pages, const py::object& policy,
             const py::object& small_fraction, const py::object& ghost_factor,
             const py::object& tiers, const py::object& staging_pages,
             const py::object& pool_apart) {
            PrefixCacheConfig c =
                prefix_config(params, policy, py::none(), small_fraction, ghost_factor);
            c.tiers = sized_tier_config(params, tiers, staging_pages, pool_apart);
            return M::estimated_bookkeeping_size(params, to_u32(pages, "total_num_pages"), c);
          },
          py::arg("params"), py::arg("total_num_pages"), py::kw_only(),
          py::arg("eviction_policy") = py::none(), py::arg("s3fifo_small_fraction") = py::none(),
          py::arg("ghost_factor") = py::none(), py::arg("tiers") = py::none(),
          py::arg("staging_pages") = py::none(), py::arg("pool_apart") = py::none(),
          "Host bytes of the per-page bookkeeping beside the pool (ref counts and free list; "
          "with prefix caching the page metadata, stored token ids, hash index and the "
          "eviction policy's arrays and ghost; with tiers (a list of tiers, or their "
          "number) the write-back staging (staging_pages) and a pool apart's flags), which "
          "estimated_memory_size does not include.")
      .def_property_readonly("page_size", &M::page_size)
      .def_property_readonly("total_num_pages", &M::total_blocks);
  bind_lifecycle(cls);
  bind_prefix_methods(cls);
  bind_tier_methods(cls);
}

}  // namespace

void bind_managers(py::module_& m) {
  bind_tier_types(m);
  bind_continuous(m);
  bind_prefix_types(m);
  bind_paged(m);
}

}  // namespace kvcache::python
