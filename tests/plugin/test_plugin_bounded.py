"""Bounded provider reads: no ``read_tensors`` call grows with the run's length.

Real event files and TensorBoard's real Python data provider; the provider is
wrapped only to record what each call returned. The call budget is made
small, so that a short run needs many calls and every route is exercised
across call boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest

from tb_introspect.plugin import bounded, sampling
from tb_introspect.read import provider
from tb_introspect.read.series import TagInfo
from tests.plugin.plugin_testlib import LAYOUT, App, write_run

STEPS = 300


class Recording:
    """The real provider; remembers the points and bytes each read_tensors call returned."""

    def __init__(self, provider, infos):
        self._provider = provider
        self._bytes = {i.tag: bounded.point_bytes(i) for i in infos}
        self.calls: list[tuple[int, int]] = []  # (points, estimated bytes)

    def read_tensors(self, ctx, **kwargs):
        data = self._provider.read_tensors(ctx, **kwargs)
        points = sum(len(d) for by_tag in data.values() for d in by_tag.values())
        size = sum(len(d) * self._bytes[t] for by_tag in data.values() for t, d in by_tag.items())
        self.calls.append((points, size))
        return data

    def __getattr__(self, name):
        return getattr(self._provider, name)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    write_run(str(root / "long"), range(STEPS))
    return str(root)


@pytest.fixture
def small_calls(monkeypatch):
    """A call budget of about 450 points of the fixture's layouts: many calls per read."""
    monkeypatch.setattr(bounded, "CALL_BYTES", 200_000)


def test_plan_keeps_every_call_under_the_budget(small_calls) -> None:
    infos = [TagInfo(f"t{i}", provider.KIND_TENSOR_STATS, 1, f"t{i}", ("a",) * (i % 50 + 1),
                            view="gradient") for i in range(200)]
    for points in (1, 7, 20):
        groups = bounded.plan(infos, points)
        assert [i for g in groups for i in g] == infos  # every tag, in order, once
        for g in groups:
            assert len(g) == 1 or sum(points * bounded.point_bytes(i) for i in g) \
                <= bounded.CALL_BYTES
    assert bounded.full_points(infos[0]) == bounded.CALL_BYTES // bounded.point_bytes(infos[0])


def test_reads_are_bounded_and_lose_nothing(logdir, small_calls, monkeypatch) -> None:
    dp = provider.local_provider(logdir)
    infos, _ = provider.list_tags(dp, "", runs=["long"])
    infos = list(infos["long"].values())
    whole, _ = provider.read_series(dp, "", "long", infos)  # one unbounded call, for reference
    rec = Recording(dp, infos)

    # Full resolution: one tag per call, every point.
    series, sampled, skipped = bounded.read(rec, "", "long", infos)
    assert skipped == [] and sampled == set() and len(rec.calls) == len(infos)
    for info in infos:
        np.testing.assert_array_equal(series[info.tag].steps, whole[info.tag].steps)
        np.testing.assert_array_equal(series[info.tag].values, whole[info.tag].values)
    # A tag longer than one call may carry: its first full_points points, evenly strided.
    monkeypatch.setattr(bounded, "CALL_BYTES", 100 * bounded.point_bytes(infos[0]))
    series, sampled, _ = bounded.read(rec, "", "long", infos[:1])
    s, w = series[infos[0].tag], whole[infos[0].tag]
    assert sampled == {infos[0].tag} and len(s) == 100 and s.steps[-1] == w.steps[-1]
    monkeypatch.setattr(bounded, "CALL_BYTES", 200_000)
    # A sample of k points per tag: tags grouped, no call over the budget.
    rec.calls.clear()
    series, sampled, _ = bounded.read(rec, "", "long", infos, points=100)
    assert len(rec.calls) > 1
    assert all(size <= bounded.CALL_BYTES for _, size in rec.calls), rec.calls
    assert sampled == {i.tag for i in infos if len(whole[i.tag]) > 100}
    assert len(sampled) > len(infos) / 2
    for info in infos:
        s, w = series[info.tag], whole[info.tag]
        assert len(s) == min(100, len(w)) and s.steps[-1] == w.steps[-1]  # the last is kept
        assert set(s.steps) <= set(w.steps)


