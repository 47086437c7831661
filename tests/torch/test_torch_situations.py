"""Real PyTorch training situations: in-place ReLU, a module called twice, bfloat16
autocast, GradScaler's skipped steps, gradient accumulation and torch.compile."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tb_introspect import slots, stats_np
from tb_introspect.pipeline.params import channels_last
from tb_introspect.torch import Introspector
from tests.torch import torch_support as ts


def _run(path, model, opt, data, epochs=1, **kwargs):
    with Introspector(str(path), model, opt, **kwargs) as intro:
        ts.train(model, opt, data, intro, epochs=epochs)
    return ts.read_run(str(path))


def test_inplace_relu_matches_out_of_place(tmp_path):
    """ReLU(inplace=True) overwrites the previous module's output: the statistics of that
    output are taken in its forward hook, before the overwrite, so both runs agree."""
    runs = []
    for inplace in (False, True):
        torch.manual_seed(0)
        model = ts.small_cnn(inplace=inplace)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        runs.append(_run(tmp_path / str(inplace), model, opt, ts.batches(4), stats_every=2,
                         overhead=None))
    for view in slots.VIEWS:
        a, b = ts.by_name(runs[0], view), ts.by_name(runs[1], view)
        assert set(a) == set(b)
        for name in a:
            np.testing.assert_allclose(b[name].values, a[name].values, rtol=1e-5, atol=1e-12,
                                       equal_nan=True, err_msg=f"{view} {name}")
    bn = ts.point(ts.by_name(runs[1], "output")["1"], 4)
    assert bn["min"] < 0  # BatchNorm's output before the in-place ReLU


class Twice(nn.Module):
    """One Linear and one ReLU called twice per forward pass."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.shared = nn.Linear(8, 8)
        self.act = nn.ReLU()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.act(self.inp(x))
        h = self.act(self.shared(h))
        h = self.act(self.shared(h))
        return self.head(h)


def test_module_called_twice_covers_both_calls(tmp_path):
    torch.manual_seed(0)
    model = Twice()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = ts.Recorder(model)
    data = [(torch.randn(16, 6), torch.randint(0, 3, (16,))) for _ in range(3)]
    with Introspector(str(tmp_path), model, opt, stats_every=1, overhead=None) as intro:
        ts.train(model, opt, data, intro, rec)
    rec.close()
    run = ts.read_run(str(tmp_path))
    for view, per_step in (("output", rec.outputs), ("output_gradient", rec.out_grads)):
        for name in ("shared", "act"):
            calls = [a for s in range(3) for a in per_step[s][name]]
            assert len(calls) == 3 * (2 if name == "shared" else 3)
            got = ts.point(ts.by_name(run, view)[name], 3)
            ts.check_vector(got, np.concatenate(calls), None, view, exact_percentiles=True)


def test_bfloat16_autocast(tmp_path):
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = ts.Recorder(model)
    data = ts.batches(3)
    with Introspector(str(tmp_path), model, opt, stats_every=1, overhead=None) as intro:
        for x, y in data:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.end_step()
            intro.step(loss=loss)
        intro.end_epoch()
    rec.close()
    run = ts.read_run(str(tmp_path))
    conv = ts.by_name(run, "output")["0"]
    assert conv.info.dtype == "bfloat16"
    outs = np.concatenate([rec.outputs[s]["0"][0] for s in range(3)])
    ts.check_vector(ts.point(conv, 3), outs, None, "output", rank_tol=6.0)
    loss = run.metrics["loss"].values[:, 1]
    assert np.all(np.isfinite(loss))


