// python/kernels.cpp — kvcache.store_kv and kvcache.attention on NumPy inputs.
//
// Both take the KVCacheInputs of a fetch (or one of its per-device tuples,
// which names the device) and a layer index, follow the conventions of
// kvcache/kernels/reference.h (ragged batch by row_offsets, new token i of
// entry b at position cache_lengths[b] + i, causal, GQA) and release the GIL
// while they compute (`unlocked`). Do not step/release/increment the same
// KVCacheInputs from another thread while a kernel runs on it.
//
// Which C++ kernels run is chosen by the one `using Kernels = ...;` line
// below; `kvcache.kernels_backend` reports it.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "dlpack.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/kernels/rope.h"
#include "kvcache/kernels/rope_table.h"
#include "py_common.h"
#include "repr.h"

namespace kvcache::python {

namespace {

// The scalar oracle (kvcache/kernels/reference.h).
struct ReferenceKernels {
  static constexpr const char* name = "reference";
  // RoPE on K (options.rope_k) is applied by apply_rope_reference to a copy
  // of k_new, row by row at its position, before the store; the options are
  // checked as store_kv checks them (check_store_rope), the table not used.
  template <KVCacheT Cache>
  static void store_kv(const Cache& k, const Cache& v, std::span<const float> k_new,
                       std::span<const float> v_new, std::span<const std::uint32_t> row_offsets,
                       const StoreOptions& options, ThreadPool* /*pool*/) {
    const auto d = k.desc();
    check_store_rope(options, d.head_dim);
    if (!options.rope_k.enabled) return store_kv_reference(k, v, k_new, v_new, row_offsets);
    detail::check_row_offsets(row_offsets, d.batch_size);
    const std::size_t row = std::size_t{d.n_kv_heads} * d.head_dim;
    detail::check_size("k_new", k_new.size(), std::size_t{row_offsets[d.batch_size]} * row);
    std::vector<float> rotated(k_new.begin(), k_new.end());
    for (std::uint32_t b = 0; b < d.batch_size; ++b) {
      for (std::uint32_t r = row_offsets[b]; r < row_offsets[b + 1]; ++r) {
        const std::uint32_t pos = d.cache_lengths[b] + (r - row_offsets[b]);
        apply_rope_reference(std::span(rotated).subspan(r * row, row), d.n_kv_heads, d.head_dim,
                             pos, options.rope_k);
      }
    }
    store_kv_reference(k, v, std::span<const float>(rotated), v_new, row_offsets);
  }
  template <KVCacheT Cache>
  static void attention(const Cache& k, const Cache& v, std::span<const float> q,
                        std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                        std::span<float> out, AttentionOptions options, ThreadPool* /*pool*/) {
    attention_reference(k, v, q, n_q_heads, row_offsets, out, options);
  }
};

// The Highway kernels (kvcache/kernels/attention.h), on the calling thread.
struct FastKernels {
  static constexpr const char* name = "fast";
  template <KVCacheT Cache>
  static void store_kv(const Cache& k, const Cache& v, std::span<const float> k_new,
                       std::span<const float> v_new, std::span<const std::uint32_t> row_offsets,
                       const StoreOptions& options, ThreadPool* pool) {
    kvcache::store_kv(k, v, k_new, v_new, row_offsets, options, pool);
  }
  template <KVCacheT Cache>
  static void attention(const Cache& k, const Cache& v, std::span<const float> q,
                        std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                        std::span<float> out, AttentionOptions options, ThreadPool* pool) {
    kvcache::attention(k, v, q, n_q_heads, row_offsets, out, options, pool);
  }
};

// The one-line switch between the kernel sets.
using Kernels = FastKernels;

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// A kernel's float tensor argument as a C-contiguous float32 array: a NumPy
// array or anything it converts (a copy when the dtype or layout differs), or
// any DLPack tensor, viewed without a copy when it is float32 (dlpack_arg).
FloatArray float_rows(const py::handle& obj, const char* what) {
  const py::object arg = dlpack_arg(obj, what);
  FloatArray a = FloatArray::ensure(arg);
  if (!a) {
    throw InvalidArgument(std::string(what) + " is " +
                          py::repr(py::type::of(obj)).cast<std::string>() +
                          ": pass a float array (NumPy, or any DLPack tensor)");
  }
  return a;
}

// Calls f(key_cache, value_cache) for `layer` of the batch, typed by its dtype and strategy.
template <class F>
void with_layer(const KVCacheBatch& b, std::uint32_t layer, std::uint32_t device, F&& f) {
  visit_dtype(b.params().dtype, [&](auto tag) {
    using T = decltype(tag);
    if (b.strategy() == CacheStrategy::paged) {
      const auto c = b.paged<T>(device);
      f(c.get_key_cache(layer), c.get_value_cache(layer));
    } else {
      const auto c = b.continuous<T>(device);
      f(c.get_key_cache(layer), c.get_value_cache(layer));
    }
  });
}

// Rows of `a` must be [tokens, heads, head_dim] (or flattened [tokens, heads * head_dim]).
void check_rows(const py::array& a, const char* what, std::uint32_t heads, std::uint32_t dim) {
  const bool ok3 = a.ndim() == 3 && a.shape(1) == heads && a.shape(2) == dim;
  const bool ok2 = a.ndim() == 2 && a.shape(1) == py::ssize_t{heads} * dim;
  if (!ok3 && !ok2) {
    std::string shape;
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
      if (i > 0) shape += ", ";
      shape += std::to_string(a.shape(i));
    }
    throw InvalidArgument(std::string(what) + " has shape (" + shape + "), expected (tokens, " +
                          std::to_string(heads) + ", " + std::to_string(dim) + ")");
  }
}

template <class A>
auto span_of(A& a) {
  return std::span(a.data(), static_cast<std::size_t>(a.size()));
}

// A Python real number (int, float, NumPy scalar; not bool) as float;
// InvalidArgument naming `what` and the value otherwise.
float to_float(const py::handle& obj, const char* what) {
  const auto bad = [&] {
    return InvalidArgument(std::string(what) + " is " + py::repr(obj).cast<std::string>() +
                           ": must be a real number");
  };
  if (PyBool_Check(obj.ptr()) || !PyNumber_Check(obj.ptr()) || PyComplex_Check(obj.ptr())) {
    throw bad();
  }
  const double x = PyFloat_AsDouble(obj.ptr());
  if (x == -1.0 && PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    throw bad();
  }
  return static_cast<float>(x);
}

// A Python str naming `what`'s value; InvalidArgument naming the value otherwise.
std::string to_name(const py::handle& obj, const char* what) {
  if (!py::isinstance<py::str>(obj)) {
    throw InvalidArgument(std::string(what) + " is " + py::repr(obj).cast<std::string>() +
                          ": must be a str");
  }
  return obj.cast<std::string>();
}

// The `pool` keyword: None runs on the calling thread.
ThreadPool* pool_of(const py::handle& pool) {
  if (pool.is_none()) return nullptr;
  if (!py::isinstance<ThreadPool>(pool)) {
    throw InvalidArgument("pool is " + py::repr(pool).cast<std::string>() +
                          ": must be a kvcache.ThreadPool or None");
  }
  return &pool.cast<ThreadPool&>();
}

// StoreOptions from store_kv's keywords: RoPE on K when rope_theta is given.
StoreOptions store_options(const py::handle& rope_theta, const py::handle& rotary_dim,
                           const RopeTable* rope_table, const py::handle& prefetch) {
  StoreOptions options;
  options.rope_table = rope_table;
  options.prefetch = parse_store_prefetch(to_name(prefetch, "prefetch"));
  const std::uint32_t rd = to_u32(rotary_dim, "rotary_dim");
  if (rope_theta.is_none()) {
    if (rd != 0) {
      throw InvalidArgument("rotary_dim " + std::to_string(rd) + " given without rope_theta");
    }
    return options;
  }
  options.rope_k.enabled = true;
  options.rope_k.theta = to_float(rope_theta, "rope_theta");
  options.rope_k.rotary_dim = rd;
  return options;
}

// The batch and device a kernel call names: `device` None means the device
// of a per-device tuple, else 0; a device that contradicts the tuple's is an
// InvalidArgument.
std::pair<const KVCacheBatch&, std::uint32_t> batch_and_device(const py::handle& inputs,
                                                               const py::handle& device) {
  const BatchRef ref = batch_of(inputs, "kv_cache_inputs");
  if (device.is_none()) return {ref.batch.batch, ref.device.value_or(0)};
  const std::uint32_t d = to_u32(device, "device");
  if (ref.device && *ref.device != d) {
    throw InvalidArgument("device is " + std::to_string(d) +
                          " but kv_cache_inputs is the tuple of device " +
                          std::to_string(*ref.device));
  }
  return {ref.batch.batch, d};
}

void store_kv_py(const py::handle& inputs, const py::handle& layer, const py::handle& k_obj,
                 const py::handle& v_obj, const py::handle& row_offsets, const py::handle& device,
                 const py::handle& rope_theta, const py::handle& rotary_dim,
                 const RopeTable* rope_table, const py::handle& pool, const py::handle& prefetch) {
  const auto named = batch_and_device(inputs, device);
  const KVCacheBatch& b = named.first;
  const std::uint32_t dev = named.second;
  const KVCacheParams& p = b.params();
  const FloatArray k_new = float_rows(k_obj, "k_new");
  const FloatArray v_new = float_rows(v_obj, "v_new");
  check_rows(k_new, "k_new", p.n_kv_heads_per_device(), p.head_dim);
  check_rows(v_new, "v_new", p.n_kv_heads_per_device(), p.head_dim);
  const auto offsets = to_u32_vector(row_offsets, "row_offsets");
  const StoreOptions options = store_options(rope_theta, rotary_dim, rope_table, prefetch);
  ThreadPool* const threads = pool_of(pool);
  with_layer(b, to_u32(layer, "layer"), dev, [&](const auto& k, const auto& v) {
    unlocked([&] {
      Kernels::store_kv(k, v, span_of(k_new), span_of(v_new), offsets, options, threads);
    });
  });
}

void bind_rope_table(py::module_& m) {
  py::class_<RopeTable>(m, "RopeTable",
                        "cos/sin of the RoPE angles for positions 0 .. max_positions - 1, "
                        "computed once (kvcache/kernels/rope_table.h). Pass it to store_kv as "
                        "rope_table= with the same rope_theta and rotary_dim: the same results "
                        "without per-token trigonometry. Immutable.")
      .def(py::init([](const py::handle& head_dim, const py::handle& max_positions, float theta,
                       const py::handle& rotary_dim) {
             return RopeTable(RopeOptions{true, theta, to_u32(rotary_dim, "rotary_dim")},
                              to_u32(head_dim, "head_dim"), to_u32(max_positions, "max_positions"));
           }),
           py::arg("head_dim"), py::arg("max_positions"), py::kw_only(),
           py::arg("theta") = 10000.0f, py::arg("rotary_dim") = 0)
      .def_property_readonly("theta", &RopeTable::theta)
      .def_property_readonly("rotary_dim", &RopeTable::rotary_dim)
      .def_property_readonly("max_positions", &RopeTable::max_positions)
      .def_property_readonly("memory_bytes", &RopeTable::memory_bytes)
      .def(
          "cos_sin",
          [](const RopeTable& t, const py::handle& pos) {
            const std::span<const float> cs = t.cos_sin(to_u32(pos, "pos"));
            return py::array_t<float>(static_cast<py::ssize_t>(cs.size()), cs.data());
          },
          py::arg("pos"),
          "float32 [rotary_dim]: the cos of pairs 0 .. rotary_dim/2 - 1 at position pos, then "
          "their sin.")
      .def("__repr__", &rope_table_repr);
}

// The `out` keyword as a writable C-contiguous float32 array shaped like q
// (a DLPack tensor is viewed, never copied); InvalidArgument otherwise.
py::array_t<float> out_array(const py::handle& out, const FloatArray& q) {
  const bool foreign = !py::isinstance<py::array>(out) && py::hasattr(out, "__dlpack__");
  const py::object arg = foreign ? dlpack_out(out, "out") : py::reinterpret_borrow<py::object>(out);
  auto result = py::array_t<float>::ensure(arg);
  if (!result || result.ptr() != arg.ptr() || !(result.flags() & py::array::c_style) ||
      !result.writeable() || result.ndim() != 3 ||
      !std::equal(q.shape(), q.shape() + 3, result.shape())) {
    throw InvalidArgument("out must be a writable C-contiguous float32 array shaped like q");
  }
  return result;
}

py::object attention_py(const py::handle& inputs, const py::handle& layer, const py::handle& q_obj,
                        const py::handle& row_offsets, const py::handle& out,
                        const py::handle& scale, const py::handle& device, const py::handle& pool,
                        const py::handle& prefetch, const py::handle& precision) {
  const auto named = batch_and_device(inputs, device);
  const KVCacheBatch& b = named.first;
  const std::uint32_t dev = named.second;
  const std::uint32_t dim = b.params().head_dim;
  const FloatArray q = float_rows(q_obj, "q");
  if (q.ndim() != 3 || q.shape(2) != dim) {
    throw InvalidArgument("q must have shape (tokens, n_q_heads, " + std::to_string(dim) + ")");
  }
  const auto n_q_heads = static_cast<std::uint32_t>(q.shape(1));
  py::array_t<float> result =
      out.is_none() ? py::array_t<float>({q.shape(0), q.shape(1), q.shape(2)}) : out_array(out, q);
  const auto offsets = to_u32_vector(row_offsets, "row_offsets");
  const AttentionOptions options{to_float(scale, "scale"),
                                 parse_attention_prefetch(to_name(prefetch, "prefetch")),
                                 parse_attention_precision(to_name(precision, "precision"))};
  ThreadPool* const threads = pool_of(pool);
  const std::span<float> out_span(result.mutable_data(), static_cast<std::size_t>(result.size()));
  with_layer(b, to_u32(layer, "layer"), dev, [&](const auto& k, const auto& v) {
    unlocked([&] {
      Kernels::attention(k, v, span_of(q), n_q_heads, offsets, out_span, options, threads);
    });
  });
  if (out.is_none()) return result;
  return py::reinterpret_borrow<py::object>(out);  // the caller's tensor, now filled
}

}  // namespace

