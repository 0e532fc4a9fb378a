"""Hostile input through the Python module (issue 40): every bad number is a
typed kvcache error naming the value, never a pybind11 cast error, a NaN
result or a hang."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvcache
from kv_helpers import make_manager


@pytest.mark.parametrize("memory", [-1, 2**64, 1.5, "1GiB"])
def test_cache_memory_out_of_range_is_invalid_argument(memory):
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4, num_layers=1,
                              cache_strategy="paged", page_size=4)
    with pytest.raises(kvcache.InvalidArgument, match="cache_memory"):
        kvcache.PagedKVCacheManager(p, 2, 16, cache_memory=memory)
    with pytest.raises(kvcache.InvalidArgument, match="cache_memory"):
        kvcache.PagedKVCacheManager.estimated_memory_size(p, 2, 16, cache_memory=memory)


def test_rope_table_refuses_head_dim_zero():
    with pytest.raises(kvcache.InvalidArgument, match="head_dim 0"):
        kvcache.RopeTable(0, 16)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_attention_refuses_a_scale_that_is_not_finite(scale):
    m = make_manager("paged", n_kv_heads=1, head_dim=4, num_layers=1)
    inputs = m.fetch(m.claim(1), [2])
    kv = np.ones((2, 1, 4), np.float32)
    kvcache.store_kv(inputs, 0, kv, kv, [0, 2])
    with pytest.raises(kvcache.InvalidArgument, match="scale"):
        kvcache.attention(inputs, 0, np.ones((2, 1, 4), np.float32), [0, 2], scale=scale)


def test_thread_pool_refused_by_the_system_is_out_of_memory():
    """A pool of 1024 threads under an address-space limit with room for a few
    thread stacks: OutOfMemory, in a child process (the limit stays there),
    within a time limit (the bug was a hang)."""
    child = textwrap.dedent("""
        import resource, kvcache
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
        limit = mapped + (64 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            kvcache.ThreadPool(1024)
        except kvcache.OutOfMemory as e:
            assert "refused worker" in str(e), str(e)
            print("refused")
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "refused", done.stderr