def test_grad_scaler_skipped_steps_are_counted_not_summed(tmp_path):
    """An init scale that overflows the loss makes GradScaler skip steps: their non-finite
    gradients are counted, the epoch's gradient sum holds the other steps only."""
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
    rec = ts.Recorder(model)
    skipped = []
    with Introspector(str(tmp_path), model, opt, grad_scaler=scaler) as intro:
        for x, y in ts.batches(8):
            # summed: gradients large enough to overflow at this scale on some steps
            loss = nn.functional.cross_entropy(model(x), y, reduction="sum")
            opt.zero_grad()
            scaler.scale(loss).backward()
            scale = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped.append(scaler.get_scale() < scale)
            rec.end_step()
            intro.step(loss=loss)
        intro.end_epoch()
    rec.close()
    assert any(skipped) and not all(skipped), skipped
    run = ts.read_run(str(tmp_path))
    grads = ts.by_name(run, "gradient")
    nonfinite_seen = False
    for name in rec.grads[0]:
        layer, _, short = name.rpartition(".")
        got = ts.point(grads[f"{layer}/{short}"], 8)
        total = sum(rec.grads[s][name] for s in range(8) if not skipped[s])
        want = dict(zip(slots.tensor_stats_fields("gradient"),
                        stats_np.tensor_stats(channels_last(total), "gradient",
                                              sample_size=2**14), strict=True))
        np.testing.assert_allclose(got["l2"], want["l2"], rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(got["finite_count"], want["finite_count"])
        bad = sum(np.count_nonzero(~np.isfinite(rec.grads[s][name]))
                  for s in range(8) if skipped[s])
        assert got["nan_count"] + got["posinf_count"] + got["neginf_count"] == bad
        nonfinite_seen |= bad > 0
    assert nonfinite_seen
    assert "output_gradient" in run.tensors


def test_gradient_accumulation(tmp_path):
    """Two micro-batches per optimizer step: both forward passes are in the step's outputs,
    the accumulated gradient is the step's gradient."""
    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = ts.Recorder(model)
    data = ts.batches(8)
    with Introspector(str(tmp_path), model, opt, every=2) as intro:
        for i in range(0, 8, 2):
            opt.zero_grad()
            for x, y in data[i:i + 2]:
                (nn.functional.cross_entropy(model(x), y) / 2).backward()
            opt.step()
            rec.end_step()
            intro.step()
        intro.end_epoch()
    rec.close()
    run = ts.read_run(str(tmp_path))
    out = ts.point(ts.by_name(run, "output")["7"], 2)
    calls = rec.outputs[1]["7"]
    assert len(calls) == 2
    ts.check_vector(out, np.concatenate(calls), None, "output", exact_percentiles=True)
    g = ts.point(ts.by_name(run, "gradient")["7/weight"], 2)
    want = stats_np.tensor_stats(channels_last(rec.grads[1]["7.weight"]), "gradient",
                                 sample_size=2**14)
    np.testing.assert_allclose(g["l2"], want[slots.BASE_FIELDS.index("l2")], rtol=1e-6)


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory):
    """The same training eager and under torch.compile (hooks registered before compiling;
    the aot_eager backend: Dynamo's graph capture without Inductor's C++ build)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    data, out = ts.batches(8), {}
    graphs_after_epoch = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = ts.small_cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        path = str(tmp_path_factory.mktemp(f"compile_{compiled}"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Introspector(path, model, opt, stats_every=2, overhead=None) as intro:
                run_model = torch.compile(model, backend="aot_eager") if compiled else model
                for _ in range(3):
                    ts.train(run_model, opt, data, intro)
                    if compiled:
                        graphs_after_epoch.append(
                            (counters["stats"]["unique_graphs"],
                             sum(counters["graph_break"].values()),
                             sum(counters["recompiles"].values())))
        out[compiled] = (ts.read_run(path), [str(w.message) for w in caught
                                             if "tb_introspect" in str(w.message)])
    return out, graphs_after_epoch


def test_compile_keeps_three_views_and_warns_once(compiled_runs):
    out, _ = compiled_runs
    (eager, _), (compiled, lines) = out[False], out[True]
    assert len(lines) == 1 and "output_gradient" in lines[0] and "compile" in lines[0]
    assert "output_gradient" not in compiled.tensors or all(
        s.steps.size <= 1 for s in compiled.tensors["output_gradient"])
    for view in ("variable", "gradient", "output"):
        a, b = ts.by_name(eager, view), ts.by_name(compiled, view)
        assert set(a) == set(b), view
        fields = list(slots.tensor_stats_fields(view))
        # the output percentiles come from a different (equally valid) sample
        cols = ([fields.index(f) for f in (*ts.EXACT, "q0", "q100")] if view == "output"
                else list(range(len(fields))))
        for name in a:
            np.testing.assert_allclose(b[name].values[:, cols], a[name].values[:, cols],
                                       rtol=1e-4, atol=1e-7, equal_nan=True,
                                       err_msg=f"{view} {name}")


def test_compile_steps_without_statistics_add_no_graphs(compiled_runs):
    """After the first epoch (the first step's buffers, a statistics step, an activity
    step), no epoch adds a graph, a graph break or a recompile."""
    _, graphs = compiled_runs
    assert graphs[0][1] == 0  # no graph break at all
    assert graphs[1] == graphs[0] and graphs[2] == graphs[0], graphs
