"""DLPack exchange: the arrays fetch returns (NumPy's __dlpack__), kernels that
take any DLPack tensor (inputs viewed through numpy.from_dlpack, `out` through
the module's own import, which NumPy 1.x's read-only imports cannot serve;
refused with a clear error when they cannot be viewed, are not floating point
or not C-contiguous), and kvcache.as_bf16, whose capsule is parsed here with
ctypes (and imported by torch where Debian's python3-torch is installed)."""
import ctypes
import gc
import sys

import numpy as np
import pytest

import kvcache
from kv_helpers import make_manager, offsets_of, random_rows

N_KV, N_Q, DIM = 2, 4, 8


class Tensor:
    """A DLPack tensor that is not a NumPy array and has no __array__: what a
    framework hands over (it forwards to the array it wraps)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *, stream=None, **kwargs):
        return self._array.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def filled_inputs(dtype="float32", seed=0):
    """A paged batch of two entries (5 and 3 new tokens) with layer 0 stored."""
    rng = np.random.default_rng(seed)
    m = make_manager("paged", dtype=dtype, n_kv_heads=N_KV, head_dim=DIM, num_layers=1)
    inputs = m.fetch(m.claim(2), [5, 3])
    k, v = random_rows(rng, 8, N_KV, DIM), random_rows(rng, 8, N_KV, DIM)
    kvcache.store_kv(inputs, 0, k, v, offsets_of([5, 3]))
    q = rng.standard_normal((8, N_Q, DIM)).astype(np.float32)
    return m, inputs, q


# ---- the arrays fetch returns -----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_blocks_round_trip_through_dlpack_sharing_memory(dtype):
    m, inputs, _ = filled_inputs(dtype)
    blocks = inputs.blocks
    assert blocks.__dlpack_device__() == (1, 0)
    view = np.from_dlpack(blocks)
    assert np.shares_memory(view, blocks) and view.shape == blocks.shape
    assert view.dtype == blocks.dtype  # bf16 caches: uint16 bits
    blocks[0, 0, 0, 0, 0, 0] = 1
    assert view[0, 0, 0, 0, 0, 0] == 1  # one memory (NumPy 1.x makes the import read-only)
    del m, inputs, blocks
    gc.collect()
    assert view[0, 0, 0, 0, 0, 0] == 1  # the view keeps the cache alive


def test_read_only_arrays_are_never_exported_writable():
    # DLPack before 1.0 cannot say "read-only", so NumPy 1.x refuses to export
    # the read-only views; a NumPy that can must hand out a read-only view.
    _, inputs, _ = filled_inputs()
    for name in ("cache_lengths", "lookup_table", "reserved_lengths", "block_copies"):
        array = getattr(inputs, name)
        try:
            view = np.from_dlpack(array)
        except BufferError:
            continue
        assert np.shares_memory(view, array) and not view.flags.writeable


# ---- kernels take any DLPack tensor -----------------------------------------------------


def test_kernels_take_dlpack_tensors_and_fill_out_in_place():
    results = []
    for wrap in (lambda a: a, Tensor):
        m = make_manager("paged", n_kv_heads=N_KV, head_dim=DIM, num_layers=1)
        inputs = m.fetch(m.claim(2), [5, 3])
        rows = np.random.default_rng(2)
        k, v = random_rows(rows, 8, N_KV, DIM), random_rows(rows, 8, N_KV, DIM)
        kvcache.store_kv(inputs, 0, wrap(k), wrap(v), offsets_of([5, 3]))
        q = np.random.default_rng(3).standard_normal((8, N_Q, DIM)).astype(np.float32)
        out = np.full((8, N_Q, DIM), np.nan, np.float32)
        wrapped_out = wrap(out)
        returned = kvcache.attention(inputs, 0, wrap(q), offsets_of([5, 3]), out=wrapped_out)
        assert returned is wrapped_out  # the caller's tensor, filled in its own memory
        assert not np.isnan(out).any()
        results.append((inputs.blocks.copy(), out))
    assert np.array_equal(results[0][0], results[1][0])
    assert np.array_equal(results[0][1], results[1][1])


def test_an_imported_out_is_handed_back_to_its_producer():
    _, inputs, q = filled_inputs()
    out = np.zeros((8, N_Q, DIM), np.float32)
    tensor = Tensor(out)
    base = sys.getrefcount(out)
    kvcache.attention(inputs, 0, q, offsets_of([5, 3]), out=tensor)
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.attention(inputs, 0, q, offsets_of([5, 3]), out=Tensor(out.reshape(8, N_Q * DIM)))
    gc.collect()
    assert sys.getrefcount(out) == base  # both capsules' deleters ran
    assert np.array_equal(out, kvcache.attention(inputs, 0, q, offsets_of([5, 3])))


def test_float16_dlpack_rows_are_converted_like_numpy_arrays():
    _, inputs, q = filled_inputs()
    expected = kvcache.attention(inputs, 0, q.astype(np.float16), offsets_of([5, 3]))
    got = kvcache.attention(inputs, 0, Tensor(q.astype(np.float16)), offsets_of([5, 3]))
    assert np.array_equal(expected, got)


def test_kernels_refuse_dlpack_tensors_they_cannot_view():
    _, inputs, q = filled_inputs()
    offsets = offsets_of([5, 3])
    wide = np.zeros((8, 2 * N_Q, DIM), np.float32)
    with pytest.raises(kvcache.InvalidArgument, match=r"q is a DLPack tensor of shape "
                                                      r"\(8, 4, 8\) that is not C-contiguous"):
        kvcache.attention(inputs, 0, Tensor(wide[:, ::2]), offsets)
    with pytest.raises(kvcache.InvalidArgument, match="k_new is a DLPack tensor of dtype int32"):
        kvcache.store_kv(inputs, 0, Tensor(np.zeros((8, N_KV, DIM), np.int32)),
                         np.zeros((8, N_KV, DIM), np.float32), offsets)
    bits = np.zeros((8, N_KV, DIM), np.uint16)
    with pytest.raises(kvcache.InvalidArgument, match="v_new is a DLPack tensor NumPy cannot view"):
        kvcache.store_kv(inputs, 0, np.zeros((8, N_KV, DIM), np.float32),
                         kvcache.as_bf16(bits), offsets)
    with pytest.raises(kvcache.InvalidArgument, match="out is a DLPack tensor of dtype code 2, "
                                                      "64 bits: it must be float32"):
        kvcache.attention(inputs, 0, q, offsets, out=Tensor(np.zeros((8, N_Q, DIM))))
    with pytest.raises(kvcache.InvalidArgument, match=r"out is a DLPack tensor of shape "
                                                      r"\(8, 4, 8\) that is not C-contiguous"):
        kvcache.attention(inputs, 0, q, offsets, out=Tensor(wide[:, ::2]))
    with pytest.raises(kvcache.InvalidArgument, match="out must be .* shaped like q"):
        kvcache.attention(inputs, 0, q, offsets, out=Tensor(np.zeros((8, N_Q, 2), np.float32)))
    with pytest.raises(kvcache.InvalidArgument, match="out is a DLPack tensor that refused "
                                                      "to export .*only supports"):
        kvcache.attention(inputs, 0, q, offsets, out=Tensor(np.zeros((8, N_Q, DIM), bool)))
    with pytest.raises(kvcache.InvalidArgument, match="q is <class 'object'>"):
        kvcache.attention(inputs, 0, object(), offsets)


# ---- kvcache.as_bf16: a capsule of our own --------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor)))]

_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def managed_tensor(capsule):
    assert _api.PyCapsule_IsValid(capsule, b"dltensor") == 1
    return DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor"))


def bf16_blocks():
    m, inputs, _ = filled_inputs("bfloat16")
    return m, inputs, inputs.blocks


def test_as_bf16_capsule_describes_the_same_memory_as_bfloat16():
    _, _, blocks = bf16_blocks()
    view = kvcache.as_bf16(blocks)
    assert view.bits is blocks and view.shape == blocks.shape and view.dtype == "bfloat16"
    assert view.__dlpack_device__() == (1, 0)
    assert repr(view) == f"BF16Array(shape={blocks.shape}, dtype=bfloat16)"
    capsule = view.__dlpack__()
    t = managed_tensor(capsule).dl_tensor
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (4, 16, 1)  # kDLBfloat
    assert (t.device.device_type, t.device.device_id) == (1, 0)      # kDLCPU
    assert t.data == blocks.ctypes.data and t.byte_offset == 0
    assert [t.shape[i] for i in range(t.ndim)] == list(blocks.shape)
    assert [t.strides[i] for i in range(t.ndim)] == [s // 2 for s in blocks.strides]


def test_as_bf16_of_a_strided_slice_gives_element_strides():
    _, _, blocks = bf16_blocks()
    keys = blocks[:, 0]  # every page's K: not contiguous
    capsule = kvcache.as_bf16(keys).__dlpack__()
    t = managed_tensor(capsule).dl_tensor
    assert t.ndim == 5 and t.data == keys.ctypes.data
    assert [t.strides[i] for i in range(5)] == [s // 2 for s in keys.strides]


def test_capsule_holds_the_array_until_freed_or_consumed():
    _, _, blocks = bf16_blocks()
    view = kvcache.as_bf16(blocks)
    base = sys.getrefcount(blocks)
    capsule = view.__dlpack__()
    assert sys.getrefcount(blocks) == base + 1
    del capsule  # never consumed: its destructor frees the tensor
    assert sys.getrefcount(blocks) == base
    # Consumed: a consumer renames the capsule and calls the deleter when done.
    capsule = view.__dlpack__()
    managed = managed_tensor(capsule)
    assert _api.PyCapsule_SetName(capsule, b"used_dltensor") == 0
    del capsule  # now the consumer's: the capsule's destructor leaves it
    assert sys.getrefcount(blocks) == base + 1
    managed.deleter(ctypes.pointer(managed))
    assert sys.getrefcount(blocks) == base


def test_as_bf16_refuses_what_it_cannot_view():
    for bad, why in ((np.zeros(4, np.float32), "dtype float32"),
                     ([1, 2, 3], "not a NumPy array")):
        with pytest.raises(kvcache.InvalidArgument, match=why):
            kvcache.as_bf16(bad)
    _, inputs, _ = filled_inputs("bfloat16")
    with pytest.raises(kvcache.InvalidArgument, match="read-only"):
        kvcache.as_bf16(inputs.cache_lengths.view(np.uint16))
    view = kvcache.as_bf16(inputs.blocks)
    with pytest.raises(BufferError, match="stream"):
        view.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="CPU"):
        view.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="copy"):
        view.__dlpack__(copy=True)
    assert view.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False) is not None


# ---- torch, where Debian's python3-torch is installed ---------------------------------------


def test_torch_sees_bf16_blocks_and_feeds_the_kernels():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    _, inputs, q = filled_inputs("bfloat16")
    blocks = inputs.blocks
    t = torch.from_dlpack(kvcache.as_bf16(blocks))
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == blocks.shape
    assert t.data_ptr() == blocks.ctypes.data
    assert torch.equal(t.float(), torch.from_numpy(kvcache.bf16_to_float32(blocks)))
    t[0, 0, 0, 0, 0, 0] = 1.0
    assert blocks[0, 0, 0, 0, 0, 0] == 0x3F80  # 1.0 in bf16, written through torch
    out = torch.empty((8, N_Q, DIM), dtype=torch.float32)
    ref = kvcache.attention(inputs, 0, q, offsets_of([5, 3]))
    assert kvcache.attention(inputs, 0, torch.from_numpy(q), offsets_of([5, 3]), out=out) is out
    assert np.array_equal(out.numpy(), ref)
