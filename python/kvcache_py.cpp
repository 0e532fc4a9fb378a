// python/kvcache_py.cpp — the `kvcache` Python module: errors, dtypes,
// KVCacheParams and the conversion helpers shared by the other binding files
// (managers.cpp: the managers and fetch results; kernels.cpp: store_kv and
// attention). See docs/python.md for the Python API and a worked example.
#include <Python.h>

#include <limits>
#include <new>
#include <string>

#include "dlpack.h"
#include "py_common.h"
#include "repr.h"

namespace kvcache::python {

namespace {

// ---- errors -----------------------------------------------------------------

// Builds `class name(*bases)` in module m. plain_str: use BaseException's
// __str__ (KeyError's would quote the message).
py::object make_exception(py::module_& m, const char* name, py::tuple bases, const char* doc,
                          bool plain_str = false) {
  py::module_ builtins = py::module_::import("builtins");
  py::dict ns;
  ns["__module__"] = m.attr("__name__");
  ns["__doc__"] = doc;
  if (plain_str) ns["__str__"] = builtins.attr("BaseException").attr("__str__");
  py::object cls = builtins.attr("type")(name, bases, ns);
  m.attr(name) = cls;
  return cls;
}

// Raises kvcache.<name> with the C++ message. The classes are looked up on the
// (already imported) module, so the binding keeps no global state.
void raise(const char* name, const std::exception& e) {
  py::object cls = py::module_::import("kvcache").attr(name);
  PyErr_SetString(cls.ptr(), e.what());
}

void translate_error(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const InvalidArgument& e) {
    raise("InvalidArgument", e);
  } catch (const UnknownSequence& e) {
    raise("UnknownSequence", e);
  } catch (const OutOfPages& e) {
    raise("OutOfPages", e);
  } catch (const CapacityExceeded& e) {
    raise("CapacityExceeded", e);
  } catch (const OutOfMemory& e) {
    raise("OutOfMemory", e);
  } catch (const Error& e) {
    raise("Error", e);
  } catch (const std::bad_alloc&) {  // host memory refused anywhere in a call
    raise("OutOfMemory", OutOfMemory("out of host memory (std::bad_alloc)"));
  }
}

void bind_errors(py::module_& m) {
  py::module_ b = py::module_::import("builtins");
  py::object error = make_exception(m, "Error", py::make_tuple(b.attr("Exception")),
                                    "Root of every error kvcache raises (C++ kvcache::Error).");
  make_exception(m, "InvalidArgument", py::make_tuple(error, b.attr("ValueError")),
                 "A malformed or inconsistent argument (C++ kvcache::InvalidArgument).");
  make_exception(m, "UnknownSequence",
                 py::make_tuple(error, b.attr("KeyError"), b.attr("ValueError")),
                 "A sequence id that is not claimed (C++ kvcache::UnknownSequence). Also a "
                 "ValueError, as MAX raises for a seq id that is not in the cache.",
                 /*plain_str=*/true);
  make_exception(m, "OutOfPages", py::make_tuple(error, b.attr("MemoryError")),
                 "The paged pool has too few free pages (C++ kvcache::OutOfPages).");
  make_exception(m, "CapacityExceeded", py::make_tuple(error, b.attr("ValueError")),
                 "A fixed limit (max_seq_len, max batch size, reserved room) would be "
                 "exceeded (C++ kvcache::CapacityExceeded). A ValueError: the request is "
                 "too large for the configured limits, memory is not exhausted.");
  make_exception(m, "OutOfMemory", py::make_tuple(error, b.attr("MemoryError")),
                 "Host memory for the cache could not be obtained (C++ kvcache::OutOfMemory).");
  py::register_exception_translator(&translate_error);
}

// ---- conversions --------------------------------------------------------------

[[noreturn]] void throw_not_int(const std::string& what) {
  throw InvalidArgument(what + " must be a non-negative integer or a sequence of them");
}

// A Python int as uint64; throws InvalidArgument for negatives and values past limit.
std::uint64_t u64_of(py::handle obj, const std::string& what, std::uint64_t limit) {
  if (!PyLong_Check(obj.ptr())) throw_not_int(what);
  const unsigned long long v = PyLong_AsUnsignedLongLong(obj.ptr());  // raises if < 0 or huge
  if (PyErr_Occurred() || v > limit) {
    PyErr_Clear();
    throw InvalidArgument(what + " is " + py::str(obj).cast<std::string>() + ": must be in [0, " +
                          std::to_string(limit) + "]");
  }
  return v;
}

// A 1-D integer array (or sequence) as uint64 values, each <= limit.
std::vector<std::uint64_t> u64_vector(py::handle obj, const std::string& what,
                                      std::uint64_t limit) {
  py::array arr = py::array::ensure(obj);
  if (!arr) throw_not_int(what);
  if (arr.ndim() != 1) {
    throw InvalidArgument(what + " must be 1-D, got " + std::to_string(arr.ndim()) + " dimensions");
  }
  std::vector<std::uint64_t> out(static_cast<std::size_t>(arr.size()));
  if (out.empty()) return out;
  const char kind = arr.dtype().kind();
  if (kind != 'i' && kind != 'u') throw_not_int(what);
  if (kind == 'i') {
    auto ints = py::array_t<std::int64_t, py::array::forcecast>::ensure(arr);
    auto view = ints.unchecked<1>();
    for (py::ssize_t i = 0; i < view.shape(0); ++i) {
      if (view(i) < 0 || static_cast<std::uint64_t>(view(i)) > limit) {
        throw InvalidArgument(what + "[" + std::to_string(i) + "] is " + std::to_string(view(i)) +
                              ": must be in [0, " + std::to_string(limit) + "]");
      }
      out[i] = static_cast<std::uint64_t>(view(i));
    }
    return out;
  }
  auto uints = py::array_t<std::uint64_t, py::array::forcecast>::ensure(arr);
  auto view = uints.unchecked<1>();
  for (py::ssize_t i = 0; i < view.shape(0); ++i) {
    if (view(i) > limit) {
      throw InvalidArgument(what + "[" + std::to_string(i) + "] is " + std::to_string(view(i)) +
                            ": must be in [0, " + std::to_string(limit) + "]");
    }
    out[i] = view(i);
  }
  return out;
}

constexpr std::uint64_t kU32Max = std::numeric_limits<std::uint32_t>::max();

// ---- dtype / strategy / params ---------------------------------------------------

DType dtype_arg(py::handle obj) {
  if (py::isinstance<DType>(obj)) return obj.cast<DType>();
  if (py::isinstance<py::str>(obj)) return parse_dtype(obj.cast<std::string>());
  py::object np_dtype;
  try {
    np_dtype = py::module_::import("numpy").attr("dtype")(obj);
  } catch (const py::error_already_set&) {
    throw InvalidArgument("dtype " + py::repr(obj).cast<std::string>() +
                          " is not a cache dtype (float32, float16, bfloat16)");
  }
  return parse_dtype(np_dtype.attr("name").cast<std::string>());
}

CacheStrategy strategy_arg(py::handle obj) {
  if (py::isinstance<CacheStrategy>(obj)) return obj.cast<CacheStrategy>();
  if (py::isinstance<py::str>(obj)) return parse_strategy(obj.cast<std::string>());
  throw InvalidArgument("cache_strategy " + py::repr(obj).cast<std::string>() +
                        " is not 'continuous' or 'paged'");
}

KVCacheParams make_params(const py::object& dtype, const py::object& n_kv_heads,
                          const py::object& head_dim, const py::object& num_layers,
                          const py::object& cache_strategy, const py::object& page_size,
                          bool enable_prefix_caching, const py::object& n_devices,
                          const std::string& page_layout, const std::string& pool_arrangement) {
  KVCacheParams p;
  p.dtype = dtype_arg(dtype);
  p.n_kv_heads = to_u32(n_kv_heads, "n_kv_heads");
  p.head_dim = to_u32(head_dim, "head_dim");
  p.num_layers = num_layers.is_none() ? 0 : to_u32(num_layers, "num_layers");
  p.cache_strategy = strategy_arg(cache_strategy);
  p.page_size = page_size.is_none() ? 0 : to_u32(page_size, "page_size");
  p.enable_prefix_caching = enable_prefix_caching;
  p.n_devices = to_u32(n_devices, "n_devices");
  p.page_layout = parse_layout(page_layout);
  p.pool_arrangement = parse_arrangement(pool_arrangement);
  if (num_layers.is_none()) {  // left to the manager's num_layers argument
    KVCacheParams check = p;
    check.num_layers = 1;
    check.validate();
  } else {
    p.validate();
  }
  return p;
}

void bind_params(py::module_& m) {
  py::enum_<DType>(m, "DType",
                   "Element type of the cache (bf16 is stored as uint16 in NumPy, fp8 codes as "
                   "uint8, int8 blocks as uint8 bytes: values then scales).")
      .value("f32", DType::f32)
      .value("f16", DType::f16)
      .value("bf16", DType::bf16)
      .value("fp8_e4m3", DType::fp8_e4m3)
      .value("fp8_e5m2", DType::fp8_e5m2)
      .value("int8", DType::int8);
  py::enum_<CacheStrategy>(m, "KVCacheStrategy", "How sequences map to memory.")
      .value("CONTINUOUS", CacheStrategy::continuous)
      .value("PAGED", CacheStrategy::paged);

  py::class_<KVCacheParams>(m, "KVCacheParams",
                            "The static shape of a KV cache (immutable). num_layers may be left "
                            "None and given to the manager instead (as in MAX).")
      .def(py::init(&make_params), py::arg("dtype") = "float32", py::arg("n_kv_heads"),
           py::arg("head_dim"), py::arg("num_layers") = py::none(),
           py::arg("cache_strategy") = "continuous", py::arg("page_size") = py::none(),
           py::arg("enable_prefix_caching") = false, py::arg("n_devices") = 1,
           py::arg("page_layout") = "nhd", py::arg("pool_arrangement") = "interleaved")
      .def_property_readonly("dtype", [](const KVCacheParams& p) { return p.dtype; })
      .def_property_readonly("numpy_dtype",
                             [](const KVCacheParams& p) { return numpy_dtype(p.dtype); })
      .def_property_readonly("n_kv_heads", [](const KVCacheParams& p) { return p.n_kv_heads; })
      .def_property_readonly("head_dim", [](const KVCacheParams& p) { return p.head_dim; })
      .def_property_readonly("num_layers",
                             [](const KVCacheParams& p) -> py::object {
                               if (p.num_layers == 0) return py::none();
                               return py::int_(p.num_layers);
                             })
      .def_property_readonly("cache_strategy",
                             [](const KVCacheParams& p) { return p.cache_strategy; })
      .def_property_readonly("page_size", [](const KVCacheParams& p) { return p.page_size; })
      .def_property_readonly("enable_prefix_caching",
                             [](const KVCacheParams& p) { return p.enable_prefix_caching; })
      .def_property_readonly("n_devices", [](const KVCacheParams& p) { return p.n_devices; })
      .def_property_readonly(
          "page_layout",
          [](const KVCacheParams& p) { return std::string(layout_name(p.page_layout)); },
          "'nhd' (blocks [.., tokens, heads, head_dim]) or 'hnd' ([.., heads, tokens, "
          "head_dim])")
      .def_property_readonly(
          "pool_arrangement",
          [](const KVCacheParams& p) { return std::string(arrangement_name(p.pool_arrangement)); },
          "'interleaved' (blocks [pages, 2, layers, ...], MAX) or 'per_layer' ([layers, 2, "
          "pages, ...]: each layer's K and V an array of its own, vLLM / ferrum)")
      .def_property_readonly("n_kv_heads_per_device", &KVCacheParams::n_kv_heads_per_device)
      .def("bytes_per_token", &KVCacheParams::bytes_per_token,
           "K and V bytes of one token over all layers and devices (needs num_layers).")
      .def(
          "__eq__", [](const KVCacheParams& a, const KVCacheParams& b) { return a == b; },
          py::arg("other"))
      .def("__repr__", &params_repr);
}

// Runs, at import and so on one thread, every function-local static that the
// binding's NumPy calls initialise by importing a module. First run from
// several threads at once, such an import releases the GIL inside the static's
// guard, and a second thread holding the GIL then waits on that guard forever.
void init_numpy_statics() {
  py::module_::import("numpy");
  for (DType t : {DType::f32, DType::f16, DType::bf16}) numpy_dtype(t);
  py::array_t<std::uint32_t> touch(0);
  static_cast<void>(py::dtype::of<bool>());
  static_cast<void>(touch);
}

// ---- bf16 helpers ---------------------------------------------------------------

py::array_t<float> bf16_to_float32(const py::handle& obj) {
  py::array arr = py::array::ensure(obj);
  if (!arr || !arr.dtype().is(py::dtype::of<std::uint16_t>())) {
    throw InvalidArgument("bf16_to_float32 takes a uint16 array (bf16 bits)");
  }
  auto bits = py::array_t<std::uint16_t, py::array::c_style>::ensure(arr);
  py::array_t<float> out(std::vector<py::ssize_t>(bits.shape(), bits.shape() + bits.ndim()));
  const std::uint16_t* src = bits.data();
  float* dst = out.mutable_data();
  for (py::ssize_t i = 0; i < bits.size(); ++i) dst[i] = bf16_bits_to_f32(src[i]);
  return out;
}

py::array_t<std::uint16_t> float32_to_bf16(
    const py::array_t<float, py::array::c_style | py::array::forcecast>& values) {
  py::array_t<std::uint16_t> out(
      std::vector<py::ssize_t>(values.shape(), values.shape() + values.ndim()));
  const float* src = values.data();
  std::uint16_t* dst = out.mutable_data();
  for (py::ssize_t i = 0; i < values.size(); ++i) dst[i] = f32_to_bf16_bits(src[i]);
  return out;
}

void bind_dtype_helpers(py::module_& m) {
  m.def("bf16_to_float32", &bf16_to_float32, py::arg("bits"),
        "Values of a bf16 array (NumPy uint16 holding the bits, as the blocks of a bf16 "
        "cache are exposed) as a new float32 array of the same shape. Exact.");
  m.def("float32_to_bf16", &float32_to_bf16, py::arg("values"),
        "Rounds float values to bf16 (nearest, ties to even; NaN stays NaN) and returns "
        "the bits as a uint16 array, ready to assign into a bf16 cache's blocks.");
}

}  // namespace

