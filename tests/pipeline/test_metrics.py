"""``metrics.py``: a front-end's metric ring read on the host as per-step values (total over
count, at their steps, the wrapped-over rows left out) and per-epoch bands."""

from __future__ import annotations

import numpy as np
import pytest

from tb_introspect import loss_field, metadata
from tb_introspect.pipeline.metrics import Ring, as_float

NAMES = ["loss", "acc"]


class DeviceRing:
    """The device side: row ``(step - 1) % rows`` of per-metric totals and counts."""

    def __init__(self, rows: int, seed: int = 0):
        self.rows = rows
        self.total = np.zeros((rows, len(NAMES)))
        self.count = np.zeros((rows, len(NAMES)))
        self.rng = np.random.default_rng(seed)
        self.values: dict[str, dict[int, float]] = {n: {} for n in NAMES}

    def step(self, s: int, replicas: int = 3) -> None:
        row = (s - 1) % self.rows
        self.total[row] = self.count[row] = 0
        for m, name in enumerate(NAMES):
            if name == "acc" and s % 3:
                continue  # acc on every third step only
            v = self.rng.uniform(size=replicas)
            self.total[row, m], self.count[row, m] = v.sum(), replicas
            self.values[name][s] = float(v.mean())


def read(batches) -> dict[str, dict[int, tuple[float, float]]]:
    """name -> step -> (epoch, value) of ``Ring.steps``' values."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for step, values in batches:
        for s in values:
            name = s.tag.removeprefix("introspect/metric/")
            epoch, value = s.array
            out.setdefault(name, {})[step] = (epoch, value)
    return out


def test_each_steps_value_is_its_total_over_its_count_once():
    dev, ring = DeviceRing(rows=5), Ring()
    ring.start(0)
    got: dict[str, dict] = {}
    for s in range(1, 24):
        dev.step(s)
        if s % 4 == 0 or s == 23:  # read before the ring wraps
            for name, v in read(ring.steps(NAMES, s, dev.total, dev.count, epoch=2)).items():
                assert not set(v) & set(got.get(name, {}))  # each step once
                got.setdefault(name, {}).update(v)
    for name in NAMES:
        assert {s: v for s, (_, v) in got[name].items()} == pytest.approx(dev.values[name])
        assert {e for e, _ in got[name].values()} == {2}
    assert sorted(got["acc"]) == list(range(3, 24, 3))


def test_rows_the_ring_wrapped_over_are_left_out_not_misread():
    dev, ring = DeviceRing(rows=4), Ring()
    ring.start(0)
    for s in range(1, 11):
        dev.step(s)
    batches = ring.steps(NAMES, 10, dev.total, dev.count, epoch=0)
    # Steps 1-6 were overwritten: only the four the ring holds, each from its own row.
    assert [step for step, _ in batches] == [7, 8, 9, 10]
    values = {s: v for s, (_, v) in read(batches)["loss"].items()}
    assert values == pytest.approx({s: dev.values["loss"][s] for s in (7, 8, 9, 10)})
    assert ring.last_step == 10
    assert ring.steps(NAMES, 10, dev.total, dev.count, epoch=0) == []  # nothing new


def test_training_restarting_after_a_step_reads_from_there():
    dev, ring = DeviceRing(rows=8), Ring()
    for s in range(1, 8):
        dev.step(s)
    ring.start(5)  # resumed after step 5
    assert [step for step, _ in ring.steps(NAMES, 7, dev.total, dev.count, 0)] == [6, 7]


def test_running_values_are_written_at_the_step_read():
    dev, ring = DeviceRing(rows=4), Ring()
    dev.step(1)
    dev.step(2)
    batches = ring.steps(NAMES, 2, dev.total, dev.count, 1,
                         running={"auc": np.float32(0.5), "bad": object(), "nan": float("nan")})
    got = read(batches)
    assert got["auc"] == {2: (1.0, 0.5)} and "bad" not in got
    assert np.isnan(got["nan"][2][1])
    # Nothing new since: a running value is not written again at an old step.
    assert ring.steps(NAMES, 2, dev.total, dev.count, 1, running={"auc": 0.7}) == []


def test_epoch_bands_are_the_epochs_values_per_metric():
    dev, ring = DeviceRing(rows=16), Ring()
    ring.loss_info = loss_field.loss_json("classification", from_logits=True)
    for epoch, (first, last) in enumerate([(1, 9), (10, 21)]):
        ring.begin_epoch()
        for s in range(first, last + 1):
            dev.step(s)
        ring.steps(NAMES, last, dev.total, dev.count, epoch)
        bands = ring.epoch_bands(epoch, {"val_loss": np.float64(0.125), "skip": "x"})
        tags = [b.tag for b in bands]
        assert tags == ["introspect/metric_epoch/loss", "introspect/metric_epoch/acc",
                        "introspect/metric/val_loss"]
        for name, band in zip(NAMES, bands, strict=False):
            v = [dev.values[name][s] for s in range(first, last + 1) if s in dev.values[name]]
            want = [epoch, *np.percentile(v, [0, 25, 50, 75, 100]), np.mean(v), len(v)]
            np.testing.assert_allclose(band.array, want, rtol=1e-12)
        assert bands[2].array.tolist() == [epoch, 0.125]
        # The training loss's description goes with the loss's metadata only.
        loss, acc = (metadata.parse_plugin_data(b.metadata.plugin_data.content)
                     for b in bands[:2])
        assert loss.loss == ring.loss_info and acc.loss == ""


def test_a_band_is_over_the_finite_values():
    ring = Ring()
    total = np.array([[1.0], [np.nan], [3.0], [np.inf]])
    ring.steps(["loss"], 4, total, np.ones((4, 1)), 0)
    (band,) = ring.epoch_bands(0)
    v = band.array
    assert v[1] == 1.0 and v[5] == 3.0 and v[6] == 2.0 and v[7] == 2  # min, max, mean, count


@pytest.mark.parametrize(("value", "want"), [(2, 2.0), (np.float32(0.5), 0.5),
                                             (np.array(1.5), 1.5), (np.array([4.0]), 4.0),
                                             ("x", None), (None, None), ([1.0, 2.0], None)])
def test_as_float(value, want):
    assert as_float(value) == want


def test_as_float_reads_a_framework_tensors_mean():
    class Tensor:  # what as_float asks of a torch tensor
        def detach(self):
            return self

        def float(self):
            return self

        def mean(self):
            return self

        def item(self):
            return 0.75

    assert as_float(Tensor()) == 0.75
