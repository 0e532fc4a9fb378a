// python/managers.cpp — ContinuousBatchingKVCacheManager, PagedKVCacheManager
// and KVCacheInputs (what fetch returns) for Python.
//
// Zero copy: KVCacheInputs' arrays view C++ memory. `blocks` views the
// manager's block buffer (writable: model code stores K/V there);
// `cache_lengths`, `lookup_table`, `reserved_lengths` and `is_cache_empty` view
// the C++ KVCacheBatch (read-only; increment_cache_lengths changes them in
// place). Every view keeps its KVCacheInputs alive, which keeps the manager
// alive (keep_alive on fetch), so an array can never dangle.
#include <string>
#include <variant>

#include "py_common.h"

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
    return PagedKVCacheManager::pages_for_memory(p, cache_memory.cast<std::size_t>());
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
  std::vector<py::ssize_t> shape = {
      b.num_blocks(), 2, p.num_layers, b.block_tokens(), p.n_kv_heads_per_device(), p.head_dim};
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
  return out;
}

std::unique_ptr<PyBatch> fetch(KVCacheManager& m, const py::handle& seq_ids,
                               const py::handle& num_new_tokens, const py::handle& num_steps) {
  const std::vector<SeqId> seqs = to_seq_ids(seq_ids);
  const auto news = to_u32_vector(num_new_tokens, "num_new_tokens", seqs.size(), 1);
  auto out = std::make_unique<PyBatch>();
  m.fetch_into(out->batch, seqs, news, to_u32(num_steps, "num_steps"));
  out->sync();
  return out;
}

void step(KVCacheManager& m, const py::handle& seq_ids, const py::handle& valid_lengths) {
  std::vector<SeqId> seqs;
  std::vector<std::uint32_t> valid;
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
  m.step(seqs, valid);
}

template <class Manager>
void bind_lifecycle(py::class_<Manager>& cls) {
  cls.def(
         "claim", [](Manager& m, const py::handle& n) { return m.claim(to_u32(n, "n")); },
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
          "step",
          [](Manager& m, const py::handle& seqs, const py::handle& valid) { step(m, seqs, valid); },
          py::arg("seq_ids"), py::arg("valid_lengths") = py::none(),
          "Commits valid_lengths[b] tokens for seq_ids[b] (or step({seq_id: n})).")
      .def(
          "release", [](Manager& m, const py::handle& seq) { m.release(to_seq_ids(seq).at(0)); },
          py::arg("seq_id"))
      .def(
          "cache_length",
          [](const Manager& m, const py::handle& s) { return m.cache_length(to_seq_ids(s).at(0)); },
          py::arg("seq_id"))
      .def(
          "contains", [](const Manager& m, SeqId s) { return m.contains(s); }, py::arg("seq_id"))
      .def("__contains__", [](const Manager& m, SeqId s) { return m.contains(s); })
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
      .def("snapshot", [](const Manager& m) { return snapshot_dict(m.snapshot()); })
      .def("check_invariants", &Manager::check_invariants)
      .def_property_readonly("params", [](const Manager& m) { return m.params(); })
      .def_property_readonly("num_layers", [](const Manager& m) { return m.params().num_layers; })
      .def_property_readonly("max_cache_batch_size", &Manager::max_batch_size)
      .def_property_readonly("max_seq_len", &Manager::max_seq_len)
      .def_property_readonly("num_active_sequences", &Manager::num_active_sequences)
      .def_property_readonly("total_blocks", &Manager::total_blocks)
      .def_property_readonly("free_blocks", &Manager::free_blocks)
      .def_property_readonly("used_blocks", &Manager::used_blocks);
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

void bind_paged(py::module_& m) {
  using M = PagedKVCacheManager;
  py::class_<M> cls(m, "PagedKVCacheManager",
                    "A paged manager: one pool of page_size-token pages, one page table per "
                    "sequence. The pool is total_num_pages, or what fits in cache_memory bytes, "
                    "or (neither) enough for every sequence to reach max_seq_len.");
  cls.def(py::init([](const KVCacheParams& params, const py::handle& max_batch,
                      const py::handle& max_seq_len, const py::object& num_layers,
                      const py::object& devices, const py::object& total_num_pages,
                      const py::object& cache_memory) {
            const KVCacheParams p = resolve_params(params, num_layers, devices);
            const std::uint32_t batch = to_u32(max_batch, "max_cache_batch_size");
            const std::uint32_t seq = to_u32(max_seq_len, "max_seq_len");
            return std::make_unique<M>(
                p, resolve_pages(p, batch, seq, total_num_pages, cache_memory), batch, seq);
          }),
          py::arg("params"), py::arg("max_cache_batch_size"), py::arg("max_seq_len"),
          py::arg("num_layers") = py::none(), py::arg("devices") = py::none(), py::kw_only(),
          py::arg("total_num_pages") = py::none(), py::arg("cache_memory") = py::none())
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
}

}  // namespace

void bind_managers(py::module_& m) {
  bind_inputs(m);
  bind_tensor_type(m);
  bind_continuous(m);
  bind_paged(m);
}

}  // namespace kvcache::python
