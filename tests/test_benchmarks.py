"""Every benchmark runs, once, with small arguments: a benchmark that breaks fails here,
not on the day its figures are needed. The figures themselves are not checked (speed is
measured by the benchmarks, on a quiet machine); what is checked is that each one finishes,
exits 0 and prints its Markdown table. ``load_test.py`` exits 1 on any wrong or failed
answer, so its row is also the load test: 32 concurrent clients, both loaders, no error.

The benchmarks that import TensorFlow, PyTorch or the trainers share one interpreter
(``SHARED``): each runs through its ``main(argv)`` in turn, so those (4-7 CPU-s each) are
imported once instead of once per script.
"""

from __future__ import annotations

import json
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
    # fresh processes of its own, not SHARED
    ("first_fit.py", ["--models", "cnn", "--repeats", "1"], 4),
    ("overhead.py", ["--models", "flatten", "--step-functions", "--op-profile", "5",
                     "--quick"], 5),
    ("torch_overhead.py", ["--models", "cnn", "--quick", "--no-wandb"], 5),
    ("trainers_overhead.py", ["--quick", "--no-wandb"], 6),
    # spawns its own 2 ranks: a process of its own, not SHARED
    ("sharded_overhead.py", ["--quick"], 3),
    ("findings_validation.py", ["--only", "relu_output", "--epochs", "2"], 5),
    ("format_bytes.py", ["--steps", "8", "--bench-tensors", "20", "--bench-steps", "3",
                         "--keras-model", "flatten"], 5),
    ("bucket_bench.py", ["--quick"], 5),
    # The demo's stories on other CPUs: a slice of the matrix, each cell another seed, thread
    # count and kernel path than the suite's own demos (seed 0, one thread, this CPU's).
    ("demo_robustness.py", ["--jobs", "1", "--cells", "torch/aten-avx2/seed1/2t",
                            "torch/aten-default/seed2/1t", "keras/onednn-off/seed3/2t"], 10),
]


#: The scripts run in one interpreter, in this order.
SHARED = ["stats_bench.py", "engine_bench.py", "overhead.py", "format_bytes.py",
          "findings_validation.py", "torch_overhead.py", "trainers_overhead.py", "bucket_bench.py"]

#: Runs each (script, args) of argv[2] (JSON) through the script's main(argv), each output
#: between markers; the exit status of a run is its return value, SystemExit's code, or 1 on
#: an exception, whose traceback goes to stderr.
DRIVER = """
import json, sys, traceback
sys.path.insert(0, sys.argv[1])
for script, args in json.loads(sys.argv[2]):
    print(f"<<<begin {script} {args}>>>", flush=True)
    try:
        rc = __import__(script[:-3]).main(args) or 0
    except SystemExit as e:  # sys.exit("message") is a failure too
        rc = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
        rc = 1
    print(f"<<<end {rc}>>>", flush=True)
"""


def test_every_benchmark_is_listed() -> None:
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts == {s for s, _, _ in SMALL}
    assert set(SHARED) <= scripts


def _run(cmd: list[str], minutes: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60 * minutes, env=env)


@pytest.fixture(scope="module")
def driver_runs() -> dict[tuple[str, tuple[str, ...]], tuple[int, str, str]]:
    """(script, args) -> (exit status, stdout, the whole stderr) of the ``SHARED`` runs."""
    runs = [(s, a) for s, a, _ in SMALL if s in SHARED]
    runs.sort(key=lambda r: SHARED.index(r[0]))
    r = _run([sys.executable, "-c", DRIVER, str(BENCHMARKS), json.dumps(runs)],
             sum(m for s, _, m in SMALL if s in SHARED))
    out: dict[tuple[str, tuple[str, ...]], tuple[int, str, str]] = {}
    for (script, args), section in zip(runs, r.stdout.split("<<<begin ")[1:], strict=False):
        body, _, rest = section.partition("<<<end ")
        rc = int(rest.split(">>>", 1)[0]) if rest else -1  # no end: the interpreter died
        out[script, tuple(args)] = (rc, body.split(">>>\n", 1)[-1], r.stderr)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args", "minutes"), SMALL, ids=[s for s, _, _ in SMALL])
def test_benchmark_runs(script: str, args: list[str], minutes: int, request) -> None:
    if script in SHARED:
        rc, stdout, stderr = request.getfixturevalue("driver_runs").get(
            (script, tuple(args)), (-1, "", "its run never started"))
    else:
        r = _run([sys.executable, str(BENCHMARKS / script), *args], minutes)
        rc, stdout, stderr = r.returncode, r.stdout, r.stderr
    if rc != 0:  # every line: a truncated assertion repr would hide the errors
        pytest.fail(f"{script} exited {rc}\n--- stdout\n{stdout[-4000:]}"
                    f"\n--- stderr\n{stderr[-6000:]}", pytrace=False)
    if script == "align_bench.py":
        assert "per field / one pass:" in stdout, stdout[-2000:]
        return
    table = [line for line in stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 3, stdout[-2000:]  # a header, its rule and at least one row
    # engine_bench's XLA rows run in child processes, whose failure is a table cell (a large
    # N may not fit a small machine); at the smoke run's N it is a broken benchmark.
    assert not any("| failed |" in line for line in table), stdout[-2000:]
