"""Every benchmark on a tiny run, and what it claims checked.

Each benchmark runs once with its smallest arguments (``TINY``) through its ``main(argv)``,
and its output is parsed: its tables must have the rows the benchmark names, every ratio in
them must be finite and positive and every other figure a finite number. The figures
themselves are not judged (speed is measured by the benchmarks, on a quiet machine): a
benchmark that breaks, or that stops reporting what it claims, fails here, not on the day
its figures are needed. ``load_test.py`` exits 1 on any wrong or failed answer, so its rows
are also a load test: concurrent clients, both loaders, no error.

A benchmark whose figures come from other processes has a form that runs its own code in
the calling one (``first_fit.py --in-process``, ``engine_bench.py --in-process``,
``sharded_overhead.py --ranks 1``); those that time TensorBoard, a browser, an S3 server or
the demo's processes start them as they always do. The runs share three interpreters
(``DRIVER``, ``GROUPS``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

#: The interpreters the runs share, side by side, each importing what its runs need once:
#: the Keras engine's benchmarks (TensorFlow), the front-ends' and trainers' trainings
#: (TensorFlow and PyTorch), and the serving side's, which mostly wait for the processes they
#: start (the load test, which waits for its TensorBoard, evens the first out). Three keep
#: the two cores busy: with two, the trainings ran one after another.
GROUPS = ("engine", "training", "serving")
#: id -> (script, smallest arguments, interpreter: one of GROUPS), run in this order; Keras on
#: PyTorch starts Keras in its interpreter, where nothing imported Keras before it (Keras on
#: JAX then runs in a child process).
TINY: dict[str, tuple[str, list[str], str]] = {
    "stats_bench": ("stats_bench.py", ["--sizes", "2048", "--kinds", "relu", "--repeats", "1"],
                    "engine"),
    "engine_bench": ("engine_bench.py", ["--repeats", "1", "--elements", "4096", "--xla-sizes",
                                         "1", "--in-process", "--log-model", "tiny"],
                     "engine"),
    "overhead": ("overhead.py", ["--models", "tiny", "--every", "epoch", "--quick"],
                 "engine"),
    "overhead_step_functions": ("overhead.py", ["--models", "tiny", "--step-functions",
                                                "--op-profile", "3", "--quick"], "engine"),
    "first_fit": ("first_fit.py", ["--models", "tiny", "--repeats", "1", "--steps", "2",
                                   "--batch", "8", "--in-process"], "training"),
    "format_bytes": ("format_bytes.py", ["--steps", "2", "--every", "1", "--bench-tensors",
                                         "2", "--bench-steps", "2", "--keras-model", "tiny"],
                     "training"),
    "findings_validation": ("findings_validation.py", ["--only", "relu_output", "--epochs",
                                                       "2"], "training"),
    "trainers_overhead": ("trainers_overhead.py", ["--rounds", "1", "--steps", "4",
                                                   "--no-wandb", "--no-warm-up"], "training"),
    "align_bench": ("align_bench.py", ["--tensors", "10", "--steps", "20", "--repeats", "1"],
                    "serving"),
    "torch_overhead": ("torch_overhead.py", ["--models", "cnn", "--steps", "2", "--rounds", "1",
                                             "--no-wandb"], "training"),
    "sharded_overhead": ("sharded_overhead.py", ["--steps", "2", "--batch", "2", "--rounds",
                                                 "1", "--ranks", "1"], "training"),
    "bucket_bench": ("bucket_bench.py", ["--epochs", "1", "--steps", "2", "--step-ms", "0",
                                         "--flush", "0.05", "--every", "epoch", "--objects",
                                         "2", "--points", "2", "--tensors", "1"], "serving"),
    "plugin_bench": ("plugin_bench.py", ["--tensors", "2", "--steps", "10", "--repeats", "1",
                                         "--isolated", "0", "--cold", "1", "--loaders", "true",
                                         "--poll", "0.1"], "serving"),
    "load_test": ("load_test.py", ["--tensors", "20", "--steps", "10", "--clients", "32",
                                   "--requests", "2", "--poll", "0.1"], "engine"),
    "frontend_bench": ("frontend_bench.py", ["--tensors", "2", "--steps", "10", "--repeats",
                                             "1", "--cold", "0", "--poll", "0.1"], "serving"),
    "keras_torch_overhead": ("keras_backend_overhead.py", ["--model", "tiny", "--steps", "2",
                                                           "--rounds", "1"], "serving"),
    "keras_jax_overhead": ("keras_backend_overhead.py", ["--backend", "jax", "--model", "tiny",
                                                         "--steps", "2", "--rounds", "1"],
                           "serving"),
    "jax_overhead": ("jax_overhead.py", ["--model", "tiny", "--steps", "2", "--rounds", "1"],
                     "engine"),
}
#: Its unit is a fresh process training the quick demo (seconds at least): its tiny run, in
#: ``test_demo_robustness``, judges made-up cells instead.
NOT_RUN = {"demo_robustness.py"}

#: Runs each (id, script, args) of argv[2] (JSON) through the script's main(argv), each
#: output between markers, its seconds on stderr; the exit status of a run is its return
#: value, SystemExit's code, or 1 on an exception, whose traceback goes to stderr.
DRIVER = """
import json, sys, time, traceback
sys.path.insert(0, sys.argv[1])
for name, script, args in json.loads(sys.argv[2]):
    print(f"<<<begin {name}>>>", flush=True)
    t0 = time.perf_counter()
    try:
        rc = __import__(script[:-3]).main(args) or 0
    except SystemExit as e:  # sys.exit("message") is a failure too
        rc = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
        rc = 1
    print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    print(f"<<<end {rc}>>>", flush=True)
