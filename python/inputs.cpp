// python/inputs.cpp — what fetch returns (kvcache.KVCacheInputs and the
// kvcache.KVCacheBatch behind it), MAX's increment_cache_lengths, and
// input_symbols.
//
// MAX's fetch returns a list with one (blocks, cache_lengths, lookup_table,
// is_cache_empty) tuple per device; so does ours: KVCacheInputs is a `list`
// subclass (defined in Python below, since pybind11 classes cannot derive
// from list) whose items are those tuples, with the richer attributes
// (.blocks of device 0, .cache_lengths, .reserved_lengths, .block_copies,
// a pool apart's .block_offloads / .block_loads, ...) forwarded to its
// `batch`, a KVCacheBatch.
//
// Zero copy and no dangling: every array views C++ memory and has the
// KVCacheBatch as its NumPy base. `blocks` views the manager's block buffer
// (writable: model code stores K/V there), a pool apart's block_offloads the
// manager's staging slots (writable: the caller copies pages in); the others
// view the batch's own vectors (read-only). The KVCacheBatch holds a strong
// reference to its manager, so a view keeps the memory it points into alive
// for as long as it lives. (pybind11's keep_alive cannot target a list: no weakrefs.)
#include <pybind11/eval.h>

#include <string>
#include <variant>

#include "py_common.h"
#include "repr.h"

