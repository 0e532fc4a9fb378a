// python/dlpack.h — DLPack exchange for the `kvcache` module.
//
// Kernel arguments that may be any DLPack tensor (dlpack_arg, dlpack_out), and
// kvcache.as_bf16 / kvcache.BF16Array, which hand a bf16 cache's uint16 bits
// to torch & co. as bfloat16 through a DLPack capsule of our own making
// (dlpack.cpp). The arrays fetch returns are NumPy arrays: they have NumPy's
// own __dlpack__ / __dlpack_device__.
//
// Thread-safety: called with the GIL held.
#pragma once

#include "py_common.h"

namespace kvcache::python {

// A kernel's tensor argument: a NumPy array, or anything without __dlpack__
// (a list ...), is returned as it is (the caller converts it as before); any
// other object with __dlpack__ (a torch tensor, a JAX or CuPy array, ...) is
// imported with numpy.from_dlpack, which views its memory (zero copy). Throws
// InvalidArgument naming `what` when NumPy cannot import it (another device,
// a dtype NumPy lacks such as bfloat16), when its dtype is not floating
// point, or when it is not C-contiguous.
py::object dlpack_arg(const py::handle& obj, const char* what);

// A kernel's output argument given as a DLPack tensor (an object with
// __dlpack__ that is not a NumPy array): a writable NumPy view of its memory,
// made from the producer's capsule by this module (NumPy 1.x's from_dlpack
// makes read-only arrays). The view owns the capsule's tensor and hands it
// back (its deleter) when freed. Throws InvalidArgument naming `what` unless
// it is a CPU float32 tensor, C-contiguous.
py::array dlpack_out(const py::handle& obj, const char* what);

// kvcache.BF16Array and kvcache.as_bf16(bits).
void bind_dlpack(py::module_& m);

}  // namespace kvcache::python
