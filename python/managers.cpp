// python/managers.cpp — ContinuousBatchingKVCacheManager, PagedKVCacheManager
// and KVCacheInputs (what fetch returns) for Python.
//
// Zero copy: KVCacheInputs' arrays view C++ memory. `blocks` views the
// manager's block buffer (writable: model code stores K/V there);
// `cache_lengths`, `lookup_table`, `reserved_lengths` and `is_cache_empty` view
// the C++ KVCacheBatch (read-only; increment_cache_lengths changes them in
// place). Every view keeps its KVCacheInputs alive, which keeps the manager
// alive (keep_alive on fetch), so an array can never dangle.
//
// GIL: every call into a manager releases the GIL while it runs (`unlocked`),
// so a thread waiting for the manager's mutex never holds the GIL. That is
// what makes the prefix cache's on_event callback safe: it runs under the
// manager's mutex and takes the GIL itself (see event_trampoline).
#include <memory>
#include <string>
#include <type_traits>
#include <variant>

#include "py_common.h"

namespace kvcache::python {

namespace {

// Runs a manager call with the GIL released (see the header comment).
template <class F>
decltype(auto) unlocked(F&& f) {
  py::gil_scoped_release release;
  return std::forward<F>(f)();
}

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

// ---- KVCacheInputs views ----------------------------------------------------------

py::array read_only(py::array a) {
  a.attr("flags").attr("writeable") = false;
  return a;
}

py::array u32_view(const py::object& base, std::span<const std::uint32_t> values,
                   std::vector<py::ssize_t> shape) {
  return read_only(
      py::array(py::dtype::of<std::uint32_t>(), std::move(shape), values.data(), base));
}

py::array blocks_view(const py::object& self, std::uint32_t device) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  const KVCacheParams& p = b.params();
  // [blocks][2][layers] then [tokens][heads] (NHD) or [heads][tokens] (HND).
  const py::ssize_t tokens = b.block_tokens(), heads = p.n_kv_heads_per_device();
  const bool hnd = p.page_layout == PageLayout::hnd;
  std::vector<py::ssize_t> shape = {
      b.num_blocks(), 2, p.num_layers, hnd ? heads : tokens, hnd ? tokens : heads, p.head_dim};
  return py::array(numpy_dtype(p.dtype), std::move(shape), b.blocks(device), self);
}

py::array cache_lengths_view(const py::object& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  return u32_view(self, b.cache_lengths(), {b.batch_size()});
}

py::array reserved_lengths_view(const py::object& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  return u32_view(self, b.reserved_lengths(), {b.batch_size()});
}

py::array lookup_table_view(const py::object& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  if (b.strategy() == CacheStrategy::continuous) {
    return u32_view(self, b.lookup_table(), {b.batch_size()});
  }
  return u32_view(self, b.lookup_table(), {b.batch_size(), b.lookup_stride()});
}

// [n, 2] (src, dst): the copy-on-write copies the fetch made.
py::array block_copies_view(const py::object& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  const std::span<const BlockCopy> c = b.block_copies();
  static_assert(sizeof(BlockCopy) == 2 * sizeof(std::uint32_t));
  return u32_view(self,
                  std::span<const std::uint32_t>(reinterpret_cast<const std::uint32_t*>(c.data()),
                                                 2 * c.size()),
                  {static_cast<py::ssize_t>(c.size()), 2});
}

py::array is_cache_empty_view(const py::object& self) {
  PyBatch& batch = self.cast<PyBatch&>();
  return read_only(
      py::array(py::dtype::of<bool>(), std::vector<py::ssize_t>{}, &batch.is_cache_empty, self));
}

// (blocks, cache_lengths, lookup_table, is_cache_empty) of one device.
py::tuple device_tuple(const py::object& self, std::uint32_t device) {
  return py::make_tuple(blocks_view(self, device), cache_lengths_view(self),
                        lookup_table_view(self), is_cache_empty_view(self));
}

void increment(PyBatch& batch, const py::handle& prev_row_offsets) {
  const auto offsets = to_u32_vector(prev_row_offsets, "row_offsets");
  batch.batch.increment_cache_lengths(offsets);
  batch.sync();
}

void bind_inputs(py::module_& m) {
  py::class_<PyBatch>(m, "KVCacheInputs",
                      "What fetch returns: unpacks as (blocks, cache_lengths, lookup_table, "
                      "is_cache_empty) of device 0; per_device() gives the seed's list of "
                      "tuples. Arrays view C++ memory (no copy).")
      .def_property_readonly("blocks", [](py::object self) { return blocks_view(self, 0); })
      .def_property_readonly("cache_lengths", &cache_lengths_view)
      .def_property_readonly("lookup_table", &lookup_table_view)
      .def_property_readonly("is_cache_empty", &is_cache_empty_view)
      .def_property_readonly("reserved_lengths", &reserved_lengths_view)
      .def_property_readonly("block_copies", &block_copies_view)
      .def(
          "device", [](py::object self, std::uint32_t d) { return device_tuple(self, d); },
          py::arg("device"))
      .def("per_device",
           [](py::object self) {
             py::list out;
             const std::uint32_t n = self.cast<PyBatch&>().batch.params().n_devices;
             for (std::uint32_t d = 0; d < n; ++d) out.append(device_tuple(self, d));
             return out;
           })
      .def("__len__", [](const PyBatch&) { return 4; })
      .def("__getitem__",
           [](py::object self, py::ssize_t i) { return device_tuple(self, 0)[py::int_(i)]; })
      .def("__iter__", [](py::object self) { return py::iter(device_tuple(self, 0)); })
      .def_property_readonly("seq_ids",
                             [](const PyBatch& b) {
                               auto ids = b.batch.seq_ids();
                               return std::vector<SeqId>(ids.begin(), ids.end());
                             })
      .def_property_readonly("batch_size", [](const PyBatch& b) { return b.batch.batch_size(); })
      .def_property_readonly("max_seq_length",
                             [](const PyBatch& b) { return b.batch.max_seq_length(); })
      .def_property_readonly("max_cache_length",
                             [](const PyBatch& b) { return b.batch.max_cache_length(); })
      .def_property_readonly("params", [](const PyBatch& b) { return b.batch.params(); })
      .def("increment_cache_lengths", &increment, py::arg("row_offsets"),
           "Same as the manager's increment_cache_lengths(self, row_offsets).")
      .def("__repr__", [](const PyBatch& b) {
        return "KVCacheInputs(batch_size=" + std::to_string(b.batch.batch_size()) +
               ", max_seq_length=" + std::to_string(b.batch.max_seq_length()) +
               ", max_cache_length=" + std::to_string(b.batch.max_cache_length()) +
               ", is_cache_empty=" + (b.is_cache_empty ? "True" : "False") + ")";
      });
}

// ---- input_symbols ------------------------------------------------------------------

// A tensor's name, dtype and shape; symbolic dims are strings (MAX's TensorType).
struct TensorType {
  std::string name;
  py::dtype dtype;
  std::vector<std::variant<std::uint64_t, std::string>> shape;
};

py::list input_symbols(const KVCacheManager& m) {
  const KVCacheParams& p = m.params();
  std::vector<std::variant<std::uint64_t, std::string>> blocks;
  for (std::size_t d : m.block_shape(m.total_blocks())) blocks.emplace_back(std::uint64_t{d});
  TensorType lookup{"lookup_table", py::dtype::of<std::uint32_t>(), {"batch_size"}};
  if (p.cache_strategy == CacheStrategy::paged) lookup.shape.emplace_back("max_pages_per_seq");
  py::list out;
  for (std::uint32_t d = 0; d < p.n_devices; ++d) {
    out.append(
        py::make_tuple(TensorType{"blocks", numpy_dtype(p.dtype), blocks},
                       TensorType{"cache_lengths", py::dtype::of<std::uint32_t>(), {"batch_size"}},
                       lookup, TensorType{"is_cache_empty", py::dtype::of<bool>(), {}}));
  }
  return out;
}

void bind_tensor_type(py::module_& m) {
  py::class_<TensorType>(m, "TensorType",
                         "Name, NumPy dtype and shape of one fetch output; symbolic dimensions "
                         "('batch_size', 'max_pages_per_seq') are strings.")
      .def_readonly("name", &TensorType::name)
      .def_readonly("dtype", &TensorType::dtype)
      .def_readonly("shape", &TensorType::shape)
      .def("__repr__", [](const TensorType& t) {
        std::string dims;
        for (const auto& d : t.shape) {
          if (!dims.empty()) dims += ", ";
          dims += std::holds_alternative<std::string>(d)
                      ? std::get<std::string>(d)
                      : std::to_string(std::get<std::uint64_t>(d));
        }
        return "TensorType(" + t.name + ", " + t.dtype.attr("name").cast<std::string>() + ", [" +
               dims + "])";
      });
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

std::unique_ptr<PyBatch> fetch(KVCacheManager& m, const py::handle& seq_ids,
                               const py::handle& num_new_tokens, const py::handle& num_steps) {
  const std::vector<SeqId> seqs = to_seq_ids(seq_ids);
  const auto news = to_u32_vector(num_new_tokens, "num_new_tokens", seqs.size(), 1);
  auto out = std::make_unique<PyBatch>();
  const std::uint32_t steps = to_u32(num_steps, "num_steps");
  unlocked([&] { m.fetch_into(out->batch, seqs, news, steps); });
  out->sync();
  return out;
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

template <class Manager>
void bind_lifecycle(py::class_<Manager>& cls) {
  cls.def(
         "claim",
         [](Manager& m, const py::handle& n) {
           const std::uint32_t count = to_u32(n, "n");
           return unlocked([&] { return m.claim(count); });
         },
         py::arg("n") = 1, "n new sequence ids with cache length 0 (all or nothing).")
      .def(
          "fetch",
          [](Manager& m, const py::handle& seqs, const py::handle& news, const py::handle& steps) {
            return fetch(m, seqs, news, steps);
          },
          py::arg("seq_ids"), py::arg("num_new_tokens") = py::none(), py::arg("num_steps") = 1,
          py::keep_alive<0, 1>(),
          "Room for cache_length + num_new_tokens + num_steps - 1 tokens per sequence; "
          "returns KVCacheInputs. num_new_tokens: an int for all, one per seq, or None (1).")
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
      .def("__contains__",
           [](const Manager& m, SeqId s) { return unlocked([&] { return m.contains(s); }); })
      .def(
          "block_shape",
          [](const Manager& m, const py::handle& n) {
            return m.block_shape(to_u32(n, "n_sequences"));
          },
          py::arg("n_sequences"))
      .def(
          "increment_cache_lengths",
          [](const Manager&, py::object inputs, const py::handle& prev) {
            increment(inputs.cast<PyBatch&>(), prev);
            return inputs;
          },
          py::arg("kv_cache_inputs"), py::arg("prev_model_inputs"),
          "Advances a fetched batch for the next decode step (multistep): cache_lengths += "
          "tokens of the previous step given as row offsets; returns the same KVCacheInputs, "
          "updated in place, with is_cache_empty False.")
      .def("input_symbols", [](const Manager& m) { return input_symbols(m); })
      .def("snapshot",
           [](const Manager& m) { return snapshot_dict(unlocked([&] { return m.snapshot(); })); })
      .def("check_invariants", [](const Manager& m) { unlocked([&] { m.check_invariants(); }); })
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
      .def_property_readonly("used_blocks", [](const Manager& m) {
        return unlocked([&] { return m.used_blocks(); });
      });
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
        "prefix caching, pages that became full are published. Without token_ids the "
        "sequence's later pages are never published.");
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
  cls.def(py::init([](const KVCacheParams& params, const py::handle& max_batch,
                      const py::handle& max_seq_len, const py::object& num_layers,
                      const py::object& devices) {
            return std::make_unique<M>(resolve_params(params, num_layers, devices),
                                       to_u32(max_batch, "max_cache_batch_size"),
                                       to_u32(max_seq_len, "max_seq_len"));
          }),
          py::arg("params"), py::arg("max_cache_batch_size"), py::arg("max_seq_len"),
          py::arg("num_layers") = py::none(), py::arg("devices") = py::none())
      .def_static(
          "estimated_memory_size",
          [](const KVCacheParams& params, const py::handle& max_batch,
             const py::handle& max_seq_len, const py::object& num_layers,
             const py::object& devices) {
            return M::estimated_memory_size(resolve_params(params, num_layers, devices),
                                            to_u32(max_batch, "max_cache_batch_size"),
                                            to_u32(max_seq_len, "max_seq_len"));
          },
          py::arg("params"), py::arg("max_cache_batch_size"), py::arg("max_seq_len"),
          py::arg("num_layers") = py::none(), py::arg("devices") = py::none(),
          "Bytes of the blocks over all devices.");
  bind_lifecycle(cls);
}

// ---- prefix caching -----------------------------------------------------------------

// One PageEvent as a Python object (the C++ event's token span is copied).
struct PyPageEvent {
  std::string kind;  // "stored" | "removed"
  std::uint32_t page = 0;
  std::uint64_t hash = 0;
  std::uint64_t parent_hash = 0;
  std::uint64_t extra_key = 0;
  std::vector<std::uint32_t> tokens;
};

// The C++ on_event callback for a Python callable. It runs under the
// manager's mutex, in whatever thread made the call (which released the GIL,
// see `unlocked`), so it takes the GIL. A Python exception never reaches C++:
// it is reported through sys.unraisablehook (printed by default) and the
// manager carries on. The callable is held by a shared_ptr whose deleter takes
// the GIL, so copies of the std::function need no GIL.
std::function<void(const PageEvent&)> event_trampoline(py::object callback) {
  if (!PyCallable_Check(callback.ptr())) {
    throw InvalidArgument("on_event must be callable, got " +
                          py::str(py::type::of(callback)).cast<std::string>());
  }
  std::shared_ptr<py::object> fn(new py::object(std::move(callback)), [](py::object* o) {
    py::gil_scoped_acquire gil;
    delete o;
  });
  return [fn](const PageEvent& e) noexcept {
    py::gil_scoped_acquire gil;
    try {
      PyPageEvent ev{e.kind == PageEvent::Kind::stored ? "stored" : "removed",
                     e.page,
                     e.hash,
                     e.parent_hash,
                     e.extra_key,
                     {e.tokens.begin(), e.tokens.end()}};
      (*fn)(std::move(ev));
    } catch (py::error_already_set& err) {
      err.discard_as_unraisable("kvcache.PagedKVCacheManager on_event callback");
    } catch (const std::exception& err) {
      PyErr_SetString(PyExc_RuntimeError, err.what());
      PyErr_WriteUnraisable(fn->ptr());
    }
  };
}

// The prefix-cache configuration from the constructor's keywords; any of them
// without params.enable_prefix_caching is an error (the C++ would ignore it).
PrefixCacheConfig prefix_config(const KVCacheParams& p, const py::object& policy,
                                const py::object& on_event, const py::object& small_fraction,
                                const py::object& ghost_factor) {
  PrefixCacheConfig c;
  const bool any = !policy.is_none() || !on_event.is_none() || !small_fraction.is_none() ||
                   !ghost_factor.is_none();
  if (any && !p.enable_prefix_caching) {
    throw InvalidArgument(
        "eviction_policy / on_event / s3fifo_small_fraction / ghost_factor need "
        "params.enable_prefix_caching=True");
  }
  if (!policy.is_none()) {
    if (!py::isinstance<py::str>(policy)) {
      throw InvalidArgument("eviction_policy must be a str (lru, s3fifo, tiered, interval)");
    }
    c.policy = parse_policy(policy.cast<std::string>());
  }
  if (!small_fraction.is_none()) c.s3fifo_small_fraction = small_fraction.cast<double>();
  if (!ghost_factor.is_none()) c.ghost_factor = ghost_factor.cast<double>();
  if (!on_event.is_none()) c.on_event = event_trampoline(on_event);
  return c;
}

void bind_prefix_types(py::module_& m) {
  py::class_<PyPageEvent>(m, "PageEvent",
                          "A page entering ('stored') or leaving ('removed') the prefix cache's "
                          "hash index, as passed to on_event.")
      .def_readonly("kind", &PyPageEvent::kind)
      .def_readonly("page", &PyPageEvent::page)
      .def_readonly("hash", &PyPageEvent::hash)
      .def_readonly("parent_hash", &PyPageEvent::parent_hash)
      .def_readonly("extra_key", &PyPageEvent::extra_key)
      .def_readonly("tokens", &PyPageEvent::tokens)
      .def("__repr__", [](const PyPageEvent& e) {
        return "PageEvent(" + e.kind + ", page=" + std::to_string(e.page) +
               ", hash=" + std::to_string(e.hash) + ")";
      });
  using PM = PrefixCacheMetrics;
  py::class_<PM>(m, "PrefixCacheMetrics",
                 "Prefix-cache counters since construction or reset_metrics(); page gauges "
                 "are current. Read-only.")
      .def_readonly("pages_total", &PM::pages_total)
      .def_readonly("pages_free", &PM::pages_free)
      .def_readonly("pages_used", &PM::pages_used)
      .def_readonly("pages_cached", &PM::pages_cached)
      .def_readonly("pages_pinned", &PM::pages_pinned)
      .def_readonly("match_calls", &PM::match_calls)
      .def_readonly("prompt_tokens", &PM::prompt_tokens)
      .def_readonly("reused_tokens", &PM::reused_tokens)
      .def_readonly("pages_published", &PM::pages_published)
      .def_readonly("evictions", &PM::evictions)
      .def_readonly("cow_copies", &PM::cow_copies)
      .def_property_readonly("hit_rate", &PM::hit_rate)
      .def("as_dict",
           [](const PM& x) {
             py::dict d;
             d["pages_total"] = x.pages_total;
             d["pages_free"] = x.pages_free;
             d["pages_used"] = x.pages_used;
             d["pages_cached"] = x.pages_cached;
             d["pages_pinned"] = x.pages_pinned;
             d["match_calls"] = x.match_calls;
             d["prompt_tokens"] = x.prompt_tokens;
             d["reused_tokens"] = x.reused_tokens;
             d["pages_published"] = x.pages_published;
             d["evictions"] = x.evictions;
             d["cow_copies"] = x.cow_copies;
             d["hit_rate"] = x.hit_rate();
             return d;
           })
      .def("__repr__", [](const PM& x) {
        return "PrefixCacheMetrics(hit_rate=" + std::to_string(x.hit_rate()) +
               ", reused_tokens=" + std::to_string(x.reused_tokens) +
               ", prompt_tokens=" + std::to_string(x.prompt_tokens) +
               ", pages_cached=" + std::to_string(x.pages_cached) +
               ", evictions=" + std::to_string(x.evictions) + ")";
      });
}

void bind_prefix_methods(py::class_<PagedKVCacheManager>& cls) {
  using M = PagedKVCacheManager;
  cls.def(
         "match_prefix",
         [](M& m, const py::handle& seq, const py::handle& tokens, const py::handle& extra) {
           const SeqId id = to_seq_ids(seq).at(0);
           const auto t = to_u32_vector(tokens, "prompt_tokens");
           const std::uint64_t key = to_u64(extra, "extra_key");
           return unlocked([&] { return m.match_prefix(id, t, key); });
         },
         py::arg("seq_id"), py::arg("prompt_tokens"), py::arg("extra_key") = 0,
         "Attaches the cached pages of the longest cached full-page prefix of prompt_tokens "
         "(under extra_key) to a freshly claimed sequence and returns the tokens reused "
         "(always leaves at least one prompt token to compute). Then fetch/step the rest.")
      .def(
          "release",
          [](M& m, const py::handle& seq, const std::string& hint) {
            const SeqId id = to_seq_ids(seq).at(0);
            const ReuseHint h = parse_reuse_hint(hint);
            unlocked([&] { m.release(id, h); });
          },
          py::arg("seq_id"), py::arg("hint"),
          "Releases the sequence telling the eviction policy whether a later request is "
          "expected to start with its tokens: hint 'likely' | 'unlikely' | 'unknown' (only "
          "the 'tiered' policy acts on it).")
      .def(
          "fork",
          [](M& m, const py::handle& seq) {
            const SeqId id = to_seq_ids(seq).at(0);
            return unlocked([&] { return m.fork(id); });
          },
          py::arg("seq_id"),
          "A new sequence sharing seq's pages (copy-on-write on the first write into a shared "
          "page); returns its id.")
      .def(
          "truncate",
          [](M& m, const py::handle& seq, const py::handle& length) {
            const SeqId id = to_seq_ids(seq).at(0);
            const std::uint32_t n = to_u32(length, "new_length");
            unlocked([&] { m.truncate(id, n); });
          },
          py::arg("seq_id"), py::arg("new_length"),
          "Rolls seq back to new_length (<= cache_length) tokens.")
      .def(
          "pin_prefix",
          [](M& m, const py::handle& tokens, const py::handle& priority, const py::handle& extra) {
            const auto t = to_u32_vector(tokens, "tokens");
            const std::uint32_t prio = to_u32(priority, "priority");
            const std::uint64_t key = to_u64(extra, "extra_key");
            return unlocked([&] { return m.pin_prefix(t, prio, key); });
          },
          py::arg("tokens"), py::arg("priority") = 1, py::arg("extra_key") = 0,
          "Pins the cached full pages of this prefix (evicted last, lowest priority first); "
          "priority 0 unpins. Returns the tokens covered.")
      .def("reset_prefix_cache", [](M& m) { unlocked([&] { m.reset_prefix_cache(); }); })
      .def("metrics", [](const M& m) { return unlocked([&] { return m.metrics(); }); })
      .def("reset_metrics", [](M& m) { unlocked([&] { m.reset_metrics(); }); });
}

void bind_paged(py::module_& m) {
  using M = PagedKVCacheManager;
  py::class_<M> cls(m, "PagedKVCacheManager",
                    "A paged manager: one pool of page_size-token pages, one page table per "
                    "sequence. The pool is total_num_pages, or what fits in cache_memory bytes, "
                    "or (neither) enough for every sequence to reach max_seq_len.");
  cls.def(py::init([](const KVCacheParams& params, const py::handle& max_batch,
                      const py::handle& max_seq_len, const py::object& num_layers,
                      const py::object& devices, const py::object& total_num_pages,
                      const py::object& cache_memory, const py::object& policy,
                      const py::object& on_event, const py::object& small_fraction,
                      const py::object& ghost_factor) {
            const KVCacheParams p = resolve_params(params, num_layers, devices);
            const std::uint32_t batch = to_u32(max_batch, "max_cache_batch_size");
            const std::uint32_t seq = to_u32(max_seq_len, "max_seq_len");
            const std::uint32_t pages = resolve_pages(p, batch, seq, total_num_pages, cache_memory);
            PrefixCacheConfig config =
                prefix_config(p, policy, on_event, small_fraction, ghost_factor);
            return std::make_unique<M>(p, pages, batch, seq, std::move(config));
          }),
          py::arg("params"), py::arg("max_cache_batch_size"), py::arg("max_seq_len"),
          py::arg("num_layers") = py::none(), py::arg("devices") = py::none(), py::kw_only(),
          py::arg("total_num_pages") = py::none(), py::arg("cache_memory") = py::none(),
          py::arg("eviction_policy") = py::none(), py::arg("on_event") = py::none(),
          py::arg("s3fifo_small_fraction") = py::none(), py::arg("ghost_factor") = py::none())
      .def_static(
          "estimated_memory_size",
          [](const KVCacheParams& params, const py::handle& max_batch,
             const py::handle& max_seq_len, const py::object& num_layers, const py::object& devices,
             const py::object& total_num_pages, const py::object& cache_memory) {
            const KVCacheParams p = resolve_params(params, num_layers, devices);
            const std::uint32_t pages =
                resolve_pages(p, to_u32(max_batch, "max_cache_batch_size"),
                              to_u32(max_seq_len, "max_seq_len"), total_num_pages, cache_memory);
            return M::estimated_memory_size(p, pages);
          },
          py::arg("params"), py::arg("max_cache_batch_size"), py::arg("max_seq_len"),
          py::arg("num_layers") = py::none(), py::arg("devices") = py::none(), py::kw_only(),
          py::arg("total_num_pages") = py::none(), py::arg("cache_memory") = py::none(),
          "Bytes of the pool the constructor would allocate with the same arguments.")
      .def_static(
          "pages_for_memory",
          [](const KVCacheParams& params, std::size_t bytes) {
            return M::pages_for_memory(params, bytes);
          },
          py::arg("params"), py::arg("memory_bytes"))
      .def_property_readonly("page_size", &M::page_size)
      .def_property_readonly("total_num_pages", &M::total_blocks);
  bind_lifecycle(cls);
  bind_prefix_methods(cls);
}

}  // namespace

void bind_managers(py::module_& m) {
  bind_inputs(m);
  bind_tensor_type(m);
  bind_continuous(m);
  bind_prefix_types(m);
  bind_paged(m);
}

}  // namespace kvcache::python