// ---- shared helpers (py_common.h) --------------------------------------------------

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::f16:
      return py::dtype("float16");
    case DType::bf16:
      return py::dtype::of<std::uint16_t>();
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
    case DType::int8:
      return py::dtype::of<std::uint8_t>();
    case DType::f32:
      break;
  }
  return py::dtype::of<float>();
}

std::uint32_t to_u32(py::handle obj, const char* what) {
  return static_cast<std::uint32_t>(u64_of(obj, what, kU32Max));
}

std::uint64_t to_u64(py::handle obj, const char* what) {
  return u64_of(obj, what, std::numeric_limits<std::uint64_t>::max());
}

std::vector<std::uint32_t> to_u32_vector(py::handle obj, const char* what, std::size_t n,
                                         std::uint32_t fallback) {
  std::vector<std::uint32_t> out;
  if (obj.is_none() && n != any_length) return std::vector<std::uint32_t>(n, fallback);
  if (PyLong_Check(obj.ptr()) && n != any_length) {
    return std::vector<std::uint32_t>(n, to_u32(obj, what));
  }
  for (std::uint64_t v : u64_vector(obj, what, kU32Max)) {
    out.push_back(static_cast<std::uint32_t>(v));
  }
  if (n != any_length && out.size() != n) {
    throw InvalidArgument(std::string(what) + " has " + std::to_string(out.size()) +
                          " entries but the batch has " + std::to_string(n) + " seq ids");
  }
  return out;
}

std::vector<SeqId> to_seq_ids(py::handle obj) {
  if (PyLong_Check(obj.ptr())) return {u64_of(obj, "seq_ids", std::numeric_limits<SeqId>::max())};
  return u64_vector(obj, "seq_ids", std::numeric_limits<SeqId>::max());
}

}  // namespace kvcache::python

PYBIND11_MODULE(kvcache, m) {
  namespace kp = kvcache::python;
  m.doc() =
      "kvcache: a KV cache for LLM inference (C++ core). Managers follow MAX's "
      "continuous_batching_cache API; tensors are NumPy arrays viewing the C++ memory. "
      "See docs/python.md.";
  m.attr("__version__") = kvcache::version();
  kp::bind_errors(m);
  kp::init_numpy_statics();
  kp::bind_params(m);
  kp::bind_dtype_helpers(m);
  kp::bind_inputs(m);
  kp::bind_managers(m);
  kp::bind_kernels(m);
  kp::bind_metrics_and_logging(m);
  kp::bind_dlpack(m);
  kp::register_shutdown_handler();
}
