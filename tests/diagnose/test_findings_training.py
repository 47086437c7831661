"""Findings on real training: fast variants of the demo's scenarios (and three more
pathologies) trained on the digits, logged with the numpy writer, read back from disk.

Each scenario is trained once per module. Expectations are checked against the logged
data itself (the step of the first NaN loss, the onset of the dead rate, the gradient
gap), not against numbers copied from an earlier run.
"""

from __future__ import annotations

import numpy as np
import pytest

from tb_introspect.demo.models import get_scenario
from tb_introspect.diagnose import find_issues
from tb_introspect.read.series import RunSeries
from tests.diagnose.findings_testlib import (
    build_exploding_mlp,
    build_saturated_tanh_mlp,
    dead_onset,
    read_one,
    train_logged,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# The CNNs' output gradients feed no rule; leaving them out halves the logging time.
CNN_VIEWS = ("variable", "gradient", "output")
SCENARIOS = {
    # name: (build, epochs, every, views)
    "healthy_cnn": (get_scenario("healthy_cnn").build, 8, "epoch", CNN_VIEWS),
    "lr_too_high_cnn": (get_scenario("lr_too_high_cnn").build, 8, "epoch", CNN_VIEWS),
    "dying_relu_mlp": (get_scenario("dying_relu_mlp").build, 8, "epoch", None),
    "vanishing_sigmoid_mlp": (get_scenario("vanishing_sigmoid_mlp").build, 4, "epoch", None),
    "saturated_tanh_mlp": (build_saturated_tanh_mlp, 4, "epoch", None),
    # Per-step logging: the run reaches NaN within the first epoch.
    "exploding_mlp": (build_exploding_mlp, 1, 1, None),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            build, epochs, every, views = SCENARIOS[name]
            logdir = str(tmp_path_factory.mktemp(name))
            kw = {"views": views} if views else {}
            result = train_logged(logdir, build, epochs=epochs, every=every, **kw)
            run = read_one(logdir)
            cache[name] = (result, run, find_issues(run))
        return cache[name]

    return get


def by_kind(findings):
    return {f.kind: f for f in findings}


def serious(findings):
    return [f for f in findings if f.severity in ("warning", "critical")]


def test_healthy_cnn_has_no_warning_or_critical(trained) -> None:
    _, _, findings = trained("healthy_cnn")
    assert serious(findings) == [], [f.title for f in serious(findings)]


def test_too_high_learning_rate_tells_its_story(trained) -> None:
    """Which of the story's kinds shows depends on the trajectory (oscillation, or a loss
    climbing back); one of them must, and an oscillation it shows is a real one."""
    _, run, findings = trained("lr_too_high_cnn")
    assert get_scenario("lr_too_high_cnn").story_problems(
        {f.kind for f in serious(findings)}) == []
    f = by_kind(findings).get("gradient_oscillation")
    if f is not None and f.severity == "warning":
        assert f.evidence["loss_stalled"] is True and f.evidence["median_cos_prev"] < 0
    # The healthy twin (same model, 1/3 of the rate) is not flagged as a warning.
    _, _, healthy = trained("healthy_cnn")
    osc = by_kind(healthy).get("gradient_oscillation")
    assert osc is None or osc.severity == "info"


def test_dying_relu_is_flagged_with_its_onset(trained) -> None:
    _, run, findings = trained("dying_relu_mlp")
    found = by_kind(findings)
    f = found["dead_units"]
    assert f.severity in ("warning", "critical") and f.view == "output"
    # The onset is where a flagged layer's logged dead rate first stays above threshold:
    # the first epoch, the biases having started at -1.
    assert f.first_step == dead_onset(run, f) and f.first_epoch == 0
    assert "loss_not_decreasing" in found and "identical_units" not in found
    # The gradient stops at dead units, not at a cut in the graph: the advice says so.
    cut = found["no_gradient"]
    assert cut.evidence["cause"] == "dead units" and "stop_gradient" not in cut.suggestion


def test_too_high_learning_rate_gives_back_what_it_learned(trained) -> None:
    _, run, findings = trained("lr_too_high_cnn")
    rising = by_kind(findings)["loss_rising"]
    assert rising.severity == "warning"
    # Flagged at most two epochs after the jump (epoch 2), not before it.
    assert 2 <= rising.first_epoch <= 4, rising.first_epoch


def test_vanishing_sigmoid_mlp(trained) -> None:
    _, run, findings = trained("vanishing_sigmoid_mlp")
    found = by_kind(findings)
    f = found["vanishing_gradients"]
    assert f.first_epoch == 0 and f.layers[0] == "dense1"
    kernels = [s for s in run.tensors["gradient"] if s.info.name.endswith("kernel")]
    gap = np.log10(kernels[-1].field("rms")[0] / kernels[0].field("rms")[0])
    assert f.evidence["orders_below_last"] == pytest.approx(gap, abs=1e-3)
    assert "loss_not_decreasing" in found
    # Sigmoid units here sit mid-range (derivative <= 0.25 is the cause), not saturated.
    assert "saturated_units" not in found and "dead_units" not in found


def test_saturated_tanh_mlp(trained) -> None:
    _, _, findings = trained("saturated_tanh_mlp")
    f = by_kind(findings)["saturated_units"]
    assert f.severity == "warning" and f.evidence["activation"] == "tanh"
    assert set(f.layers) <= {"tanh1", "tanh2", "tanh3"} and f.first_epoch == 0


def test_exploding_run_is_flagged_before_it_turns_nan(trained) -> None:
    result, run, findings = trained("exploding_mlp")
    found = by_kind(findings)
    nan = found["nonfinite"]
    first_bad = int(np.flatnonzero(~np.isfinite(result.losses))[0]) + 1  # steps are 1-based
    assert nan.severity == "critical" and nan.first_step == first_bad
    assert findings[0].kind == "nonfinite"
    grew = found["exploding_gradients"]
    assert grew.first_step < nan.first_step
    assert found["update_ratio_high"].first_step < nan.first_step


def test_partial_views_use_what_was_logged(trained) -> None:
    _, run, _ = trained("dying_relu_mlp")
    grads_only = RunSeries(run="g", tensors={"gradient": run.tensors["gradient"]})
    f = by_kind(find_issues(grads_only))["dead_units"]
    assert f.view == "gradient" and f.severity in ("warning", "critical")
    loss_only = RunSeries(run="l", metrics=run.metrics, metric_epochs=run.metric_epochs)
    assert {f.kind for f in find_issues(loss_only)} <= {"loss_rising", "loss_spike",
                                                        "loss_not_decreasing",
                                                        "loss_at_chance"}


def test_the_first_two_epochs_are_too_few_to_judge(trained) -> None:
    _, run, _ = trained("dying_relu_mlp")
    cut = RunSeries(run="cut")
    for view, series in run.tensors.items():
        cut.tensors[view] = [_head(s, 2) for s in series]
    cut.metric_epochs = {k: _head(s, 2) for k, s in run.metric_epochs.items()}
    assert {f.kind for f in find_issues(cut)} == {"insufficient_data"}


def _head(s, n):
    from tb_introspect.read.series import Series

    return Series(s.info, s.steps[:n], s.wall_times[:n], s.values[:n])
