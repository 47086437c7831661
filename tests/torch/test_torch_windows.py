"""``window=N`` in a PyTorch loop: a point per window of N steps, aggregated as an epoch is
(gradients summed over the window, rectifiers' activity counted on every step of it, the
window's first step a statistics step), windows closed at epoch ends too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tb_introspect import metadata
from tb_introspect.plugin import overview
from tb_introspect.torch import Introspector
from tests.torch import torch_support as ts

STEPS, WINDOW = 10, 4  # windows end at steps 4, 8, then the epoch's end at 10


@pytest.fixture(scope="module")
def window_run(tmp_path_factory):
    torch.manual_seed(0)
    log_dir = tmp_path_factory.mktemp("windows")
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = ts.Recorder(model)
    with Introspector(log_dir, model, opt, window=WINDOW, overhead=None) as intro:
        ts.train(model, opt, ts.batches(STEPS), intro, rec, epochs=2)
    rec.close()
    return ts.read_run(str(log_dir)), rec


def test_points_at_the_window_ends_and_the_epoch_ends(window_run):
    run, _ = window_run
    series = ts.by_name(run, "gradient")["0/weight"]
    # 1-based steps 4, 8 (windows), 10 (epoch end), 12, 16, 20 (windows; 20 the epoch end)
    assert list(series.steps) == [4, 8, 10, 12, 16, 20]
    assert series.info.cadence == "window"
    assert list(series.field("epoch")) == [0, 0, 0, 1, 1, 1]
    out = ts.by_name(run, "output")["2"]  # the first ReLU
    assert list(out.field("steps")) == [4, 4, 2, 2, 4, 4]
    # The governor's first step of each window is a statistics step; stats_every=8 allows
    # no other in a window this short.
    assert list(out.field("stats_steps")) == [1, 1, 1, 1, 1, 1]
    # A rectifier's activity counts every step of the window (exact).
    assert list(out.field("activity_steps")) == list(out.field("steps"))


def test_window_gradients_are_the_sum_of_its_steps(window_run):
    run, rec = window_run
    g = ts.by_name(run, "gradient")["7/weight"]
    bounds = [0, 4, 8, 10, 12, 16, 20]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        total = sum(rec.grads[s]["7.weight"] for s in range(lo, hi))
        got = ts.point(g, hi)
        np.testing.assert_allclose(got["l2"], np.sqrt((total.astype(np.float64) ** 2).sum()),
                                   rtol=1e-5)
        np.testing.assert_allclose(got["max"], total.max(), rtol=1e-5)


def test_activity_is_counted_over_the_window(window_run):
    run, rec = window_run
    out = ts.by_name(run, "output")["8"]  # dense ReLU, [batch, 16]
    for lo, hi in ((4, 8), (10, 12)):
        acts = np.concatenate([a for s in range(lo + 1, hi + 1)
                               for a in rec.outputs[s - 1].get("8", [])])
        got = ts.point(out, hi)
        np.testing.assert_allclose(got["activation_rate"], np.mean(acts != 0), rtol=1e-9)
        dead = np.mean(~(acts != 0).any(axis=0))
        np.testing.assert_allclose(got["dead_rate"], dead, atol=1e-12)
    # one activity map per window, at its end
    assert list(run.activity["8"].steps) == [4, 8, 10, 12, 16, 20]


def test_metric_bands_per_window(window_run):
    run, _ = window_run
    band = run.metric_epochs["loss"]
    assert list(band.steps) == [4, 8, 10, 12, 16, 20]
    assert list(band.field("count")) == [4, 4, 2, 2, 4, 4]
    # The tab labels them as windows, an epoch run's bands as epochs.
    assert overview.metric_overview(run.metrics["loss"], band)["epoch_band"]["per"] == "window"
    ends = np.isin(band.steps, [10, 20])
    one_per_epoch = dataclasses.replace(band, steps=band.steps[ends],
                                        wall_times=band.wall_times[ends], values=band.values[ends])
    assert overview.metric_overview(None, one_per_epoch)["epoch_band"]["per"] == "epoch"


def test_window_is_checked():
    model = ts.small_cnn()
    with pytest.raises(ValueError, match="window"):
        Introspector("/tmp", model, every=4, window=8)
    with pytest.raises(ValueError, match="window"):
        Introspector("/tmp", model, window=0)
    assert "window" in metadata.CADENCES
