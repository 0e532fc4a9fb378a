"""Regression tests for crashes: what fetch returns never reads freed memory
(issue 39 item 1), interpreter exit with daemon threads inside manager calls
(issue 40 item 6), and the first NumPy use from several threads at once.
Crashes and hangs are caught by running the scenario in a child interpreter
in development mode (python3 -X dev, PYTHONDEVMODE=1)."""
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np

import kvcache
from kv_helpers import make_manager

MODULE_DIR = os.path.dirname(os.path.abspath(kvcache.__file__))


def run_dev(script, timeout=60):
    """Runs `script` in a child `python3 -X dev` that imports this kvcache."""
    path = os.pathsep.join(p for p in (MODULE_DIR, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONDEVMODE="1", PYTHONPATH=path)
    return subprocess.run([sys.executable, "-X", "dev", "-c", textwrap.dedent(script)],
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_indexing_what_fetch_returns_is_memory_safe():
    # Before the fix, out[0] returned an accessor into a freed temporary tuple:
    # a tuple instead of blocks, out[1..3] crashed under PYTHONDEVMODE=1.
    result = run_dev("""
        import gc, numpy as np, kvcache
        p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=2, head_dim=4, num_layers=1)
        m = kvcache.ContinuousBatchingKVCacheManager(p, 2, 8)
        out = m.fetch(m.claim(2), [1, 1])
        x = out[0]
        blocks, lengths, table, empty = x
        assert blocks.shape == (2, 2, 1, 8, 2, 4), blocks.shape
        try:
            out[1]
            raise SystemExit("out[1] of a one-device fetch did not raise")
        except IndexError:
            pass
        del out, m
        gc.collect()
        blocks[...] = 1.0
        assert float(blocks.sum()) == blocks.size and list(lengths) == [0, 0] and bool(empty)
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_views_outlive_the_manager_and_the_list():
    m = make_manager("paged")
    out = m.fetch(m.claim(2), [5, 3])
    blocks, lengths, table, empty = out[0]
    reserved = out.reserved_lengths
    del m, out
    gc.collect()
    blocks[...] = 2.0  # the manager's buffer, kept alive by the views
    assert float(blocks.sum()) == 2.0 * blocks.size
    assert list(lengths) == [0, 0] and list(reserved) == [5, 3] and bool(empty)
    assert table.shape == (2, 2)


EXIT_WITH_DAEMON_THREADS = """
    import threading, numpy as np, kvcache
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=8, num_layers=1,
                              cache_strategy="paged", page_size=4)
    started = threading.Barrier(5)

    def work():
        m = kvcache.PagedKVCacheManager(p, 16, 1024)
        q = np.ones((16 * 64, 1, 8), np.float32)
        first = True
        while True:
            ids = m.claim(16)
            inputs = m.fetch(ids, 64)
            kvcache.attention(inputs, 0, q, np.arange(17, dtype=np.uint32) * 64)
            m.step(ids, 64)
            for s in ids:
                m.release(s)
            if first:
                first = False
                started.wait()

    for _ in range(4):
        threading.Thread(target=work, daemon=True).start()
    started.wait()
    print("exiting")
"""


def test_exit_while_daemon_threads_are_inside_manager_calls():
    # Before the fix: "terminate called without an active exception" (SIGABRT)
    # in nearly every run.
    for _ in range(3):
        result = run_dev(EXIT_WITH_DAEMON_THREADS)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "exiting"
        assert "terminate" not in result.stderr and "Traceback" not in result.stderr, \
            result.stderr


def test_manager_calls_still_work_in_a_later_atexit_handler():
    # atexit runs handlers last-registered first: this one runs after kvcache's
    # drain, when calls keep the GIL.
    result = run_dev("""
        import atexit

        def at_exit():
            ids = m.claim(2)
            inputs = m.fetch(ids, [3, 1])
            m.step(ids, [3, 1])
            print("at exit", [m.cache_length(s) for s in ids], list(inputs.cache_lengths))

        atexit.register(at_exit)
        import kvcache
        p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4, num_layers=1)
        m = kvcache.ContinuousBatchingKVCacheManager(p, 2, 8)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "at exit [3, 1] [0, 0]"


def test_first_numpy_use_from_several_threads_does_not_deadlock():
    # Before the fix: a function-local static that imports a NumPy module was
    # first run by several threads at once; the import released the GIL inside
    # the static's guard and the threads deadlocked (every run hung).
    result = run_dev("""
        import threading, kvcache
        p = kvcache.KVCacheParams(dtype="float16", n_kv_heads=1, head_dim=4, num_layers=1,
                                  cache_strategy="paged", page_size=1)

        def work():
            m = kvcache.PagedKVCacheManager(p, 8, 64)
            for _ in range(20):
                ids = m.claim(8)
                m.fetch(ids, 4)
                m.step(ids, 4)
                for s in ids:
                    m.release(s)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("ok")
    """, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_fetch_result_items_are_plain_tuples_of_arrays():
    m = make_manager("continuous")
    out = m.fetch(m.claim(1))
    assert type(out[0]) is tuple and len(out[0]) == 4
    assert all(isinstance(a, np.ndarray) for a in out[0])
    assert out[-1] is out[0] and len(out) == 1
