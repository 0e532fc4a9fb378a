// python/dlpack.cpp — DLPack exchange: kernel arguments from any DLPack
// tensor (dlpack_arg), and kvcache.as_bf16, a bfloat16 view of a bf16
// cache's uint16 bits that torch and other frameworks import without a copy.
//
// DLPack is the array-exchange protocol of the Python array API: a
// producer's __dlpack__() returns a PyCapsule named "dltensor" holding a
// DLManagedTensor (pointer, device, dtype, shape, strides, and a deleter);
// the consumer renames the capsule "used_dltensor" and calls the deleter when
// it is done with the memory. A capsule never consumed is freed by its own
// destructor. The structs below are the protocol's ABI (DLPack 0.8, the
// unversioned capsule every consumer reads), written from its specification.
//
// Ownership: a capsule's DLManagedTensor holds a strong reference to the
// uint16 array whose memory it describes (for a cache's blocks, the array's
// base is the KVCacheBatch, which holds the manager), so the memory outlives
// every tensor made from it. The deleter may run on any thread: it takes the
// GIL to drop that reference (and leaves it once the interpreter is
// finalizing, when there is nothing to give it back to).
#include "dlpack.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace kvcache::python {

namespace {

// ---- the DLPack ABI ------------------------------------------------------------------

constexpr std::int32_t kDLCPU = 1;    // DLDeviceType
constexpr std::uint8_t kDLFloat = 2;  // DLDataTypeCode
constexpr std::uint8_t kDLBfloat = 4;
constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr const char* kImportName = "kvcache.dlpack_import";

struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4);
static_assert(offsetof(DLTensor, ndim) == 16 && offsetof(DLTensor, dtype) == 20 &&
              offsetof(DLTensor, shape) == 24 && sizeof(DLTensor) == 48);
static_assert(offsetof(DLManagedTensor, deleter) == 56 && sizeof(DLManagedTensor) == 64);

// What one exported DLManagedTensor owns: its shape and strides, and a
// strong reference to the array whose memory it describes.
struct Export {
  DLManagedTensor tensor{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  PyObject* owner = nullptr;
};

bool python_gone() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() == 0 || Py_IsFinalizing() != 0;
#else
  return Py_IsInitialized() == 0 || _Py_IsFinalizing() != 0;
#endif
}

void delete_export(DLManagedTensor* tensor) {
  auto* e = static_cast<Export*>(tensor->manager_ctx);
  if (e->owner != nullptr && !python_gone()) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(e->owner);
    PyGILState_Release(gil);
  }
  delete e;
}

// Runs with the GIL held when the capsule is freed. Still named "dltensor",
// it was never consumed: its tensor is ours to delete.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kCapsuleName) == 0) return;  // consumed: not ours
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* tensor = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (tensor != nullptr && tensor->deleter != nullptr) tensor->deleter(tensor);
  PyErr_Restore(type, value, traceback);
}

// ---- kvcache.BF16Array ---------------------------------------------------------------

// The bits of bf16 values (a writable uint16 array) seen as bfloat16.
struct BF16Array {
  py::array bits;
};

std::string shape_text(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += std::to_string(a.shape(i)) + ", ";
  if (a.ndim() > 0) s.resize(s.size() - 2);
  return s + (a.ndim() == 1 ? ",)" : ")");
}

BF16Array as_bf16(const py::handle& obj) {
  const auto refuse = [&](const std::string& why) {
    return InvalidArgument(
        "as_bf16 takes a writable NumPy uint16 array (the bits of bf16 "
        "values, as a bf16 cache's blocks), got " +
        py::repr(obj).cast<std::string>().substr(0, 80) + ": " + why);
  };
  if (!py::isinstance<py::array>(obj)) throw refuse("not a NumPy array");
  auto bits = py::reinterpret_borrow<py::array>(obj);
  if (!bits.dtype().is(py::dtype::of<std::uint16_t>())) {
    throw refuse("dtype " + py::str(bits.dtype()).cast<std::string>());
  }
  // DLPack before 1.0 cannot mark memory read-only (NumPy refuses too).
  if (!bits.writeable()) throw refuse("read-only");
  for (py::ssize_t i = 0; i < bits.ndim(); ++i) {
    if (bits.strides(i) % static_cast<py::ssize_t>(sizeof(std::uint16_t)) != 0) {
      throw refuse("stride " + std::to_string(bits.strides(i)) + " is not a whole element");
    }
  }
  return BF16Array{bits};
}

// __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None):
// a "dltensor" capsule viewing the bits as bfloat16 on the CPU.
py::capsule export_bf16(const BF16Array& self, const py::handle& stream,
                        const py::handle& /*max_version*/, const py::handle& dl_device,
                        const py::handle& copy) {
  if (!stream.is_none()) throw py::buffer_error("stream must be None for a CPU tensor");
  if (!dl_device.is_none() && !dl_device.equal(py::make_tuple(kDLCPU, 0))) {
    throw py::buffer_error("BF16Array lives on the CPU, (1, 0); cannot export to " +
                           py::repr(dl_device).cast<std::string>());
  }
  if (!copy.is_none() && PyObject_IsTrue(copy.ptr()) == 1) {
    throw py::buffer_error("BF16Array is a view: copy=True is not supported");
  }
  const py::array& bits = self.bits;
  auto e = std::make_unique<Export>();
  for (py::ssize_t i = 0; i < bits.ndim(); ++i) {
    e->shape.push_back(bits.shape(i));
    e->strides.push_back(bits.strides(i) / static_cast<py::ssize_t>(sizeof(std::uint16_t)));
  }
  DLTensor& t = e->tensor.dl_tensor;
  t.data = const_cast<void*>(bits.data());
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<std::int32_t>(bits.ndim());
  t.dtype = {kDLBfloat, 16, 1};
  t.shape = e->shape.data();
  t.strides = e->strides.data();
  t.byte_offset = 0;
  e->tensor.manager_ctx = e.get();
  e->tensor.deleter = &delete_export;
  e->owner = bits.ptr();
  Py_INCREF(e->owner);
  PyObject* capsule = PyCapsule_New(&e->tensor, kCapsuleName, &capsule_destructor);
  if (capsule == nullptr) {
    delete_export(&e.release()->tensor);
    throw py::error_already_set();
  }
  e.release();  // the capsule (or its consumer) owns it now
  return py::reinterpret_steal<py::capsule>(capsule);
}