namespace kvcache::python {

namespace {

// ---- views --------------------------------------------------------------------------

py::array read_only(py::array a) {
  a.attr("flags").attr("writeable") = false;
  return a;
}

py::array u32_view(const py::handle& base, std::span<const std::uint32_t> values,
                   std::vector<py::ssize_t> shape) {
  return read_only(
      py::array(py::dtype::of<std::uint32_t>(), std::move(shape), values.data(), base));
}

py::array blocks_view(const py::handle& self, std::uint32_t device) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  const KVCacheParams& p = b.params();
  void* const data = b.blocks(device);  // throws InvalidArgument for a bad device
  // [blocks][2][layers] (interleaved) or [layers][2][blocks] (per_layer),
  // then [tokens][heads] (NHD) or [heads][tokens] (HND).
  const py::ssize_t tokens = b.page_size(), heads = p.n_kv_heads_per_device();
  const bool hnd = p.page_layout == PageLayout::hnd;
  const bool per_layer = p.pool_arrangement == PoolArrangement::per_layer;
  const py::ssize_t blocks = b.num_blocks(), layers = p.num_layers;
  std::vector<py::ssize_t> shape = {per_layer ? layers : blocks, 2,
                                    per_layer ? blocks : layers, hnd ? heads : tokens,
                                    hnd ? tokens : heads,        p.head_dim};
  return py::array(numpy_dtype(p.dtype), std::move(shape), data, self);
}

py::array cache_lengths_view(const py::handle& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  return u32_view(self, b.cache_lengths(), {b.batch_size()});
}

py::array reserved_lengths_view(const py::handle& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  return u32_view(self, b.reserved_lengths(), {b.batch_size()});
}

py::array lookup_table_view(const py::handle& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  if (b.strategy() == CacheStrategy::continuous) {
    return u32_view(self, b.lookup_table(), {b.batch_size()});
  }
  return u32_view(self, b.lookup_table(), {b.batch_size(), b.lookup_stride()});
}

// [n, 2] (src, dst): the copy-on-write copies the fetch made.
py::array block_copies_view(const py::handle& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  const std::span<const BlockCopy> c = b.block_copies();
  static_assert(sizeof(BlockCopy) == 2 * sizeof(std::uint32_t));
  return u32_view(self,
                  std::span<const std::uint32_t>(reinterpret_cast<const std::uint32_t*>(c.data()),
                                                 2 * c.size()),
                  {static_cast<py::ssize_t>(c.size()), 2});
}

// pool_apart: [(page, slot)], each slot a writable uint8 view of a staging
// slot (one page packed [2][num_layers][block]).
py::list block_offloads_list(const py::handle& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  py::list out;
  for (const BlockOffload& o : b.block_offloads()) {
    const py::array slot(py::dtype::of<std::uint8_t>(),
                         std::vector<py::ssize_t>{static_cast<py::ssize_t>(o.bytes.size())},
                         o.bytes.data(), self);
    out.append(py::make_tuple(o.page, slot));
  }
  return out;
}

// pool_apart: [n] pages to copy from the host pool (blocks) into the caller's.
py::array block_loads_view(const py::handle& self) {
  const KVCacheBatch& b = self.cast<PyBatch&>().batch;
  return u32_view(self, b.block_loads(), {static_cast<py::ssize_t>(b.block_loads().size())});
}

py::array is_cache_empty_view(const py::handle& self) {
  PyBatch& batch = self.cast<PyBatch&>();
  return read_only(
      py::array(py::dtype::of<bool>(), std::vector<py::ssize_t>{}, &batch.is_cache_empty, self));
}

// (blocks, cache_lengths, lookup_table, is_cache_empty) of one device.
py::tuple device_tuple(const py::handle& self, std::uint32_t device) {
  return py::make_tuple(blocks_view(self, device), cache_lengths_view(self),
                        lookup_table_view(self), is_cache_empty_view(self));
}

py::list per_device(const py::handle& self) {
  py::list out;
  const std::uint32_t n = self.cast<PyBatch&>().batch.params().n_devices;
  for (std::uint32_t d = 0; d < n; ++d) out.append(device_tuple(self, d));
  return out;
}

void increment_in_place(PyBatch& batch, const py::handle& row_offsets) {
  const auto offsets = to_u32_vector(row_offsets, "row_offsets");
  batch.batch.increment_cache_lengths(offsets);
  batch.sync();
}

void bind_batch(py::module_& m) {
  py::class_<PyBatch>(m, "KVCacheBatch",
                      "The C++ batch of one fetch (KVCacheInputs.batch). Its arrays view C++ "
                      "memory (no copy) and keep this object, which keeps the manager, alive.")
      .def_property_readonly(
          "blocks", [](py::handle self) { return blocks_view(self, 0); },
          "device 0's whole block buffer (writable), shaped block_shape(total_blocks)")
      .def_property_readonly("cache_lengths", &cache_lengths_view,
                             "uint32 [batch]: committed tokens per entry (read-only)")
      .def_property_readonly("lookup_table", &lookup_table_view,
                             "uint32 [batch] slots (continuous) or [batch, pages] page ids "
                             "(paged; unused entries hold total_num_pages)")
      .def_property_readonly("is_cache_empty", &is_cache_empty_view,
                             "0-d bool array: every cache length is 0")
      .def_property_readonly("reserved_lengths", &reserved_lengths_view,
                             "uint32 [batch]: tokens the fetch guaranteed room for")
      .def_property_readonly("block_copies", &block_copies_view,
                             "uint32 [n, 2]: the copy-on-write copies (src, dst) the fetch made")
      .def_property_readonly(
          "block_offloads", counted(&block_offloads_list),
          "pool_apart: [(page, slot)] write-backs: copy page `page` of your pool into `slot` "
          "(a writable uint8 view of a staging slot, one page packed [2][num_layers][block]) "
          "before this batch's kernels, then call the manager's complete_offloads; empty "
          "otherwise")
      .def_property_readonly(
          "block_loads", &block_loads_view,
          "pool_apart: uint32 [n] pages a tier loaded: copy each from blocks (the host pool) "
          "into your pool, after block_offloads and before block_copies; empty otherwise")
      .def_property_readonly("seq_ids",
                             [](const PyBatch& b) {
                               auto ids = b.batch.seq_ids();
                               return std::vector<SeqId>(ids.begin(), ids.end());
                             })
      .def_property_readonly("batch_size", [](const PyBatch& b) { return b.batch.batch_size(); })
      .def_property_readonly("max_seq_length",
                             [](const PyBatch& b) { return b.batch.max_seq_length(); })
      .def_property_readonly(
          "max_cache_length", [](const PyBatch& b) { return b.batch.max_cache_length(); },
          "MAX's max_cache_length: the most cache_lengths[b] (history, before this step's "
          "tokens); increment_cache_lengths advances it by the previous max_seq_length")
      .def_property_readonly(
          "max_full_context_length",
          [](const PyBatch& b) { return b.batch.max_full_context_length(); },
          "the most cache_lengths[b] + new tokens of an entry")
      .def_property_readonly("params", [](const PyBatch& b) { return b.batch.params(); })
      .def("device",
           counted([](py::handle self, std::uint32_t d) { return device_tuple(self, d); }),
           py::arg("device"), "(blocks, cache_lengths, lookup_table, is_cache_empty) of a device")
      .def("per_device", counted(&per_device), "one such tuple per device")
      .def("increment_cache_lengths", &increment_in_place, py::arg("row_offsets"),
           "In place: cache_lengths += the previous step's tokens (row offsets, batch + 1 "
           "values); every array of this batch sees it. The manager's "
           "increment_cache_lengths returns a new KVCacheInputs instead.")
      .def("__repr__", [](const PyBatch& b) { return batch_repr(b); });
}

// KVCacheInputs: a list of per-device tuples with the batch's attributes.
constexpr const char* kInputsClass = R"PY(
class KVCacheInputs(list):
    """What fetch returns: as MAX, a list with one (blocks, cache_lengths,
    lookup_table, is_cache_empty) tuple per device, so kv_cache_inputs[0] is
    device 0's tuple. The arrays view C++ memory (no copy) and keep the
    manager alive. `batch` is the kvcache.KVCacheBatch behind them; its
    attributes (blocks of device 0, cache_lengths, lookup_table,
    is_cache_empty, reserved_lengths, block_copies, block_offloads, block_loads,
    seq_ids, batch_size, max_seq_length, max_cache_length, params) are readable
    here too. Made by fetch and increment_cache_lengths (no Python code runs to
    make one)."""

