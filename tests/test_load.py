"""Load: 32 concurrent clients against a real TensorBoard on loopback, both loaders.

A smaller twin of ``benchmarks/load_test.py`` (same code, 200 tensors x 4
views but 20 steps, 5 requests per client): every answer must be a complete,
correct 200 (runs, run contents, overview, series of random tags); p50/p99
are printed (``pytest -s``). The README figures come from the benchmark.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import load_test  # noqa: E402
from plugin_bench import write_bench_run  # noqa: E402

TENSORS, STEPS, CLIENTS, REQUESTS = 200, 20, 32, 5


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("load") / "logs"
    write_bench_run(str(root / "bench"), TENSORS, STEPS)
    return root


@pytest.mark.parametrize("load_fast", ["false", "true"], ids=["python-loader", "rust-loader"])
def test_32_concurrent_clients_zero_errors(logdir, load_fast):
    result = load_test.load_against(logdir, load_fast, TENSORS, STEPS, CLIENTS, REQUESTS,
                                    load_timeout=120)
    print("\n" + load_test.table([(load_fast, result)]))
    assert result.errors == [], result.errors[:5]
    assert result.requests == CLIENTS * REQUESTS
    # Every route of the mix was exercised by many clients at once.
    assert all(len(v) >= CLIENTS for v in result.latencies.values())
