"""Metrics and logging through the Python binding: metrics_text after a
scripted lifecycle (exact values, every line valid exposition format, every
name documented in docs/metrics.md), the log level and handler (a callable,
a logging.Logger, a raising handler, threads), KVCACHE_LOG_LEVEL and exit
with a handler set while daemon threads log (child interpreters)."""
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading

import pytest

import kvcache

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "..", "docs", "metrics.md")
MODULE_DIR = os.path.dirname(os.path.abspath(kvcache.__file__))

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABELS = r'\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*\}'
SAMPLE = re.compile(rf"({NAME})({LABELS})? ([0-9]+)")


def parse(text):
    """Checks the exposition format; returns {name{labels}: value} and {name: type}."""
    assert text.endswith("\n")
    samples, types, helped = {}, {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert re.fullmatch(NAME, name) and name not in helped, line
            helped.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name in helped and name not in types and kind in ("gauge", "counter"), line
            assert name.endswith("_total") == (kind == "counter"), line
            types[name] = kind
        else:
            m = SAMPLE.fullmatch(line)
            assert m and m.group(1) in types, line
            samples[m.group(1) + (m.group(2) or "")] = int(m.group(4))
    return samples, types


def prefix_manager(pages=4):
    params = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4, num_layers=1,
                                   cache_strategy="paged", page_size=4,
                                   enable_prefix_caching=True)
    return kvcache.PagedKVCacheManager(params, 4, 64, total_num_pages=pages)


def scripted_lifecycle(m):
    """Two prefix lookups (8 of 18 tokens hit), a copy-on-write fork, two evictions."""
    prompt = list(range(1, 10))
    a, = m.claim(1)
    m.match_prefix(a, prompt)
    m.fetch([a], [9])
    m.step([a], [9], token_ids=prompt)
    m.release(a)
    b, = m.claim(1)
    assert m.match_prefix(b, prompt) == 8
    m.fetch([b], [1])
    m.step([b], [1], token_ids=[9])
    c = m.fork(b)
    m.fetch([c], [1])
    m.step([c], [1], token_ids=[10])
    m.release(c)
    m.release(b)
    d, = m.claim(1)
    m.fetch([d], [13])
    m.step([d], [13], token_ids=list(range(100, 113)))


@pytest.fixture
def quiet_logs():
    yield
    kvcache.set_log_handler(None)
    kvcache.set_log_level("off")


def test_metrics_text_after_scripted_lifecycle():
    m = prefix_manager()
    scripted_lifecycle(m)
    text = m.metrics_text()
    assert kvcache.metrics_text(m) == text
    samples, types = parse(text)
    pool, plain = '{strategy="paged",tier="device"}', '{strategy="paged"}'
    assert samples == {
        "kvcache_blocks_capacity" + pool: 4, "kvcache_blocks_free" + pool: 0,
        "kvcache_blocks_used" + pool: 4, "kvcache_blocks_cached" + pool: 0,
        "kvcache_blocks_pinned" + pool: 0, "kvcache_page_size" + plain: 4,
        "kvcache_pool_bytes" + pool: 512, "kvcache_sequences_active" + plain: 1,
        "kvcache_sequences_claimed_total" + plain: 3,
        "kvcache_sequences_forked_total" + plain: 1,
        "kvcache_sequences_released_total" + plain: 3, "kvcache_fetches_total" + plain: 4,
        "kvcache_steps_total" + plain: 4, "kvcache_committed_tokens_total" + plain: 24,
        "kvcache_prefix_lookups_total" + plain: 2,
        "kvcache_prefix_prompt_tokens_total" + plain: 18,
        "kvcache_prefix_hit_tokens_total" + plain: 8,
        "kvcache_prefix_published_blocks_total" + plain: 5,
        "kvcache_evictions_total" + pool: 2, "kvcache_cow_copies_total" + plain: 1,
    }
    assert types["kvcache_evictions_total"] == "counter"
    assert m.metrics().evictions == 2  # the same figure PrefixCacheMetrics gives


def test_every_metric_is_documented():
    with open(DOCS, encoding="utf-8") as f:
        docs = f.read()
    _, types = parse(prefix_manager().metrics_text())
    for name, kind in types.items():
        assert f"| `{name}` | {kind} |" in docs, f"{name} ({kind}) is not in docs/metrics.md"


def test_continuous_manager_and_prefix():
    params = kvcache.KVCacheParams(dtype="float16", n_kv_heads=1, head_dim=8, num_layers=2,
                                   cache_strategy="continuous")
    m = kvcache.ContinuousBatchingKVCacheManager(params, 3, 16)
    seqs = m.claim(2)
    m.fetch(seqs, [5, 3])
    m.step(seqs, [5, 3])
    samples, _ = parse(m.metrics_text(prefix="engine_kv"))
    pool = '{strategy="continuous",tier="device"}'
    assert samples["engine_kv_blocks_free" + pool] == 1
    assert samples["engine_kv_pool_bytes" + pool] == 3 * 16 * 2 * 2 * 8 * 2
    assert samples['engine_kv_committed_tokens_total{strategy="continuous"}'] == 8
    with pytest.raises(kvcache.InvalidArgument, match="'kv-cache' is not a Prometheus"):
        m.metrics_text("kv-cache")


