"""Every benchmark runs, once, with small arguments: a benchmark that breaks fails here,
not on the day its figures are needed. The figures themselves are not checked (speed is
measured by the benchmarks, on a quiet machine); what is checked is that each one finishes,
exits 0 and prints its Markdown table. ``load_test.py`` exits 1 on any wrong or failed
answer, so its row is also the load test: 32 concurrent clients, both loaders, no error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

#: (script, small arguments, minutes allowed); each prints a Markdown table but align_bench,
#: whose last line is its ratio.
SMALL = [
    ("align_bench.py", ["--tensors", "20", "--steps", "200", "--repeats", "2"], 3),
    ("stats_bench.py", ["--sizes", "1000", "--kinds", "relu", "--repeats", "1"], 5),
    ("engine_bench.py", ["--repeats", "1", "--xla-sizes", "1", "--log-model", "flatten"], 8),
    # one loader each: load_test below runs both
    ("plugin_bench.py", ["--tensors", "10", "--steps", "60", "--repeats", "2", "--isolated",
                         "1", "--cold", "1", "--loaders", "true"], 5),
    ("frontend_bench.py", ["--tensors", "10", "--steps", "60", "--repeats", "1", "--cold",
                           "1"], 5),
    ("load_test.py", ["--tensors", "200", "--steps", "20", "--clients", "32", "--requests",
                      "5"], 5),
    ("overhead.py", ["--models", "flatten", "--every", "epoch", "--quick"], 8),
    ("overhead.py", ["--models", "flatten", "--step-functions", "--op-profile", "5",
                     "--quick"], 5),
    ("torch_overhead.py", ["--models", "cnn", "--quick", "--no-wandb"], 5),
    ("trainers_overhead.py", ["--quick", "--no-wandb"], 6),
    ("findings_validation.py", ["--only", "relu_output", "--epochs", "2"], 5),
    ("format_bytes.py", ["--steps", "8", "--bench-tensors", "20", "--bench-steps", "3",
                         "--keras-model", "flatten"], 5),
    ("bucket_bench.py", ["--quick"], 5),
]


def test_every_benchmark_is_listed() -> None:
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts == {s for s, _, _ in SMALL}


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args", "minutes"), SMALL, ids=[s for s, _, _ in SMALL])
def test_benchmark_runs(script: str, args: list[str], minutes: int) -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    r = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True,
                       text=True, timeout=60 * minutes, env=env)
    if r.returncode != 0:  # every line: a truncated assertion repr would hide the errors
        pytest.fail(f"{script} exited {r.returncode}\n--- stdout\n{r.stdout[-4000:]}"
                    f"\n--- stderr\n{r.stderr[-6000:]}", pytrace=False)
    if script == "align_bench.py":
        assert "per field / one pass:" in r.stdout, r.stdout[-2000:]
        return
    table = [line for line in r.stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 3, r.stdout[-2000:]  # a header, its rule and at least one row
    # engine_bench's XLA rows run in child processes, whose failure is a table cell (a large
    # N may not fit a small machine); at the smoke run's N it is a broken benchmark.
    assert not any("| failed |" in line for line in table), r.stdout[-2000:]