"""

#: Minutes the runs of one interpreter may take in all (a loaded machine, not a slow one).
MINUTES = 10


def test_every_benchmark_is_listed() -> None:
    assert {p.name for p in BENCHMARKS.glob("*.py")} == {s for s, _, _ in TINY.values()} | NOT_RUN


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, tuple[int, str, str]]:
    """id -> (exit status, stdout, the interpreter's whole stderr) of every tiny run."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    folder = tmp_path_factory.mktemp("benchmarks")
    procs = []
    for group in GROUPS:
        runs = [(name, s, a) for name, (s, a, g) in TINY.items() if g == group]
        files = folder / f"{group}.out", folder / f"{group}.err"
        with files[0].open("w") as stdout, files[1].open("w") as stderr:
            procs.append((runs, files, subprocess.Popen(
                [sys.executable, "-c", DRIVER, str(BENCHMARKS), json.dumps(runs)],
                stdout=stdout, stderr=stderr, env=env)))
    out: dict[str, tuple[int, str, str]] = {}
    for runs, files, proc in procs:
        try:
            proc.wait(timeout=60 * MINUTES)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stdout, stderr = (f.read_text(errors="replace") for f in files)
        sections = dict(s.split(">>>\n", 1) for s in stdout.split("<<<begin ")[1:])
        for name, _, _ in runs:
            body, _, rest = sections.get(name, "").partition("<<<end ")
            rc = int(rest.split(">>>", 1)[0]) if rest else -1  # no end: the interpreter died
            out[name] = (rc, body, stderr)
    return out


def run(outputs, name: str) -> str:
    """The stdout of ``name``'s tiny run, which must have exited 0."""
    rc, stdout, stderr = outputs[name]
    if rc != 0:  # every line: a truncated assertion repr would hide the errors
        pytest.fail(f"{name} exited {rc}\n--- stdout\n{stdout[-4000:]}"
                    f"\n--- stderr\n{stderr[-6000:]}", pytrace=False)
    return stdout


def tables(stdout: str) -> list[list[list[str]]]:
    """Every Markdown table of ``stdout``: its rows, header first and the rule left out, as
    stripped cells. Each table's rows have the header's width, and none reports a failure
    or a non-finite figure; each ratio in it (``1.05x``, ``0.98×``) is finite and positive."""
    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    def rule(line: str) -> bool:
        return line.startswith("|") and all(re.fullmatch(r":?-+:?", c) for c in cells(line))

    found: list[list[list[str]]] = []
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and rule(lines[i + 1]):  # a header: a table starts
            found.append([cells(line)])
        elif found and line.startswith("|") and not rule(line) and lines[i - 1].startswith("|"):
            found[-1].append(cells(line))
    for table in found:
        for row in table:
            assert len(row) == len(table[0]), (table[0], row)
            for cell in row:
                assert not re.search(r"\b(nan|inf|failed)\b", cell, re.I), row
                if re.fullmatch(r"[+-]?[\d,]*\.?\d+\s*[x×]", cell):
                    assert 0 < number(cell) < math.inf, row
    return found


def number(cell: str) -> float:
    """The number a table cell shows: ``1,234``, ``+0.6 s``, ``1.05x``, ``-27``, ``+5.2 %``."""
    m = re.search(r"[+-]?[\d,]*\.?\d+", cell)
    assert m, f"no number in {cell!r}"
    return float(m.group().replace(",", ""))


def column(table: list[list[str]], header: str) -> list[float]:
    """The numbers of column ``header`` (the first whose title starts so), all finite."""
    i = next(i for i, h in enumerate(table[0]) if h.startswith(header))
    values = [number(row[i]) for row in table[1:]]
    assert all(math.isfinite(v) for v in values), (header, values)
    return values


def labels(table: list[list[str]], col: int = 0) -> list[str]:
    return [row[col] for row in table[1:]]


def test_align_bench(outputs) -> None:
    out = run(outputs, "align_bench")
    for job in ("raws (one pass)", "raw per field", "view_overview"):
        assert re.search(rf"^  {re.escape(job)} +\d+\.\d ms$", out, re.M), out
    ratio = float(re.search(r"per field / one pass: ([\d.]+)x", out).group(1))
    assert 0 < ratio < math.inf


def test_stats_bench(outputs) -> None:
    engine, numpy_twin, magnitudes = tables(run(outputs, "stats_bench"))
    assert labels(engine, 2) == [
        "tfp.stats.percentile (value+log)", "step: batch_state + merge",
        "activity step: activity_state", "output point: finalize", "tensor_stats (summary op)"]
    assert {(r[0], r[1]) for r in engine[1:]} == {("2,048", "relu")}
    assert min(column(engine, "median ms")) > 0 and column(engine, "speed-up")[0] == 1.0
    assert labels(numpy_twin) == ["10,000", "65,536", "262,144"]
    assert min(column(numpy_twin, "sort ms") + column(numpy_twin, "partition ms")) > 0
    assert len(magnitudes) == 7 and min(column(magnitudes, "binary search ms")) > 0


def test_engine_bench(outputs) -> None:
    costs, xla = tables(run(outputs, "engine_bench"))
    names = labels(costs)
    assert names[:6] == [f"`{f}`, 4K elements, {kind}" for kind in ("ReLU-like", "normal")
                         for f in ("stats.batch_state", "stats.activity_state", "tf.reduce_sum")]
    assert len([n for n in names if n.startswith("counts, ")]) == 7
    points = [n for n in names if "Pipeline.log" in n]
    assert [n.split(",")[1].strip() for n in points] == ["the first point (traced)",
                                                         "one later point"]
    assert all(re.search(r"tiny \(\d+ tensors\)$", n) for n in points), points
    assert min(column(costs, "wall ms") + column(costs, "CPU ms")) >= 0
    assert labels(xla) == ["1"] and column(xla, "compile")[0] > 0 and column(xla, "peak")[0] > 0


def test_overhead(outputs) -> None:
    rows, memory = tables(run(outputs, "overhead"))
    assert labels(rows, 1) == ["plain fit", "keras TensorBoard(histogram_freq=1)",
                               "Introspect(every='epoch')"]
    assert column(rows, "wall")[0] == column(rows, "CPU")[0] == 1.0  # the baseline
    assert rows[3][6].isdigit() and rows[3][7] == "<= 1.05x"  # statistics steps, its target
    assert labels(memory, 1) == ["plain fit", "Introspect(every='epoch')"]
    assert column(memory, "in-step state MiB")[1] > 0


def test_overhead_step_functions(outputs) -> None:
    steps, ops = tables(run(outputs, "overhead_step_functions"))
    assert labels(steps, 1) == ["plain train function", "lean step", "statistics step",
                                "lean step, counts off"]
    assert min(column(steps, "CPU ms/step") + column(steps, "wall ms/step")) > 0
    assert len(ops) == 4 and all(re.fullmatch(r"\d+ / \d+", r[4]) for r in ops[1:])


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_keras_backend_overhead(outputs, backend) -> None:
    (table,) = tables(run(outputs, f"keras_{backend}_overhead"))
    assert labels(table) == ["`Introspect(every='epoch')`", "`Introspect(every=16)`"]
    assert min(column(table, "plain epoch s")) > 0


def test_jax_overhead(outputs) -> None:
    (table,) = tables(run(outputs, "jax_overhead"))
    assert labels(table) == ["plain step", "Introspector(every='epoch')",
                             "Introspector(every=16)", "flax histograms per epoch"]
    assert min(column(table, "epoch wall")) > 0
    assert column(table, "wall vs plain")[0] == column(table, "CPU vs plain")[0] == 1.0


def test_first_fit(outputs) -> None:
    (table,) = tables(run(outputs, "first_fit"))
    (row,) = table[1:]
    assert row[0] == "tiny CNN (one conv block; smoke runs)"
    plain, ours = ([float(v) for v in re.findall(r"[\d.]+", cell)] for cell in row[1:3])
    assert min(plain + ours) > 0 and len(plain) == len(ours) == 2  # CPU / wall seconds
    assert re.fullmatch(r"[\d.]+ / [\d.]+ s", row[5]), row  # the first statistics / lean call


def test_format_bytes(outputs) -> None:
    out = run(outputs, "format_bytes")
    (table,) = tables(out)
    assert labels(table) == ["Keras tiny, Introspect (every=1)",
                             "PyTorch CNN, Introspector (every=1)",
                             "plugin_bench run, 2 tensors x 4 views"]
    assert column(table, "logged points") == [2, 2, 2]
    assert min(column(table, "bytes/point without") + column(table, "with")) > 0
    growth = column(table, "growth")
    assert f"largest growth: +{max(growth):.1f} %" in out


def test_findings_validation(outputs) -> None:
    (table,) = tables(run(outputs, "findings_validation"))
    (row,) = table[1:]
    assert row[0] == "relu_output" and row[2] == "warning `rectified_output`"
    assert "`rectified_output`" in row[5], row  # the finding the scenario is there for shows


def test_trainers_overhead(outputs) -> None:
    hf, lightning = tables(run(outputs, "trainers_overhead"))
    assert hf[0][0].startswith("tiny GPT-2, transformers.Trainer")
    assert lightning[0][0].startswith("digits CNN, Lightning")
    for table in (hf, lightning):
        assert labels(table) == ["+ IntrospectCallback()",
                                 "+ IntrospectCallback(views=('variable', 'gradient'))"]
        assert min(column(table, "wall") + column(table, "CPU")) > 0
        # A later point's cost, where the tiny run had a later point after a lean step.
        assert all(r[4] == "" or number(r[4]) > 0 for r in table[1:]), table


def test_torch_overhead(outputs) -> None:
    (table,) = tables(run(outputs, "torch_overhead"))
    assert labels(table, 1) == ["`Introspector(every='epoch')`", "`Introspector(every=16)`"]
    assert set(labels(table)) == {"reference CNN"}


def test_sharded_overhead(outputs) -> None:
    out = run(outputs, "sharded_overhead")
    (table,) = tables(out)
    (row,) = table[1:]
    assert row[:2] == ["GPT-style, FSDP2 × 1", "`Introspector()` (every='epoch')"]
    assert column(table, "bytes per point") == [0]  # one rank gathers nothing from others
    assert re.search(r"; 2 points$", out, re.M), out  # the warm-up's point and the round's


def test_bucket_bench(outputs) -> None:
    uploads, screens = tables(run(outputs, "bucket_bench"))
    assert labels(uploads) == ["epoch"] and column(uploads, "points") == [1]
    assert min(column(uploads, "objects") + column(uploads, "bucket bytes")) > 0
    assert column(screens, "objects") == [2, 3]  # one object and the rolled run, behind its
    assert min(column(screens, "bytes") + column(screens, "./overview")) > 0  # header


def test_plugin_bench(outputs) -> None:
    (table,) = tables(run(outputs, "plugin_bench"))
    assert set(labels(table)) == {"Rust"}
    routes = labels(table, 1)
    assert routes[:-1] == [
        "runs", "run (contents)", "series (1 tag)", "series (1 tag, rms only)", "overview",
        "run, first read of the run's sample", "overview, re-rendered from the cached read",
        "after a data change: run (bounded sampled read)",
        "after a data change: overview (from that read)", "after a data change: run + overview",
        "after a data change: then findings", "after a data change: 1 tag, full resolution"]
    assert routes[-1].startswith("TensorBoard RSS")
    assert min(column(table[:-1], "first call (ms)")) > 0


def test_load_test(outputs) -> None:
    (table,) = tables(run(outputs, "load_test"))  # exit 0: no error answer
    routes = ["runs", "run", "overview", "series", "series x8 rms"]
    assert [(r[0], r[1].split(" (")[0]) for r in table[1:]] == [
        (loader, route) for loader in ("Python", "Rust") for route in (*routes, "**all**")]
    assert set(column(table, "errors")) == {0}
    assert [n for r, n in zip(table[1:], column(table, "requests"), strict=True)
            if r[1].startswith("**all**")] == [64, 64]  # 32 clients x 2 requests, per loader


def test_frontend_bench(outputs) -> None:
    (table,) = tables(run(outputs, "frontend_bench"))
    assert labels(table) == [
        "overview, all charts drawn",
        "layers grid, first screen drawn (its panels' data read first)", "renderer CPU for it",
        "layers grid, all 2 panels drawn", "renderer CPU for it"]
    assert min(column(table, "first") + column(table, "warm")) > 0


def test_demo_robustness(monkeypatch, capsys) -> None:
    """Its cells made up (a story told, one missed, a demo that failed): the table counts
    them per framework, scenario and kernel path, every failure is listed, and it exits 1."""
    import importlib.util

    from tb_introspect.demo.robustness import Cell, Outcome

    spec = importlib.util.spec_from_file_location("demo_robustness",
                                                  BENCHMARKS / "demo_robustness.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    asked = []

    def run_cell(cell: Cell, scenarios=()) -> Outcome:
        asked.append((cell.label, tuple(scenarios)))
        out = Outcome(cell, seconds=1.0)
        if cell.seed == 3:
            out.error = "Traceback: the demo failed"
        else:
            out.problems = {"vanishing_sigmoid_mlp": [] if cell.seed == 1 else ["too early"]}
        return out

    monkeypatch.setattr(bench, "run_cell", run_cell)
    cells = ["torch/aten-default/seed1/1t", "torch/aten-default/seed2/1t",
             "keras/onednn-off/seed3/2t"]
    assert bench.main(["--jobs", "1", "--scenarios", "vanishing_sigmoid_mlp",
                       "--cells", *cells]) == 1
    out = capsys.readouterr().out
    assert sorted(asked) == sorted((c, ("vanishing_sigmoid_mlp",)) for c in cells)
    (table,) = tables(out)
    assert table[0] == ["framework", "scenario", "aten-default", "aten-avx2", "onednn-off",
                        "onednn-on", "onednn-avx2"]
    assert table[1:] == [["torch", "vanishing_sigmoid_mlp", "1/2 ✗", "", "", "", ""],
                         ["keras", "vanishing_sigmoid_mlp", "", "", "0/1 ✗", "", ""]]
    assert "vanishing_sigmoid_mlp: too early" in out and "the demo failed" in out
