"""``params.py``: the variable and gradient blocks of each point, with the slots computed from
two points (``update_ratio``, ``ilr_q<p>``, ``cos_prev``), checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from tb_introspect import slots
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.options import Options
from tb_introspect.pipeline.params import Params
from tb_introspect.pipeline.plan import Monitored, Plan
from tb_introspect.pipeline.point import Point

SHAPES = {"dense/kernel": (4, 3), "dense/bias": (3,), "out/kernel": (3, 2)}


def plan(every: str | int = "epoch") -> Plan:
    return Plan(Options.make(every=every, flush_secs=1),
                variables=[Monitored("variable", n, n.split("/")[0], 0, s)
                           for n, s in SHAPES.items()])


def slot(block, view, name):
    return block.vectors[:, slots.tensor_stats_fields(view).index(name)]


def blocks(params, weights, gsums, seed=0):
    out = Point()
    params.add_blocks(out, weights, gsums, seed)
    return {b.view: b for b in out.blocks}


@pytest.mark.parametrize("every", ["epoch", 3])
def test_the_slots_from_two_points(every):
    rng = np.random.default_rng(1)
    p = plan(every)
    w0 = [rng.normal(size=s) for s in SHAPES.values()]
    params = Params(p, w0, channels_first=False)
    prev_w, prev_g = w0, None
    for k in range(3):
        w = [x + rng.normal(scale=0.1, size=x.shape) for x in prev_w]
        g = [rng.normal(size=x.shape) for x in prev_w]
        b = blocks(params, w, g, seed=k)
        assert [s.name for s in b["variable"].specs] == list(SHAPES)
        ratio = [np.linalg.norm(a - c) / np.linalg.norm(a) for a, c in zip(w, prev_w,
                                                                              strict=True)]
        np.testing.assert_allclose(slot(b["variable"], "variable", "update_ratio"), ratio,
                                   rtol=1e-12)
        cos = slot(b["gradient"], "gradient", "cos_prev")
        if prev_g is None:
            assert np.isnan(cos).all()  # no previous point
        else:
            want = [np.dot(a.ravel(), c.ravel()) / np.linalg.norm(a) / np.linalg.norm(c)
                    for a, c in zip(g, prev_g, strict=True)]
            np.testing.assert_allclose(cos, want, rtol=1e-12)
        # The implicit learning rate: |dw| / |G|, G the window's gradient sum (with every=N
        # the sampled step's, counted N times).
        steps = every if isinstance(every, int) else 1
        for i, (a, c, gi) in enumerate(zip(w, prev_w, g, strict=True)):
            rate = np.abs(a - c).ravel() / (np.abs(gi).ravel() * steps)
            for q in (0.0, 25.0, 50.0, 100.0):
                f = slots.ILR_PREFIX + slots.quantile_field(q)
                assert slot(b["variable"], "variable", f)[i] == pytest.approx(
                    np.percentile(rate, q), rel=1e-12)
        for i, gi in enumerate(g):
            assert slot(b["gradient"], "gradient", "rms")[i] == pytest.approx(
                np.sqrt(np.mean(gi**2)), rel=1e-12)
            assert np.isnan(slot(b["gradient"], "gradient", "epoch")[i])  # point.fill sets it
        prev_w, prev_g = w, g


def test_float32_weights_change_exactly_and_are_copied():
    """The previous point's float32 weights are kept as float32: their change is still the
    exact float64 difference, and the caller's arrays may change after the point."""
    rng = np.random.default_rng(3)
    p = plan()
    w0 = [rng.normal(size=s).astype(np.float32) for s in SHAPES.values()]
    params = Params(p, w0, channels_first=False)
    w1 = [x + rng.normal(size=x.shape).astype(np.float32) for x in w0]  # not all exact in f32
    want = [np.linalg.norm(a.astype(np.float64) - c.astype(np.float64))
            / np.linalg.norm(a.astype(np.float64)) for a, c in zip(w1, w0, strict=True)]
    ratio = slot(blocks(params, w1, None)["variable"], "variable", "update_ratio")
    np.testing.assert_allclose(ratio, want, rtol=1e-12)
    w2 = [x.copy() for x in w1]
    for x in w1:
        x += 1  # the caller reuses its buffers: the copy kept is unchanged
    ratio = slot(blocks(params, w2, None)["variable"], "variable", "update_ratio")
    assert ratio.tolist() == [0, 0, 0]


def test_a_view_not_asked_for_and_a_tensor_switched_off():
    rng = np.random.default_rng(2)
    p = plan()
    w = [rng.normal(size=s) for s in SHAPES.values()]
    params = Params(p, w, channels_first=False)
    g1 = [rng.normal(size=s) for s in SHAPES.values()]
    assert list(blocks(params, None, g1)) == ["gradient"]
    p.failures.switch_off(Part("gradient", "dense/bias"))
    g2 = [rng.normal(size=s) for s in SHAPES.values()]
    b = blocks(params, w, g2)
    assert [s.name for s in b["gradient"].specs] == ["dense/kernel", "out/kernel"]
    # The others' cos_prev is still against their own previous sums.
    want = [np.dot(g2[i].ravel(), g1[i].ravel()) / np.linalg.norm(g2[i]) / np.linalg.norm(g1[i])
            for i in (0, 2)]
    np.testing.assert_allclose(slot(b["gradient"], "gradient", "cos_prev"), want, rtol=1e-12)
    # Without gradient sums there is no implicit learning rate.
    b = blocks(params, w, None)
    assert np.isnan(slot(b["variable"], "variable", "ilr_q50")).all()
    assert slot(b["variable"], "variable", "update_ratio").tolist() == [0, 0, 0]


def test_a_pytorch_weights_output_channels_are_on_axis_0():
    w = np.ones((3, 4))  # (out, in), as a torch Linear's weight
    w[1] = 0  # output unit 1 never fires
    p = Plan(Options.make(flush_secs=1),
             variables=[Monitored("variable", "fc/weight", "fc", 0, (3, 4))])
    first = blocks(Params(p, [w], channels_first=True), [w], None)["variable"]
    keras = blocks(Params(p, [w], channels_first=False), [w], None)["variable"]
    assert slot(first, "variable", "dead_rate")[0] == pytest.approx(1 / 3)
    assert slot(keras, "variable", "dead_rate")[0] == 0  # read as 4 channels, none all zero
