"""``tb-introspect demo --framework torch`` and ``--framework jax``: the four demo scenarios
trained with PyTorch and with JAX and Flax (Linen, and NNX: ``jax-nnx``; and the Keras demo
itself on Keras's PyTorch and JAX backends, ``keras-torch`` and ``keras-jax``), read back
like the Keras demo's runs: the same stories in the findings (``Scenario.story``) and in the
numbers (``evidence.margin_problems``), ``tb-introspect diagnose`` and every view of the tab
in headless Chromium. Other seeds, threads and kernel paths: ``benchmarks/demo_robustness.py``
(a slice of it in ``tests/test_benchmarks.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tb_introspect import slots
from tb_introspect.demo.evidence import (
    collect,
    margin_problems,
    scenario_of,
    serious_kinds,
    story_problems,
)
from tb_introspect.demo.models import SERIOUS
from tb_introspect.read import read_logdir
from tests.browser.browser_session import DEMO_RUNS, Probe

CLI = str(Path(sys.executable).with_name("tb-introspect"))


@pytest.fixture(scope="module", params=["torch", "jax", "jax-nnx", "keras-torch", "keras-jax"])
def framework_demo(request, tmp_path_factory) -> Path:
    """The quick demo of one framework, trained once through the real command line."""
    framework, _, variant = request.param.partition("-")
    logdir = tmp_path_factory.mktemp(f"{request.param}_demo") / "logs"
    env, args = dict(os.environ), []
    if framework == "keras" and variant:
        env["KERAS_BACKEND"] = variant
    elif variant:
        args = ["--flax", variant]
    r = subprocess.run([CLI, "demo", "--framework", framework, *args, "--quick",
                        "--no-progress", "--logdir", str(logdir)], capture_output=True,
                       text=True, timeout=1200, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Trained 4 runs" in r.stdout
    return logdir


@pytest.mark.slow
def test_every_run_has_the_four_views_and_tells_its_story(framework_demo):
    runs = read_logdir(str(framework_demo))
    assert sorted(runs) == list(DEMO_RUNS)
    problems = {}
    for name, run in runs.items():
        assert set(run.tensors) == set(slots.VIEWS), name
        assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(run.metrics), name
        assert run.activity, name
        kinds = serious_kinds(run)
        why = story_problems(name, kinds) + margin_problems(scenario_of(name), collect(run))
        if why:
            problems[name] = (why, kinds)
    assert not problems, problems


@pytest.mark.slow
def test_diagnose_reads_the_runs(framework_demo):
    r = subprocess.run([CLI, "diagnose", str(framework_demo), "--json"], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert r.returncode in (0, 1), r.stderr[-2000:]
    kinds = {run["run"]: {f["kind"] for f in run["findings"] if f["severity"] in SERIOUS}
             for run in json.loads(r.stdout)["runs"]}
    assert sorted(kinds) == list(DEMO_RUNS)
    problems = {name: story_problems(name, k) for name, k in kinds.items()
                if story_problems(name, k)}
    assert not problems, (problems, kinds)


@pytest.fixture(scope="module")
def framework_tb(framework_demo):
    from tests.browser.browser_support import tensorboard

    with tensorboard(framework_demo, wait_runs=len(DEMO_RUNS), reload=False) as server:
        yield server



@pytest.mark.browser
@pytest.mark.parametrize("run", DEMO_RUNS)
def test_every_view_of_a_run(browser, framework_tb, run):
    listed = {r["run"]: r for r in framework_tb.get_json("runs")["runs"]}[run]
    views = tuple(v for v in slots.VIEWS if listed["views"].get(v))
    assert views == slots.VIEWS, listed
    p = Probe(browser, framework_tb, embedded=False)
    try:
        p.open(f"p.introspect.run={run}")
        p.check("overview", run)
        p.sweep_layers(run, views)
        p.sweep_tabs(run)
    finally:
        p.close()