def test_handler_receives_the_level_and_above(quiet_logs):
    got = []
    kvcache.set_log_handler(lambda level, message: got.append((level, message)))
    kvcache.set_log_level("info")
    assert kvcache.log_level() == "info"
    m = prefix_manager(pages=2)
    a, = m.claim(1)
    m.fetch([a], [8])
    m.step([a], [8], token_ids=list(range(8)))
    m.release(a)
    b, = m.claim(1)
    m.fetch([b], [5])  # evicts both cached pages: a debug line, below info
    assert len(got) == 1 and got[0][0] == "info", got
    assert got[0][1].startswith("paged manager: 2 pages of 4 tokens"), got
    kvcache.set_log_level("DEBUG")
    m.release(b)
    c, = m.claim(1)
    m.fetch([c], [5])  # nothing cached to evict: no line
    m.release(c)
    assert len(got) == 1
    with pytest.raises(kvcache.InvalidArgument, match="'loud'"):
        kvcache.set_log_level("loud")
    assert kvcache.log_level() == "debug"


def test_logging_logger_handler(quiet_logs, caplog):
    logger = logging.getLogger("kvcache.test")
    kvcache.set_log_handler(logger)
    kvcache.set_log_level("debug")
    with caplog.at_level(logging.DEBUG, logger="kvcache.test"):
        m = prefix_manager(pages=2)
        a, = m.claim(1)
        m.fetch([a], [8])
        m.step([a], [8], token_ids=list(range(8)))
        m.release(a)
        b, = m.claim(1)
        m.fetch([b], [5])
    levels = [(r.levelno, r.getMessage()[:28]) for r in caplog.records]
    assert levels == [(logging.INFO, "paged manager: 2 pages of 4 "),
                      (logging.DEBUG, "paged manager: fetch (batch ")], levels


def test_raising_handler_goes_to_unraisablehook(quiet_logs, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))

    def handler(level, message):
        raise RuntimeError("handler failed")

    kvcache.set_log_handler(handler)
    kvcache.set_log_level("info")
    prefix_manager()  # logs; the manager is made all the same
    assert len(seen) == 1 and "handler failed" in str(seen[0])
    with pytest.raises(kvcache.InvalidArgument, match="logging.Logger, a callable"):
        kvcache.set_log_handler(42)


def test_threads_log_through_a_python_handler(quiet_logs):
    got = []
    lock = threading.Lock()

    def handler(level, message):
        with lock:
            got.append(level)

    kvcache.set_log_handler(handler)
    kvcache.set_log_level("debug")

    def work():
        m = prefix_manager(pages=2)
        for i in range(50):
            s, = m.claim(1)
            m.fetch([s], [8])
            m.step([s], [8], token_ids=[i * 8 + t for t in range(8)])
            m.release(s)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Each thread: one info line, then 49 fetches that evict the previous prompt's 2 pages.
    assert got.count("info") == 4 and got.count("debug") == 4 * 49


def run_dev(script, env_extra):
    path = os.pathsep.join(p for p in (MODULE_DIR, os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items() if k != "KVCACHE_LOG_LEVEL"}
    env.update(PYTHONDEVMODE="1", PYTHONPATH=path, **env_extra)
    return subprocess.run([sys.executable, "-X", "dev", "-c", textwrap.dedent(script)],
                          env=env, capture_output=True, text=True, timeout=120)


MAKE_ONE = """
    import kvcache
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4, num_layers=1,
                              cache_strategy="paged", page_size=4)
    kvcache.PagedKVCacheManager(p, 2, 8, total_num_pages=2)
    print(kvcache.log_level())
"""


def test_kvcache_log_level_from_the_environment():
    loud = run_dev(MAKE_ONE, {"KVCACHE_LOG_LEVEL": "debug"})
    assert loud.returncode == 0, loud.stderr
    assert loud.stdout.strip() == "debug"
    assert "kvcache [info] paged manager: 2 pages of 4 tokens" in loud.stderr, loud.stderr
    quiet = run_dev(MAKE_ONE, {})
    assert quiet.returncode == 0 and quiet.stdout.strip() == "off"
    assert "kvcache" not in quiet.stderr, quiet.stderr


EXIT_WHILE_THREADS_LOG = """
    import logging, threading, kvcache
    logging.basicConfig(level=logging.DEBUG)
    kvcache.set_log_handler(logging.getLogger("kvcache"))
    kvcache.set_log_level("debug")
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4, num_layers=1,
                              cache_strategy="paged", page_size=4, enable_prefix_caching=True)
    started = threading.Barrier(5)

    def work():
        m = kvcache.PagedKVCacheManager(p, 1, 64, total_num_pages=2)
        i = 0
        while True:
            s, = m.claim(1)
            m.fetch([s], [8])
            m.step([s], [8], token_ids=[i * 8 + t for t in range(8)])
            m.release(s)
            i += 1
            if i == 3:
                started.wait()

    for _ in range(4):
        threading.Thread(target=work, daemon=True).start()
    started.wait()
    print("exiting")
"""


def test_exit_while_daemon_threads_log_through_python():
    for _ in range(2):
        result = run_dev(EXIT_WHILE_THREADS_LOG, {})
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == "exiting"
        assert "DEBUG:kvcache:paged manager: fetch (batch of 1) evicted 2" in result.stderr
        assert "Fatal" not in result.stderr and "terminate" not in result.stderr