    def device(self, device):
        """(blocks, cache_lengths, lookup_table, is_cache_empty) of a device."""
        return self.batch.device(device)

    def per_device(self):
        """The per-device tuples as a plain list."""
        return list(self)

    def increment_cache_lengths(self, row_offsets):
        """In place: see KVCacheBatch.increment_cache_lengths."""
        self.batch.increment_cache_lengths(row_offsets)

    def __repr__(self):
        return "KVCacheInputs" + repr(self.batch)[len("KVCacheBatch"):]


def _kvcache_forward(name):
    return property(lambda self: getattr(self.batch, name),
                    doc=getattr(KVCacheBatch, name).__doc__)


for _name in ("blocks", "cache_lengths", "lookup_table", "is_cache_empty", "reserved_lengths",
              "block_copies", "block_offloads", "block_loads", "seq_ids", "batch_size",
              "max_seq_length", "max_cache_length",
              "max_full_context_length", "params"):
    setattr(KVCacheInputs, _name, _kvcache_forward(_name))
del _name, _kvcache_forward
)PY";

// ---- MAX's increment_cache_lengths ------------------------------------------------------

// The previous step's row offsets inside MAX's prev_model_inputs: its
// `input_row_offsets` attribute, else the last element of a tuple / list
// whose last element is itself an array or sequence (MAX passes
// (tokens, input_row_offsets)), else the object itself (an array or a
// sequence of ints).
py::object row_offsets_of(const py::handle& prev) {
  if (py::hasattr(prev, "input_row_offsets")) return prev.attr("input_row_offsets");
  if ((PyTuple_Check(prev.ptr()) || PyList_Check(prev.ptr())) && py::len(prev) > 0) {
    py::object last = prev.cast<py::sequence>()[py::len(prev) - 1];
    if (PySequence_Check(last.ptr()) && !py::isinstance<py::str>(last)) return last;
  }
  return py::reinterpret_borrow<py::object>(prev);
}

// The batch of a per-device tuple, and its device; nullptr if `t` is not one.
PyBatch* batch_of_tuple(const py::handle& t, std::uint32_t& device) {
  if (!PyTuple_Check(t.ptr()) || PyTuple_GET_SIZE(t.ptr()) != 4) return nullptr;
  const py::object base = py::getattr(PyTuple_GET_ITEM(t.ptr(), 1), "base", py::none());
  if (!py::isinstance<PyBatch>(base)) return nullptr;
  PyBatch& batch = base.cast<PyBatch&>();  // kept alive by the tuple's array
  const py::handle blocks = PyTuple_GET_ITEM(t.ptr(), 0);
  if (!py::isinstance<py::array>(blocks)) return nullptr;
  const void* data = py::reinterpret_borrow<py::array>(blocks).data();
  for (std::uint32_t d = 0; d < batch.batch.params().n_devices; ++d) {
    if (batch.batch.blocks(d) == data) {
      device = d;
      return &batch;
    }
  }
  return nullptr;
}

}  // namespace

BatchRef batch_of(const py::handle& inputs, const char* what) {
  if (py::isinstance<PyBatch>(inputs)) return {inputs.cast<PyBatch&>(), std::nullopt};
  const py::object attr = py::getattr(inputs, "batch", py::none());
  if (py::isinstance<PyBatch>(attr)) return {attr.cast<PyBatch&>(), std::nullopt};
  std::uint32_t device = 0;
  if (PyBatch* b = batch_of_tuple(inputs, device)) return {*b, device};
  if ((PyList_Check(inputs.ptr()) || PyTuple_Check(inputs.ptr())) && py::len(inputs) > 0) {
    if (PyBatch* b = batch_of_tuple(inputs.cast<py::sequence>()[0], device)) {
      return {*b, std::nullopt};
    }
  }
  throw InvalidArgument(std::string(what) + " is " + py::repr(inputs).cast<std::string>() +
                        ": pass what fetch returned (a kvcache.KVCacheInputs) or one of its "
                        "per-device tuples");
}

