"""The findings on trainings of other architectures, read while they train.

Every scenario of ``findings_archs.SCENARIOS`` is trained once per session (GRU, LSTM,
self-attention with LayerNorm, residual CNN with BatchNorm at momentum 0.9, embedding, MSE
autoencoder, and the pathologies: memorisation of shuffled labels, overfitting on few noisy
samples, an L2 penalty that collapses the weights to chance, a ReLU on the logits, an
attention block at a too-high rate, a tiny initialisation, the residual BatchNorm CNN at
Keras's default momentum 0.99, whose moving statistics lag a short run). After every
epoch the logdir is read back with the plugin's reader and the findings are computed on
the points so far, as a live TensorBoard tab would show them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.diagnose.findings_archs import SCENARIOS, train_scenario

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PATHOLOGIES = [n for n, s in SCENARIOS.items() if s.in_tests and not s.healthy]
HEALTHY = [n for n, s in SCENARIOS.items() if s.in_tests and s.healthy]


@pytest.fixture(scope="session")
def live(tmp_path_factory):
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = train_scenario(name, str(tmp_path_factory.mktemp(name)))
        return cache[name]

    return get


def titles(findings):
    return [f"{f.severity} {f.kind}: {f.title}" for f in findings]


@pytest.mark.parametrize("name", PATHOLOGIES)
def test_pathology_is_caught_within_two_epochs_of_its_onset(live, name) -> None:
    r = live(name)
    sc = SCENARIOS[name]
    assert len(r.live) == sc.epochs
    for kind, (severity, _) in sc.expect.items():
        onset = sc.onset(kind, r.run)
        first = r.first_epoch_with(kind, severity)
        assert first is not None and first <= onset + 2, (kind, first, titles(r.findings))
        # ...and the finding of the whole run says so too.
        assert any(f.kind == kind and f.severity in ("critical", severity)
                   for f in r.findings), titles(r.findings)


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_architectures_raise_no_warning_at_any_epoch(live, name) -> None:
    r = live(name)
    assert r.serious_live() == [], r.serious_live()


def test_memorisation_evidence_matches_the_logged_curves(live) -> None:
    r = live("memorising_mlp")
    f = next(f for f in r.findings if f.kind == "overfitting")
    assert f.evidence["pattern"] == "memorising" and f.first_epoch == 0
    val = r.run.metrics["val_loss"].field("value")
    assert np.all(val[1:] >= val[0])  # never better than after the first epoch
    vacc = r.run.metrics["val_accuracy"].field("value")
    assert f.evidence["val_accuracy_max"] == pytest.approx(float(vacc.max()), abs=1e-3)
    assert f.evidence["val_accuracy_max"] <= 1.5 / 10


def test_chance_level_from_the_output_width(live) -> None:
    r = live("l2_collapse")
    f = next(f for f in r.findings if f.kind == "loss_at_chance")
    assert f.evidence["classes"] == 10 and f.evidence["chance_loss"] == pytest.approx(math.log(10))
    band = r.run.metric_epochs["loss"]
    assert band.field("p50")[0] > 10 * math.log(10)  # it fell there from far above
    assert abs(band.field("p50")[-1] - math.log(10)) < 0.02 * math.log(10)
    # The weights went to zero: the collapse names most kernels.
    w = next(f for f in r.findings if f.kind == "weight_collapse")
    assert w.evidence["share_collapsed"] >= 0.5 and w.evidence["median_orders_below_start"] >= 1


def test_regression_is_never_judged_against_a_chance_level(live) -> None:
    r = live("autoencoder_mse")
    kinds = {f.kind for found in r.live for f in found}
    assert not kinds & {"loss_at_chance", "early_instability", "rectified_output"}


def test_rectified_output_reports_the_logged_zero_share(live) -> None:
    r = live("relu_output")
    f = next(f for f in r.findings if f.kind == "rectified_output")
    out = next(s for s in r.run.tensors["output"] if s.info.layer == "classifier")
    zero = float(out.field("zero_fraction")[-1])
    assert f.evidence["zero_fraction_at_end"] == pytest.approx(zero)
    assert f.evidence["min_value"] >= 0
    # The linear twin under the same loss has negative logits and no such finding.
    twin = live("logits_output")
    assert "rectified_output" not in {f.kind for f in twin.findings}


def test_early_instability_names_the_jump_in_the_first_epoch(live) -> None:
    r = live("attention_lr_too_high")
    f = next(f for f in r.live[0] if f.kind == "early_instability")  # after epoch 0 already
    loss = r.run.metrics["loss"]
    v0 = loss.field("value")[loss.epochs == 0]
    assert f.evidence["peak_loss"] == pytest.approx(float(v0.max()))
    assert f.evidence["first_epoch_mean_loss"] > math.log(10)
    healthy = live("attention")
    assert "early_instability" not in {f.kind for f in healthy.findings}