// ---- importing a writable tensor ------------------------------------------------------

// Destructor of the capsule that owns an imported tensor: hands it back.
void release_import(PyObject* owner) {
  auto* tensor = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(owner, kImportName));
  if (tensor != nullptr && tensor->deleter != nullptr) tensor->deleter(tensor);
}

bool c_contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  std::int64_t expected = 1;
  for (std::int32_t i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

std::string dims_text(const DLTensor& t) {
  std::string s = "(";
  for (std::int32_t i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + (t.ndim == 1 ? ",)" : ")");
}

}  // namespace

py::array dlpack_out(const py::handle& obj, const char* what) {
  const std::string name(what);
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    throw InvalidArgument(name + " is a DLPack tensor that refused to export (" + e.what() + ")");
  }
  if (PyCapsule_IsValid(capsule.ptr(), kCapsuleName) == 0) {
    throw InvalidArgument(name + ".__dlpack__() returned no 'dltensor' capsule");
  }
  auto* tensor = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  // Taken over: from here the owner capsule (and so the view) hands it back.
  if (PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName) != 0) throw py::error_already_set();
  const py::capsule owner(tensor, kImportName, &release_import);
  const DLTensor& t = tensor->dl_tensor;
  if (t.device.device_type != kDLCPU) {
    throw InvalidArgument(name + " is a DLPack tensor on device (" +
                          std::to_string(t.device.device_type) + ", " +
                          std::to_string(t.device.device_id) + "): the kernels run on the CPU");
  }
  if (t.dtype.code != kDLFloat || t.dtype.bits != 32 || t.dtype.lanes != 1) {
    throw InvalidArgument(name + " is a DLPack tensor of dtype code " +
                          std::to_string(t.dtype.code) + ", " + std::to_string(t.dtype.bits) +
                          " bits: it must be float32");
  }
  if (!c_contiguous(t)) {
    throw InvalidArgument(name + " is a DLPack tensor of shape " + dims_text(t) +
                          " that is not C-contiguous: pass a contiguous one");
  }
  const std::vector<py::ssize_t> shape(t.shape, t.shape + t.ndim);
  auto* data = reinterpret_cast<float*>(static_cast<char*>(t.data) + t.byte_offset);
  return py::array(py::dtype::of<float>(), shape, {}, data, owner);  // writable, owns the tensor
}

py::object dlpack_arg(const py::handle& obj, const char* what) {
  if (py::isinstance<py::array>(obj) || !py::hasattr(obj, "__dlpack__")) {
    return py::reinterpret_borrow<py::object>(obj);
  }
  py::array a;
  try {
    a = py::module_::import("numpy").attr("from_dlpack")(obj);
  } catch (py::error_already_set& e) {
    throw InvalidArgument(std::string(what) + " is a DLPack tensor NumPy cannot view (" + e.what() +
                          "): pass a CPU tensor of float32 (float16 and float64 are converted)");
  }
  if (a.dtype().kind() != 'f') {
    throw InvalidArgument(std::string(what) + " is a DLPack tensor of dtype " +
                          py::str(a.dtype()).cast<std::string>() +
                          ": the kernels take float32 (float16 and float64 are converted)");
  }
  if ((a.flags() & py::array::c_style) == 0) {
    throw InvalidArgument(std::string(what) + " is a DLPack tensor of shape " + shape_text(a) +
                          " that is not C-contiguous: pass a contiguous one (torch: "
                          ".contiguous())");
  }
  return a;
}

void bind_dlpack(py::module_& m) {
  py::class_<BF16Array>(m, "BF16Array",
                        "A bfloat16 view of a writable uint16 array holding bf16 bits (a bf16 "
                        "cache's blocks): __dlpack__ exports the same memory with DLPack dtype "
                        "bfloat16, so torch.from_dlpack(kvcache.as_bf16(blocks)) is a bf16 "
                        "tensor that shares it. Keeps the array alive.")
      .def_property_readonly(
          "bits", [](const BF16Array& a) { return a.bits; }, "the uint16 array viewed")
      .def_property_readonly(
          "shape", [](const BF16Array& a) { return a.bits.attr("shape"); }, "its shape")
      .def_property_readonly(
          "dtype", [](const BF16Array&) { return "bfloat16"; }, "always 'bfloat16'")
      .def("__dlpack__", &export_bf16, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none(),
           "A DLPack capsule ('dltensor') viewing the memory as bfloat16 on the CPU.")
      .def(
          "__dlpack_device__", [](const BF16Array&) { return py::make_tuple(kDLCPU, 0); },
          "(1, 0): the CPU")
      .def("__repr__", [](const BF16Array& a) {
        return "BF16Array(shape=" + shape_text(a.bits) + ", dtype=bfloat16)";
      });
  m.def("as_bf16", &as_bf16, py::arg("bits"),
        "A kvcache.BF16Array viewing a writable uint16 array of bf16 bits (a bf16 cache's "
        "blocks) as bfloat16 through DLPack (zero copy). InvalidArgument for anything else.");
}

}  // namespace kvcache::python
