"""The demo: real training on the digits, read back from the event files it wrote.

The slow part runs ``tb-introspect demo --quick`` once (four real models, the real
``Introspect`` callback, real event files) and checks that every run tells its story in the
findings (``Scenario.story``) and shows its situation in the logged statistics with a margin
(``evidence.margin_problems``); ``benchmarks/demo_robustness.py`` does the same on other
seeds, thread counts and kernel paths.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tb_introspect.demo import models
from tb_introspect.demo.data import load_digits
from tb_introspect.demo.evidence import (
    Evidence,
    collect,
    margin_problems,
    scenario_of,
    serious_kinds,
    story_problems,
)
from tb_introspect.demo.run import prepare_logdir, run_names

REPO = Path(__file__).resolve().parents[1]
CLI = shutil.which("tb-introspect", path=os.path.dirname(sys.executable)) or shutil.which(
    "tb-introspect"
)
RUNS = ("1_healthy_cnn", "2_lr_too_high_cnn", "3_dying_relu_mlp", "4_vanishing_sigmoid_mlp")


# --------------------------------------------------------------------------- fast


def test_digits_split_is_stratified_scaled_and_repeatable() -> None:
    d = load_digits()
    assert d.x_train.shape == (1437, 8, 8, 1) and d.x_val.shape == (360, 8, 8, 1)
    assert d.x_train.dtype == np.float32 and 0.0 == d.x_train.min() and d.x_train.max() == 1.0
    assert sorted(np.unique(d.y_train)) == list(range(10))
    # Stratified: every class has ~20% of its samples in validation.
    counts = np.bincount(d.y_val, minlength=10) / (
        np.bincount(d.y_val, minlength=10) + np.bincount(d.y_train, minlength=10)
    )
    assert np.all(np.abs(counts - 0.2) < 0.02)
    again = load_digits()
    assert np.array_equal(d.x_train, again.x_train) and np.array_equal(d.y_val, again.y_val)


def test_run_names_fresh_logdir(tmp_path: Path) -> None:
    assert run_names(str(tmp_path / "new"), models.SCENARIOS) == list(RUNS)
    # A subset keeps each scenario's number from the full demo.
    only = [models.get_scenario("vanishing_sigmoid_mlp")]
    assert run_names(str(tmp_path), only) == ["4_vanishing_sigmoid_mlp"]


def test_run_names_never_reuse_an_existing_name(tmp_path: Path) -> None:
    (tmp_path / "2_lr_too_high_cnn").mkdir()  # one name of the demo taken...
    (tmp_path / "my_own_run").mkdir()  # ...and an unrelated run
    names = run_names(str(tmp_path), models.SCENARIOS)
    # All runs of this demo get the same suffix, so they stay recognisable as one demo.
    assert names == [f"{r}_2" for r in RUNS]
    (tmp_path / "1_healthy_cnn_2").write_text("a file takes the name too")
    assert run_names(str(tmp_path), models.SCENARIOS) == [f"{r}_3" for r in RUNS]


def test_prepare_logdir_creates_new_empty_runs(tmp_path: Path) -> None:
    first = prepare_logdir(str(tmp_path / "logs"), models.SCENARIOS)
    (Path(first[0]) / "events.out.tfevents.x").write_text("old")
    second = prepare_logdir(str(tmp_path / "logs"), models.SCENARIOS)
    assert [os.path.basename(p) for p in second] == [f"{r}_2" for r in RUNS]
    assert all(os.listdir(p) == [] for p in second)
    assert (Path(first[0]) / "events.out.tfevents.x").read_text() == "old"


def test_prepare_logdir_rejects_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError):
        prepare_logdir(str(f), models.SCENARIOS)


def test_scenarios_are_listed_without_keras() -> None:
    code = (
        "import sys\n"
        "from tb_introspect.demo import models, run\n"
        "assert len(models.SCENARIOS) == 4\n"
        "print([m for m in ('keras', 'tensorflow') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- slow


@pytest.fixture(scope="module")
def quick_demo(trained) -> tuple[Path, str, dict[str, Evidence], dict[str, set[str]]]:
    """The session's ``tb-introspect demo --quick`` (conftest.py); each run's evidence and
    the kinds of its serious findings, read back from disk."""
    from tb_introspect.read import read_logdir

    runs = read_logdir(str(trained.demo))
    assert sorted(runs) == list(RUNS)
    return (trained.demo, trained.demo_stderr,
            {name: collect(run) for name, run in runs.items()},
            {name: serious_kinds(run) for name, run in runs.items()})


@pytest.mark.slow
def test_demo_draws_progress_bars_and_writes_all_views(quick_demo) -> None:
    logdir, stderr, evidence, _ = quick_demo
    for i, name in enumerate(RUNS, start=1):
        assert f"[{i}/4] {name}" in stderr  # one tqdm bar per run...
        assert "100%" in stderr  # ...that finishes
    from tb_introspect.read import read_logdir

    for name, run in read_logdir(str(logdir)).items():
        assert set(run.tensors) == {"variable", "gradient", "output", "output_gradient"}, name
        assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(run.metrics), name
    quick = {f"{i}_{s.name}": s.quick_epochs for i, s in enumerate(models.SCENARIOS, start=1)}
    assert {name: e.epochs for name, e in evidence.items()} == quick


@pytest.mark.slow
def test_every_run_tells_its_story_with_margin(quick_demo) -> None:
    evidence, kinds = quick_demo[2], quick_demo[3]
    problems = {name: story_problems(name, kinds[name])
                + margin_problems(scenario_of(name), evidence[name]) for name in RUNS}
    assert not any(problems.values()), (problems, kinds,
                                        {n: e.summary() for n, e in evidence.items()})


@pytest.mark.slow
def test_healthy_cnn_gets_better_every_epoch(quick_demo) -> None:
    e = quick_demo[2]["1_healthy_cnn"]
    assert np.all(np.diff(e.loss_median) < 0), e.loss_median


@pytest.mark.slow
def test_lr_too_high_cnn_loses_what_it_learned_at_the_jump(quick_demo) -> None:
    e = quick_demo[2]["2_lr_too_high_cnn"]
    epochs_before = models.JUMP_STEP // 45
    # Better every epoch at the healthy rate; after the jump never near that again.
    before = e.loss_median[:epochs_before]
    assert np.all(np.diff(before) < 0), e.loss_median
    assert np.all(e.loss_median[epochs_before + 1:] > 2 * before[-1]), e.loss_median


@pytest.mark.slow
def test_dying_relu_mlp_is_dead_from_the_first_epoch(quick_demo) -> None:
    e = quick_demo[2]["3_dying_relu_mlp"]
    # The first layer: at least half of its units dead for every sample, never fewer.
    first = e.dead_rate["dense1"]
    assert np.all(first >= 0.5) and np.all(np.diff(first) >= 0), first
    med = e.loss_median
    assert np.all(med > 0.9 * np.log(10)), med  # nothing learns through dead units