namespace {
// kvcache.KVCacheInputs, kept from bind_inputs on (a leaked reference: the
// class lives as long as the module).
PyObject* inputs_class = nullptr;
}  // namespace

py::object make_inputs(std::unique_ptr<PyBatch> batch) {
  // list.__new__ and list.__init__: C code, no Python bytecode runs while the
  // list is made (see shutdown.cpp); then the tuples and the batch.
  py::object inputs = py::reinterpret_borrow<py::object>(inputs_class)();
  py::object obj = py::cast(std::move(batch));
  const std::uint32_t n = obj.cast<PyBatch&>().batch.params().n_devices;
  for (std::uint32_t d = 0; d < n; ++d) {
    if (PyList_Append(inputs.ptr(), device_tuple(obj, d).ptr()) != 0) throw py::error_already_set();
  }
  inputs.attr("batch") = obj;
  return inputs;
}

py::object incremented_inputs(const py::handle& manager, const py::handle& kv_cache_inputs,
                              const py::handle& prev_model_inputs) {
  const BatchRef ref = batch_of(kv_cache_inputs, "kv_cache_inputs");
  if (!ref.batch.manager.is(manager)) {
    throw InvalidArgument("kv_cache_inputs were fetched from another manager");
  }
  const auto offsets =
      to_u32_vector(row_offsets_of(prev_model_inputs), "prev_model_inputs' row offsets");
  auto next = std::make_unique<PyBatch>();
  next->batch = ref.batch.batch;  // a copy: the inputs passed in stay as they were
  next->manager = ref.batch.manager;
  next->batch.increment_cache_lengths(offsets);  // throws: nothing changed
  next->sync();
  return make_inputs(std::move(next));
}

// ---- input_symbols ------------------------------------------------------------------

namespace {

// A tensor's name, dtype, shape and device; symbolic dims are strings (MAX's TensorType).
struct TensorType {
  std::string name;
  py::dtype dtype;
  std::vector<std::variant<std::uint64_t, std::string>> shape;
  std::uint32_t device = 0;
};

void bind_tensor_type(py::module_& m) {
  py::class_<TensorType>(m, "TensorType",
                         "Name, NumPy dtype, shape and device of one fetch output; symbolic "
                         "dimensions ('batch_size', 'max_pages_per_seq') are strings.")
      .def_readonly("name", &TensorType::name)
      .def_readonly("dtype", &TensorType::dtype)
      .def_readonly("shape", &TensorType::shape)
      .def_readonly("device", &TensorType::device)
      .def_property_readonly("rank", [](const TensorType& t) { return t.shape.size(); })
      .def("__repr__", [](const TensorType& t) {
        std::string dims;
        for (const auto& d : t.shape) {
          if (!dims.empty()) dims += ", ";
          dims += std::holds_alternative<std::string>(d)
                      ? std::get<std::string>(d)
                      : std::to_string(std::get<std::uint64_t>(d));
        }
        return "TensorType(" + t.name + ", " + t.dtype.attr("name").cast<std::string>() + ", [" +
               dims + "], device=" + std::to_string(t.device) + ")";
      });
}

}  // namespace

py::list input_symbols(const KVCacheManager& m) {
  const KVCacheParams& p = m.params();
  std::vector<std::variant<std::uint64_t, std::string>> blocks;
  for (std::size_t d : m.block_shape(m.total_blocks())) blocks.emplace_back(std::uint64_t{d});
  std::vector<std::variant<std::uint64_t, std::string>> lookup = {"batch_size"};
  if (p.cache_strategy == CacheStrategy::paged) lookup.emplace_back("max_pages_per_seq");
  py::list out;
  for (std::uint32_t d = 0; d < p.n_devices; ++d) {
    out.append(py::make_tuple(
        TensorType{"blocks", numpy_dtype(p.dtype), blocks, d},
        TensorType{"cache_lengths", py::dtype::of<std::uint32_t>(), {"batch_size"}, d},
        TensorType{"lookup_table", py::dtype::of<std::uint32_t>(), lookup, d},
        TensorType{"is_cache_empty", py::dtype::of<bool>(), {}, d}));
  }
  return out;
}

void bind_inputs(py::module_& m) {
  bind_batch(m);
  py::exec(kInputsClass, m.attr("__dict__"));
  inputs_class = py::object(m.attr("KVCacheInputs")).release().ptr();
  bind_tensor_type(m);
}

}  // namespace kvcache::python
