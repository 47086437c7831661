"""The fingerprint cache behind the plugin's rendered documents."""

from __future__ import annotations

import threading
import time

import pytest

from tb_introspect.plugin.cache import FingerprintCache


def test_recomputes_when_the_fingerprint_changes() -> None:
    cache = FingerprintCache(max_entries=4)
    calls = []

    def compute(tag):
        calls.append(tag)
        return tag

    assert cache.get("run", (1,), lambda: compute("a")) == "a"
    assert cache.get("run", (1,), lambda: compute("b")) == "a"
    assert cache.get("run", (2,), lambda: compute("c")) == "c"
    assert calls == ["a", "c"]


def test_evicts_least_recently_used_by_count_and_bytes() -> None:
    cache = FingerprintCache(max_entries=2, max_bytes=10)
    cache.get("a", 0, lambda: b"aaaa")
    cache.get("b", 0, lambda: b"bbbb")
    cache.get("a", 0, lambda: b"new!")  # hit: "a" becomes most recent
    cache.get("c", 0, lambda: b"cccc")  # count limit: "b" goes
    assert cache.get("a", 0, lambda: b"miss") == b"aaaa"
    assert cache.get("b", 0, lambda: b"BBBB") == b"BBBB"
    cache.get("big", 0, lambda: b"x" * 50)  # over the byte budget alone: kept, others go
    assert cache.get("big", 0, lambda: b"miss") == b"x" * 50
    assert cache.get("a", 0, lambda: b"AAAA") == b"AAAA"


def test_concurrent_callers_share_one_computation() -> None:
    cache = FingerprintCache()
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return "value"

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", 0, slow)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["value"] * 4 and len(calls) == 1


def test_failed_computation_is_not_cached() -> None:
    cache = FingerprintCache(max_entries=1)

    def boom():
        raise RuntimeError("read failed")

    for _ in range(30):  # also exercises the idle-lock pruning
        with pytest.raises(RuntimeError):
            cache.get(object(), 0, boom)
    assert cache.get("k", 0, lambda: 5) == 5


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ttl_expires_values_and_put_stores_one() -> None:
    clock = Clock()
    cache = FingerprintCache(ttl_s=0.2, clock=clock)
    assert cache.get("all", None, lambda: 1) == 1
    cache.put("run", None, "listed with all")
    clock.now += 0.19
    assert cache.get("all", None, lambda: 2) == 1
    assert cache.peek("run", None) == "listed with all"
    clock.now += 0.02
    assert cache.peek("run", None) is None
    assert cache.get("all", None, lambda: 3) == 3


def test_costly_values_live_longer() -> None:
    clock = Clock()
    cache = FingerprintCache(ttl_s=0.1, ttl_per_cost=2.0, clock=clock)

    def slow():
        clock.now += 0.15
        return "slow"

    cache.get("slow", None, slow)  # took 0.15 s: valid for 0.3 s
    cache.get("fast", None, lambda: "fast")  # valid for ttl_s
    clock.now += 0.15
    assert cache.peek("slow", None) == "slow" and cache.peek("fast", None) is None
    clock.now += 0.14
    assert cache.peek("slow", None) == "slow"
    clock.now += 0.02
    assert cache.peek("slow", None) is None
