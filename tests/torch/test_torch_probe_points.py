"""Probe points: a paced run (the trainers' ``every="auto"``) whose window grew still has its
attention and head probes at the planned cadence, written as probes-only points
(docs/options.md, "Probe points"), and its views' series are those of the same run
without them."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from tb_introspect import slots
from tb_introspect.demo import gpt
from tb_introspect.read.series import probes_of
from tb_introspect.torch.introspector import IntrospectorArgs
from tests.torch import torch_support as ts

STEPS = 120
PLANNED = 6  # auto_window: 120 planned steps / 20
ATTENTION = ["blocks.0.attn", "blocks.1.attn"]


def _train(log_dir, *, probe_points: bool = True):
    """The tiny GPT for ``STEPS`` steps, one epoch, at ``every="auto"``: each logged point
    looks 5 s long to the governor (its clock jumps inside it), so once two were timed the
    paced window grows past the run."""
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(width=32, heads=2, layers=2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    intro = IntrospectorArgs(None, "auto", slots.VIEWS, {"on_finding": lambda f: None}).make(
        str(log_dir), model, opt, planned=(1, STEPS, None), criterion=nn.CrossEntropyLoss())
    judged = []  # the steps at which the live judge was asked (on the training thread:
    # the worker may judge later, when training has gone on)
    pipeline = intro.pipeline
    judge = pipeline._judge
    pipeline._judge = lambda: (judged.append(intro.step_count), judge())[1]
    late = [0.0]
    intro.governor.clock = lambda: time.perf_counter() + late[0]
    point = intro.point

    def costly(step):
        late[0] += 5.0
        return point(step)

    intro.point = costly
    if not probe_points:
        intro.probe_points.every = lambda: None
    data = gpt.batches(0, batch=4)
    for _ in range(STEPS):
        ids = next(data)
        loss = gpt.lm_loss(model(ids[:, :-1]), ids[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        intro.step(loss=loss)
    intro.end_epoch()
    paced = intro.pipeline.window()
    intro.close()
    return ts.read_run(str(log_dir)), paced, judged


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with_points = _train(tmp_path_factory.mktemp("probe_points"))
    without = _train(tmp_path_factory.mktemp("no_probe_points"), probe_points=False)
    return with_points, without


def _view_steps(run) -> dict[str, list[int]]:
    """Each view's tensors' steps (the metrics are per step)."""
    return {s.info.tag: [int(x) for x in s.steps] for ts_ in run.tensors.values() for s in ts_}


def test_probe_points_keep_the_planned_cadence(runs):
    (run, paced, judged), _ = runs
    assert paced is None or paced > 2 * PLANNED, paced  # the window grew
    views = sorted({s for steps in _view_steps(run).values() for s in steps})
    assert len(views) <= 5 and views[-1] == STEPS, views  # few points
    p = probes_of(run)
    # a probe point at every planned window's end, the points' steps among them
    assert list(p.steps) == list(range(PLANNED, STEPS + 1, PLANNED))
    only = [j for j, s in enumerate(p.steps) if s not in views]
    assert len(only) >= 12
    rows = {r: i for i, r in enumerate(p.rows)}
    attn, head = p.field("attn_logit_max"), p.field("logit_max")
    for name in ATTENTION:
        assert np.isfinite(attn[rows[name], only]).all(), (name, attn[rows[name]])
    assert np.isfinite(head[rows["head"], only]).all()
    assert np.isfinite(p.field("logit_lse")[rows["head"], only]).all()
    # the layer outputs' probes need a statistics step's output hooks: at points only
    assert np.isnan(p.field("abs_median")[:, only]).all()
    assert np.isnan(p.field("kurtosis")[:, only]).all()
    # on_finding: the live judge runs after each probe point (written as the next step is
    # told) as after each point
    assert {p.steps[j] + 1 for j in only} <= set(judged), judged
    last = list(p.steps).index(STEPS)  # the epoch's point: a probe point held there joins it
    assert np.isfinite(p.field("abs_median")[:, last]).any()
    assert np.isfinite(attn[rows[ATTENTION[0]], last])


def test_probe_points_leave_the_views_series_alone(runs):
    (run, _, _), (plain, paced, _) = runs
    assert paced is None or paced > 2 * PLANNED
    views = sorted({s for steps in _view_steps(plain).values() for s in steps})
    assert probes_of(plain).steps.tolist() == views  # without them: the points' probes only
    steps = _view_steps(run)
    assert steps == _view_steps(plain)  # no view has a point at a probe point's step
    for view in ("gradient", "variable"):  # summed over the same windows, read at the same steps
        for name, s in ts.by_name(run, view).items():
            other = ts.by_name(plain, view)[name]
            np.testing.assert_allclose(s.values, other.values, rtol=1e-6, err_msg=name)
    out, other = ts.by_name(run, "output")["head"], ts.by_name(plain, "output")["head"]
    np.testing.assert_array_equal(out.field("steps"), other.field("steps"))
