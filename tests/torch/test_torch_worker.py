"""The PyTorch front-end's points finished beside training (``pipeline.worker``): what the
worker reads are host copies training never changes, and nothing is lost on an exception."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from tb_introspect.pipeline.sink import EventSink
from tb_introspect.torch import Introspector
from tests.pipeline.pipeline_testlib import read

STEPS, EVERY = 12, 2


class SlowSink(EventSink):
    """A disk that takes its time: the worker lags the training by several steps."""

    def write_steps(self, batches, wall_time=None) -> None:
        time.sleep(0.03)
        super().write_steps(batches, wall_time)


def _train(log_dir, *, threaded: bool, fail_at: int | None = None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    with Introspector(log_dir, model, opt, every=EVERY) as intro:
        intro.pipeline.set_sink(SlowSink(log_dir / "slow"))
        intro.pipeline.worker.threaded = threaded
        for step in range(1, STEPS + 1):
            if step == fail_at:
                raise RuntimeError("the training failed")
            x, y = torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()  # the parameters change in place while the worker reads its copies
            intro.step(loss=loss)


def _values(log_dir) -> dict[str, tuple[list[int], np.ndarray]]:
    run = read(log_dir)
    return {s.info.tag: (s.steps.tolist(), s.values) for view in run.tensors.values()
            for s in view}


def test_points_finished_on_the_worker_equal_those_finished_in_the_step(tmp_path):
    _train(tmp_path / "beside", threaded=True)
    _train(tmp_path / "inline", threaded=False)
    beside, inline = _values(tmp_path / "beside" / "slow"), _values(tmp_path / "inline" / "slow")
    assert set(beside) == set(inline) and len(beside) == 4 * 4 - 2  # no gradient of outputs'
    for tag, (steps, values) in inline.items():
        assert steps == list(range(EVERY, STEPS + 1, EVERY)), tag
        assert beside[tag][0] == steps, tag
        np.testing.assert_array_equal(beside[tag][1], values, err_msg=tag)


def test_an_exception_in_training_keeps_every_point_logged_before(tmp_path):
    with pytest.raises(RuntimeError, match="the training failed"):
        _train(tmp_path, threaded=True, fail_at=10)
    points = _values(tmp_path / "slow")
    assert points and all(steps == [2, 4, 6, 8] for steps, _ in points.values())
