"""Every slot of every view written by ``tb_introspect.torch`` against ``stats_np`` (the
reference) on the values a recorder of its own copied out of the same real training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tb_introspect import slots, stats_np
from tb_introspect.pipeline.params import channels_last
from tb_introspect.torch import Introspector
from tests.torch import torch_support as ts

STEPS, EPOCHS, STATS_EVERY = 6, 2, 2
RECTIFIERS = {"2", "5", "8"}
LR = 0.05


@pytest.fixture(scope="module")
def epoch_run(tmp_path_factory):
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    rec = ts.Recorder(model)
    log_dir = str(tmp_path_factory.mktemp("torch_stats"))
    with Introspector(log_dir, model, opt, every="epoch", stats_every=STATS_EVERY,
                      overhead=None) as intro:
        ts.train(model, opt, ts.batches(STEPS), intro, rec, epochs=EPOCHS)
    rec.close()
    return ts.read_run(log_dir), rec


def _concat(per_step, name, steps):
    return np.concatenate([a for s in steps for a in per_step[s].get(name, [])], axis=0)


def _epoch_steps(e):
    return list(range(e * STEPS, (e + 1) * STEPS))


def _stat_steps(e):
    return [s for i, s in enumerate(_epoch_steps(e)) if i % STATS_EVERY == 0]


@pytest.mark.parametrize("view", ["output", "output_gradient"])
def test_output_views_match_stats_np(epoch_run, view):
    run, rec = epoch_run
    series = ts.by_name(run, view)
    per_step = rec.outputs if view == "output" else rec.out_grads
    names = set(per_step[0])
    assert names <= set(series), (names, set(series))
    k = 2048
    for name in sorted(names):
        for e in range(EPOCHS):
            got = ts.point(series[name], STEPS * (e + 1))
            stats = _concat(per_step, name, _stat_steps(e))
            activity = (_concat(per_step, name, _epoch_steps(e))
                        if view == "output" and name in RECTIFIERS else None)
            exact = stats.size <= k
            ts.check_vector(got, stats, activity, view, exact_percentiles=exact,
                            rank_tol=5 * 50 / np.sqrt(k * max(1 - got["zero_fraction"], 0.1)))
            assert got["epoch"] == e
            assert got["stats_steps"] == len(_stat_steps(e)) or "stats_steps" not in got
            if "activity_steps" in got:
                assert got["activity_steps"] == (STEPS if name in RECTIFIERS
                                                 else len(_stat_steps(e)))


def test_gradient_view_is_the_epoch_sum(epoch_run):
    run, rec = epoch_run
    series = ts.by_name(run, "gradient")
    prev = {}
    for e in range(EPOCHS):
        for name in rec.grads[0]:
            layer, _, short = name.rpartition(".")
            tag = f"{layer}/{short}"
            total = np.zeros_like(rec.grads[0][name])
            for s in _epoch_steps(e):
                total = total + rec.grads[s][name]
            want = stats_np.tensor_stats(channels_last(total), "gradient", sample_size=2**14)
            got = ts.point(series[tag], STEPS * (e + 1))
            fields = slots.tensor_stats_fields("gradient")
            for f, w in zip(fields, want, strict=True):
                if f not in ("epoch", "cos_prev"):
                    np.testing.assert_allclose(got[f], w, rtol=1e-6, atol=1e-12, err_msg=f)
            if name in prev:
                a, b = total.reshape(-1).astype(np.float64), prev[name].reshape(-1)
                cos = a @ b / np.sqrt((a @ a) * (b @ b))
                np.testing.assert_allclose(got["cos_prev"], cos, rtol=1e-6)
            else:
                assert np.isnan(got["cos_prev"])
            prev[name] = total.astype(np.float64)


def test_variable_view_is_read_at_the_point(epoch_run):
    run, rec = epoch_run
    series = ts.by_name(run, "variable")
    for e in range(EPOCHS):
        w_now, w_before = rec.weights[STEPS * (e + 1)], rec.weights[STEPS * e]
        for name, w in w_now.items():
            layer, _, short = name.rpartition(".")
            got = ts.point(series[f"{layer}/{short}"], STEPS * (e + 1))
            want = stats_np.tensor_stats(channels_last(w), "variable", sample_size=2**14)
            fields = slots.tensor_stats_fields("variable")
            for f, v in zip(fields, want, strict=True):
                if f in slots.BASE_FIELDS[1:] or f.startswith(("q", "logq")):
                    np.testing.assert_allclose(got[f], v, rtol=1e-6, atol=1e-12, err_msg=f)
            dw = (w.astype(np.float64) - w_before[name]).reshape(-1)
            ratio = np.sqrt(dw @ dw) / np.sqrt((w.astype(np.float64).reshape(-1) ** 2).sum())
            np.testing.assert_allclose(got["update_ratio"], ratio, rtol=1e-6)
            # plain SGD: |dw| / |sum of g| is the learning rate (float32 rounding of w aside)
            if w.ndim >= 2:
                ilr = [got[slots.ILR_PREFIX + slots.quantile_field(q)]
                       for q in (25, 50, 75)]
                np.testing.assert_allclose(ilr, LR, rtol=1e-2, err_msg=name)


def test_metrics_and_activity_maps(epoch_run):
    run, rec = epoch_run
    assert list(run.metrics["loss"].steps) == list(range(1, STEPS * EPOCHS + 1))
    band = run.metric_epochs["loss"]
    assert list(band.steps) == [STEPS, 2 * STEPS]
    # Activity maps: per-channel rates of every step of the epoch for a rectifier output
    act = run.activity["2"]
    got = dict(zip(act.info.fields, act.values[0], strict=True))
    out = _concat(rec.outputs, "2", _epoch_steps(0))  # [n, 8, 8, C]
    rates = (out != 0).mean(axis=(0, 1, 2))
    np.testing.assert_allclose([got[f"c{i}"] for i in range(8)], rates, rtol=1e-9)
    pos = (out != 0).mean(axis=(0, 3)).reshape(-1)
    np.testing.assert_allclose([got[f"s{i}"] for i in range(64)], pos, rtol=1e-9)


def test_every_n_takes_the_sampled_steps(tmp_path):
    torch.manual_seed(1)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = ts.Recorder(model)
    with Introspector(str(tmp_path), model, opt, every=3) as intro:
        ts.train(model, opt, ts.batches(7, seed=3), intro, rec)
    rec.close()
    run = ts.read_run(str(tmp_path))
    out = ts.by_name(run, "output")
    assert list(out["7"].steps) == [3, 6]
    for step in (3, 6):
        s = step - 1  # 0-based index of the sampled step
        got = ts.point(out["7"], step)
        ts.check_vector(got, rec.outputs[s]["7"][0], None, "output", exact_percentiles=True)
        g = ts.point(ts.by_name(run, "gradient")["7/weight"], step)
        want = stats_np.tensor_stats(channels_last(rec.grads[s]["7.weight"]), "gradient",
                                     sample_size=2**14)
        np.testing.assert_allclose(g["l2"], want[slots.BASE_FIELDS.index("l2")], rtol=1e-6)


@pytest.mark.parametrize(("shape", "channels_first"), [((5, 3, 4, 6), True), ((5, 7, 3), False),
                                                       ((5, 9), False)])
def test_lean_tally_adds_what_fold_adds(monkeypatch, shape, channels_first):
    """The lean steps' activity counts through ``ActivityTally`` (settled once, or several
    times when the exact-count limit is reached) equal ``fold``'s own, NaN, Inf and exact
    zeros included, across batch sizes and a float64 call."""
    from tb_introspect.stats_np import segments
    from tb_introspect.torch import state

    g = torch.Generator().manual_seed(0)
    calls = []
    for i, batch in enumerate((5, 2, 5, 1)):
        x = torch.relu(torch.randn((batch, *shape[1:]), generator=g))
        x.view(-1)[::7] = float("nan")
        x.view(-1)[::11] = float("inf")
        calls.append(x.double() if i == 2 else x)
    seg = segments.layout(shape, channels_first, 4)
    arange, seed = torch.arange(4), torch.zeros((), dtype=torch.int64)
    for limit in (state.ActivityTally.LIMIT, 6):  # 6 rows: settles inside the calls
        monkeypatch.setattr(state.ActivityTally, "LIMIT", limit)
        plain, tallied, tally = (torch.from_numpy(seg.empty()), torch.from_numpy(seg.empty()),
                                  state.ActivityTally())
        for x in calls:
            state.fold(plain, seg, x, seed, False, arange)
            state.fold(tallied, seg, x, seed, False, arange, tally)
        assert tally.count > 0 or limit == 6
        tally.settle(tallied, seg)
        assert tally.count == 0
        np.testing.assert_array_equal(tallied.numpy(), plain.numpy())
        assert tallied[len(segments.ADDITIVE_SLOTS) - 1] == sum(x.numel() for x in calls)


def test_finite_fold_equals_the_general_fold(monkeypatch):
    """On a CPU a tensor whose sum is finite skips the zeroing and the counting by kind: the
    state it folds is the general path's, bit for bit (zeros, both signs, subnormals, huge
    values, one element, float64); a sum that overflows takes the general path."""
    from tb_introspect.stats_np import segments
    from tb_introspect.torch import state

    g = torch.Generator().manual_seed(1)
    x = torch.randn((6, 3, 4, 5), generator=g)
    x[0] = 0.0
    x[1, 0] = 1e-41  # subnormal
    calls = [x, torch.relu(x), x.double() * 1e200, torch.tensor([[2.5]]),
             torch.full((4, 8), 3e38)]  # the last one's float32 sum overflows
    arange, seed = torch.arange(8), torch.zeros((), dtype=torch.int64)
    folded = {}
    for general in (False, True):
        if general:
            monkeypatch.setattr(state, "_finite_sum", lambda flat, big: None)
        out = []
        for t in calls:
            seg = segments.layout(t.shape, True, 8)
            buf = torch.from_numpy(seg.empty())
            state.fold(buf, seg, t, seed, True, arange)
            state.fold(buf, seg, t * 0.5, seed + 1, True, arange)
            out.append(buf)
        folded[general] = out
    for fast, general in zip(folded[False], folded[True], strict=True):
        np.testing.assert_array_equal(fast.numpy(), general.numpy())
    monkeypatch.undo()
    assert state._finite_sum(calls[-1].reshape(-1), False) is None
    assert state._finite_sum(x.reshape(-1), False) is not None


def test_device_fold_equals_the_host_fold_but_its_draws(monkeypatch):
    """A GPU's fold (device ops only, the integer hash's draws) and an eager CPU's (its
    small parts in numpy on the buffer's memory, numpy's draws) fold the same counts,
    moments, extremes and column counts, bit for bit, with NaN, Inf and exact zeros; their
    samples are drawn apart but hold as many entries."""
    from tb_introspect.stats_np import segments
    from tb_introspect.torch import state

    g = torch.Generator().manual_seed(1)
    for shape, channels_first in (((6, 3, 4, 5), True), ((7, 9), False), ((5, 7, 3), False)):
        x = torch.randn(shape, generator=g)
        x[0] = 0.0
        y = x.clone()
        y.view(-1)[::5] = float("nan")
        y.view(-1)[1] = float("inf")
        seg = segments.layout(shape, channels_first, 8)
        arange = torch.arange(8)
        folded = []
        for device in (False, True):
            if device:
                monkeypatch.setattr(state, "_numpy_view", lambda buf: None)
            buf = torch.from_numpy(seg.empty())
            for i, t in enumerate((x, y, x * 0.5)):
                state.fold(buf, seg, t, torch.tensor(i + 1), True, arange)
            folded.append(buf.numpy())
        monkeypatch.undo()
        s = seg.sample_at
        np.testing.assert_array_equal(folded[0][:s], folded[1][:s])
        assert [np.isfinite(f[s:s + 8]).sum() for f in folded] == [8, 8]


def test_folds_sample_in_proportion_to_their_sizes():
    """The bottom-k merge of folds larger than the sample keeps each in proportion to its
    size (its k keys are the k smallest of as many uniform keys as it has values): a batch of
    20,000 ones and one of 60,000 minus ones leave a quarter of ones, within six sigma, in
    either order; beside them a fold of 100 values, which the sample holds whole, keeps
    about 100 / 80,100 of it."""
    from tb_introspect.stats_np import segments
    from tb_introspect.torch import state

    k = 1024
    seg = segments.layout((200, 100), False, k)
    arange = torch.arange(k)
    small, large, tiny = torch.ones(200, 100), -torch.ones(600, 100), torch.full((1, 100), 5.0)
    shares, tiny_counts = [], []
    for seed, order in enumerate(((small, large, tiny), (tiny, large, small)) * 4):
        buf = torch.from_numpy(seg.empty())
        for i, t in enumerate(order):
            state.fold(buf, seg, t, torch.tensor(3 * seed + i + 1), True, arange)
        values = buf.numpy()[seg.sample_at + k:seg.sample_at + 2 * k]
        assert np.count_nonzero(values) == k
        shares.append(np.mean(values == 1.0) / np.mean(values != 5.0))
        tiny_counts.append(np.count_nonzero(values == 5.0))
    sigma = np.sqrt(0.25 * 0.75 / k)
    assert all(abs(s - 0.25) < 6 * sigma for s in shares), shares
    assert abs(np.mean(shares) - 0.25) < 6 * sigma / np.sqrt(len(shares))
    assert np.mean(tiny_counts) < 1 + 6 * np.sqrt(k * 100 / 80_100 / len(tiny_counts))