void bind_thread_pool(py::module_& m) {
  py::class_<ThreadPool>(m, "ThreadPool",
                         "A fixed set of worker threads for store_kv and attention "
                         "(kvcache/thread_pool.h), created once and joined when the pool is "
                         "freed. threads counts the calling thread (1 = no workers, 0 = one per "
                         "hardware thread). Pass it as pool=; calls sharing a pool from several "
                         "Python threads run one at a time.")
      .def(py::init([](const py::handle& threads) {
             return std::make_unique<ThreadPool>(to_u32(threads, "threads"));
           }),
           py::arg("threads") = 0)
      .def_property_readonly("num_threads", &ThreadPool::num_threads)
      .def("__repr__", [](const ThreadPool& p) {
        return "kvcache.ThreadPool(threads=" + std::to_string(p.num_threads()) + ")";
      });
}

void bind_kernels(py::module_& m) {
  m.attr("kernels_backend") = Kernels::name;
  bind_rope_table(m);
  bind_thread_pool(m);
  m.def("store_kv", counted(&store_kv_py), py::arg("kv_cache_inputs"), py::arg("layer"),
        py::arg("k_new"), py::arg("v_new"), py::arg("row_offsets"), py::kw_only(),
        py::arg("device") = py::none(), py::arg("rope_theta") = py::none(),
        py::arg("rotary_dim") = 0, py::arg("rope_table") = nullptr, py::arg("pool") = py::none(),
        py::arg("prefetch") = "auto",
        "Writes the new K/V rows ([tokens, n_kv_heads, head_dim] floats) of `layer`: row r of "
        "entry b (rows row_offsets[b] .. row_offsets[b+1]) goes to position cache_lengths[b] + "
        "(r - row_offsets[b]), rounded to the cache dtype. With rope_theta, K is rotated on the "
        "way in (RoPE, NeoX pairing, the first rotary_dim elements of each head, 0 = all) at that "
        "position; rope_table (a RopeTable of the same theta and rotary_dim) supplies the "
        "cos/sin. pool (a ThreadPool) splits the rows across its threads; prefetch is 'auto', "
        "'row-l1' or 'none' (StorePrefetch; results never depend on it). Releases the GIL.");
  m.def("attention", counted(&attention_py), py::arg("kv_cache_inputs"), py::arg("layer"),
        py::arg("q"), py::arg("row_offsets"), py::kw_only(), py::arg("out") = py::none(),
        py::arg("scale") = 0.0f, py::arg("device") = py::none(), py::arg("pool") = py::none(),
        py::arg("prefetch") = "auto", py::arg("precision") = "fp32",
        "Causal attention of q ([tokens, n_q_heads, head_dim] floats, GQA) over each entry's "
        "history and new tokens in `layer`; returns (or fills `out`) float32 [tokens, n_q_heads, "
        "head_dim]. scale 0 means 1/sqrt(head_dim). pool (a ThreadPool) spreads the work, long "
        "contexts included, over its threads; prefetch is 'auto', 'step-l1', 'tile-l1', 'tile-l2' "
        "or 'none' "
        "(AttentionPrefetch; results never depend on it). precision 'bf16' on a bfloat16 cache "
        "rounds the scaled query and the softmax probabilities to bf16 before they meet K and V "
        "(AttentionPrecision, as GPU kernels do; faster where the CPU has AVX512-BF16); 'fp32' "
        "(the default) rounds nothing. Releases the GIL.");
}

}  // namespace kvcache::python