def test_routes_answer_from_bounded_reads(logdir, small_calls) -> None:
    app = App(logdir)
    doc = app.get("run?run=long")
    tensors = [t for v in doc["views"].values() for t in v]
    assert len(tensors) == sum(len(v) for v in LAYOUT.values())
    # More points than the sample: the count is unknown, the last step is exact.
    old = sampling.SAMPLED_POINTS
    assert STEPS < old and all(t["num_points"] == STEPS for t in tensors)
    ov = app.get("overview?run=long")
    assert set(ov["views"]) == set(LAYOUT)
    tag = tensors[0]["tag"]
    full = app.get(f"series?run=long&tag={tag}&field=rms")["series"][tag]
    assert len(full["steps"]) == STEPS and full["sampled"] is False
    part = app.get(f"series?run=long&tag={tag}&field=rms&downsample=50")["series"][tag]
    assert len(part["steps"]) == 50 and part["sampled"] is True
    assert part["steps"][-1] == STEPS - 1


def test_sample_size_shrinks_with_the_number_of_tags() -> None:
    sample = sampling.sample_points
    assert sample(10) == sampling.SAMPLED_POINTS
    assert sample(781) == sampling.RUN_SAMPLED_POINTS // 781 == 320
    assert sample(100_000) == sampling.MIN_SAMPLED_POINTS


def test_a_run_longer_than_the_sample(logdir, monkeypatch) -> None:
    # 15 tags share 1,500 points: a sample of 100 points per tag.
    monkeypatch.setattr(sampling, "RUN_SAMPLED_POINTS", 1500)
    monkeypatch.setattr(sampling, "MIN_SAMPLED_POINTS", 10)
    app = App(logdir)
    doc = app.get("run?run=long")
    tensors = [t for v in doc["views"].values() for t in v]
    assert all(t["num_points"] is None and t["last_step"] == STEPS - 1 for t in tensors)
    assert all(m["num_points"] is None for m in doc["metrics"])
    ov = app.get("overview?run=long")
    for v in ov["views"].values():
        assert len(v["steps"]) <= 101 and v["steps"][-1] == STEPS - 1
    tag = tensors[0]["tag"]
    # From the cached sample (no provider call): at most k points, the sample's 100 when
    # it is smaller; past SAMPLED_POINTS, from the provider.
    for k, n in ((40, 40), (100, 100), (250, 100)):
        s = app.get(f"series?run=long&tag={tag}&field=rms&downsample={k}")["series"][tag]
        assert len(s["steps"]) == n and s["sampled"] is True and s["steps"][-1] == STEPS - 1
    monkeypatch.setattr(sampling, "SAMPLED_POINTS", 200)
    s = app.get(f"series?run=long&tag={tag}&field=std&downsample=250")["series"][tag]
    assert len(s["steps"]) == 250 and s["sampled"] is True and s["steps"][-1] == STEPS - 1
    s = app.get(f"series?run=long&tag={tag}&field=rms")["series"][tag]
    assert len(s["steps"]) == STEPS and s["sampled"] is False


def test_python_loader_samples_from_the_multiplexer(logdir) -> None:
    """Its provider converts every point before sampling; the multiplexer path converts k."""
    dp = provider.local_provider(logdir)
    mux = dp._multiplexer  # what TensorBoard hands plugins as TBContext.multiplexer
    infos, _ = provider.list_tags(dp, "", runs=["long"])
    infos = list(infos["long"].values())
    whole, _ = provider.read_series(dp, "", "long", infos)
    series, sampled, skipped = bounded.read(dp, "", "long", infos, points=40, multiplexer=mux)
    assert skipped == [] and sampled == {i.tag for i in infos if len(whole[i.tag]) > 40}
    for info in infos:
        s, w = series[info.tag], whole[info.tag]
        idx = np.searchsorted(w.steps, s.steps)
        assert len(s) == min(40, len(w)) and s.steps[0] == w.steps[0]
        assert s.steps[-1] == w.steps[-1]
        np.testing.assert_array_equal(s.values, w.values[idx])
    # Full resolution still goes through the provider, one tag per call.
    full, sampled, _ = bounded.read(dp, "", "long", infos[:2], multiplexer=mux)
    assert sampled == set() and all(len(full[i.tag]) == len(whole[i.tag]) for i in infos[:2])
