"""The PyTorch Introspector's contract: no TensorFlow, no host copies between logged points,
hooks removed on close, failures that never stop training, clear errors for bad input."""

from __future__ import annotations

import statistics
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tb_introspect.pipeline.governor import Phase
from tb_introspect.torch import Introspector
from tb_introspect.torch import state as torch_state
from tests.torch import torch_support as ts


def test_no_tensorflow_import(tmp_path):
    code = textwrap.dedent("""
        import sys, torch
        from tb_introspect.torch import Introspector
        m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with Introspector("run", m, opt, every=2) as intro:
            for _ in range(4):
                loss = m(torch.randn(8, 3)).square().mean()
                opt.zero_grad(); loss.backward(); opt.step(); intro.step(loss=loss)
            intro.end_epoch()
        assert "tensorflow" not in sys.modules, "tensorflow was imported"
        assert "keras" not in sys.modules, "keras was imported"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


HOST = ("item", "cpu", "tolist", "numpy")


@pytest.mark.parametrize("every", ["epoch", 4])
def test_no_host_copy_between_logged_points(tmp_path, monkeypatch, every):
    """Counting patches of the host-copy methods: a step that logs nothing copies nothing,
    a logged point copies each view's buffer (and the metric ring) once."""
    calls = []
    for name in HOST:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, _name=name, **k):
            calls.append(_name)
            return _original(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = ts.batches(8)
    per_step = []
    with Introspector(str(tmp_path), model, opt, every=every, stats_every=2,
                      overhead=None) as intro:
        for x, y in data:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            before = len(calls)
            intro.step(loss=loss)
            per_step.append(calls[before:])
        before = len(calls)
        intro.end_epoch()
        at_end = calls[before:]
    logged = {3, 7} if every == 4 else set()
    for i, made in enumerate(per_step):
        if i in logged:
            # outputs, output gradients, gradient sum + skipped counts, weights, losses:
            # one copy each, whatever the number of tensors
            assert 0 < made.count("cpu") <= 6, (i, made)
        else:
            assert made == [], (i, made)
    if every == "epoch":
        assert 0 < at_end.count("cpu") <= 6, at_end
    assert "item" not in calls and "tolist" not in calls


def test_hooks_removed_on_close(tmp_path):
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    intro = Introspector(str(tmp_path), model, opt)
    assert any(m._forward_hooks for m in model.modules())
    assert opt._optimizer_step_pre_hooks
    ts.train(model, opt, ts.batches(2), intro)
    intro.close()
    assert not any(m._forward_hooks for m in model.modules())
    assert not opt._optimizer_step_pre_hooks
    intro.close()  # twice is fine
    intro.step(loss=1.0)  # after close: nothing happens


def test_failure_warns_once_and_training_goes_on(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("injected")
    monkeypatch.setattr(torch_state, "fold", broken)
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Introspector(str(tmp_path), model, opt) as intro:
            ts.train(model, opt, ts.batches(4), intro, epochs=2)
    lines = [str(w.message) for w in caught if "tb_introspect" in str(w.message)]
    # one line per view, for all of its tensors failing the same way
    assert len(lines) == 2, lines
    assert {line.split()[1] for line in lines} == {"output", "output_gradient"}
    assert all("injected" in line and "training goes on" in line for line in lines)
    run = ts.read_run(str(tmp_path))
    assert "output" not in run.tensors and "output_gradient" not in run.tensors
    assert len(run.tensors["gradient"]) == len(list(model.parameters()))
    assert list(run.metric_epochs["loss"].steps) == [4, 8]


def test_nonfinite_gradient_is_counted(tmp_path):
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = ts.batches(3)
    data[1][0][0, 0, 0, 0] = float("nan")
    with Introspector(str(tmp_path), model, opt, every=1) as intro:
        ts.train(model, opt, data, intro)
    run = ts.read_run(str(tmp_path))
    g = ts.point(ts.by_name(run, "gradient")["9/weight"], 2)
    assert g["nan_count"] > 0 and g["finite_count"] < g["count"]
    out = ts.point(ts.by_name(run, "output")["0"], 2)
    assert out["nan_count"] > 0


def test_a_metric_is_the_value_given_to_step_not_one_changed_after(tmp_path):
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    given = []
    with Introspector(str(tmp_path), model, opt, every=2) as intro:
        for x, y in ts.batches(6):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            accuracy = (model(x).argmax(1) == y).float().mean()
            given.append((float(loss), float(accuracy)))
            intro.step(loss=loss, accuracy=accuracy)
            # What a loop does after logging: average over ranks in place, reuse a buffer.
            loss.detach().mul_(2.0)
            accuracy.fill_(-1.0)
        intro.end_epoch()
    run = ts.read_run(str(tmp_path))
    logged = [run.metrics[m].field("value").tolist() for m in ("loss", "accuracy")]
    assert np.allclose(list(zip(*logged, strict=True)), given, rtol=1e-6)


def test_nonfinite_rectifier_output_on_a_lean_step(tmp_path):
    """The non-finite rule (``Phase``), PyTorch's half: a lean step's rectifier output
    holding NaN is folded whole, so its NaN count is in the written statistics, and the
    next step is a statistics step for every output; the step after is lean again."""
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = ts.batches(6)
    bad_step = 3  # 0-based: a lean step (only each epoch's first is a statistics step)
    data[bad_step][0][0, 0, 0, 0] = float("nan")  # through BatchNorm: every value NaN
    nans = []
    model[2].register_forward_hook(  # the ReLU after BatchNorm: what it hands on
        lambda m, i, out: nans.append(int(torch.isnan(out).sum())))
    phases = []
    with Introspector(str(tmp_path), model, opt, stats_every=1000, overhead=None) as intro:
        for i, (x, y) in enumerate(data):
            phases.append(intro.phase)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            if i != bad_step:  # as GradScaler would: the weights stay finite
                opt.step()
            intro.step(loss=loss)
        intro.end_epoch()
    lean, stats = Phase.LEAN, Phase.STATS
    assert phases == [stats, lean, lean, lean, stats, lean]
    assert nans[bad_step] == data[bad_step][0][:, :1].numel() * 8  # the whole output
    run = ts.read_run(str(tmp_path))
    out = ts.by_name(run, "output")
    relu = ts.point(out["2"], len(data))
    assert relu["stats_steps"] == 2
    assert relu["nan_count"] == nans[bad_step]
    # counted over the two statistics steps and the lean step taken whole
    assert relu["count"] == 3 * nans[bad_step]
    assert ts.point(out["0"], len(data))["nan_count"] == 0  # no rectifier: not read there


def test_eval_not_counted(tmp_path):
    """``no_grad`` and ``eval()`` forward passes add nothing to the output views."""
    def run(evaluate: bool, path):
        torch.manual_seed(0)
        model = ts.small_cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        with Introspector(str(path), model, opt, stats_every=1, overhead=None) as intro:
            for x, y in ts.batches(3):
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                intro.step(loss=loss)
                if evaluate:
                    with torch.no_grad():
                        model(x)
                    model.eval()
                    model(x).sum()
                    model.train()
            intro.end_epoch()
        return ts.read_run(str(path))
    plain, with_eval = run(False, tmp_path / "plain"), run(True, tmp_path / "eval")
    for view in ("output", "output_gradient"):
        a, b = ts.by_name(plain, view), ts.by_name(with_eval, view)
        for name in a:
            np.testing.assert_allclose(b[name].values, a[name].values, rtol=1e-6,
                                       equal_nan=True, err_msg=f"{view} {name}")


def test_bad_input():
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        Introspector("unused", object(), opt)
    with pytest.raises(TypeError, match="Optimizer"):
        Introspector("unused", model, "sgd")
    with pytest.raises(ValueError, match="every"):
        Introspector("unused", model, opt, every=0)
    with pytest.raises(ValueError, match="unknown view"):
        Introspector("unused", model, opt, views=("weights",))
    with pytest.raises(ValueError, match=r"pip install 'tb-introspect\[gcs\]'"):
        Introspector("gs://bucket/run", model, opt)  # gcsfs is not installed here


def test_governor_spaces_statistics_steps_by_their_cost(tmp_path):
    """The Keras callback's governor, on an injected clock: a statistics step costing 1 s
    more than a 0.1 s step at the 5 % budget leaves each epoch its first statistics step
    only; without a budget the cadence is every ``stats_every``-th step."""
    steps = 40

    def stats_steps(overhead):
        torch.manual_seed(0)
        model = ts.small_cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        path = tmp_path / str(overhead)
        now = [0.0]
        with Introspector(str(path), model, opt, stats_every=8, overhead=overhead) as intro:
            intro.governor.clock = lambda: now[0]
            for _ in range(3):
                for x, y in ts.batches(steps):
                    now[0] += 1.1 if intro.phase is Phase.STATS else 0.1
                    loss = nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    intro.step(loss=loss)
                intro.end_epoch()
        out = ts.by_name(ts.read_run(str(path)), "output")
        series = next(iter(out.values()))
        points = [ts.point(series, steps * (e + 1)) for e in range(3)]
        assert all(p["steps"] == steps for p in points)
        return [int(p["stats_steps"]) for p in points]

    budgeted = stats_steps(0.05)
    assert budgeted[1:] == [1, 1]  # epoch 0 times both kinds of step first
    assert stats_steps(None) == [steps // 8] * 3
    with pytest.raises(ValueError, match="overhead"):
        Introspector(str(tmp_path), ts.small_cnn(), None, overhead=2.0)


def test_the_lean_steps_hooks_are_timed_into_the_budget(tmp_path):
    """Every lean step reports the host time of its own hooks (the rectifier counts, the
    gradient sum, the metrics): the governor takes the plain step as the lean one less that,
    and pays it from the budget."""
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Introspector(str(tmp_path), model, opt) as intro:
        ts.train(model, opt, ts.batches(24), intro)  # the epoch end keeps the estimates
        gov = intro.governor
        assert len(gov.lean_added) == len(gov.lean) > 10
        assert all(0 < a < t for a, t in zip(gov.lean_added, gov.lean, strict=True))
        assert 0 < gov.plain_step() < statistics.median(gov.lean)


def test_viewing_side_imports_no_torch():
    code = textwrap.dedent("""
        import sys
        import tb_introspect.metadata, tb_introspect.read, tb_introspect.read.json_values
        import tb_introspect.plugin.introspect_plugin
        import tb_introspect.diagnose, tb_introspect.cli
        bad = [m for m in ("torch", "tensorflow") if m in sys.modules]
        print(bad)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
