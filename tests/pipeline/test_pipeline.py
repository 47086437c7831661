"""``Pipeline``: when points are logged, the metric ring's drains, the epoch's activity maps and
metric bands, flushes, failures and ``on_finding``, driven by a fake front-end
(``pipeline_testlib.FakeFrontEnd``) into real event files read back by the reader."""

from __future__ import annotations

import os
import time
import warnings

import numpy as np
import pytest

from tb_introspect import metadata, slots
from tb_introspect.pipeline.failures import METRICS, STATISTICS, WRITING, Part
from tb_introspect.pipeline.findings import FindingStop
from tb_introspect.pipeline.governor import Governor
from tb_introspect.pipeline.options import Options
from tb_introspect.pipeline.pipeline import Pipeline
from tb_introspect.pipeline.sink import EventSink
from tests.pipeline.pipeline_testlib import (
    FakeFrontEnd,
    events,
    make,
    read,
    read_logdir_elsewhere,
    tensor,
    train,
)

TENSORS = [("variable", "dense/kernel"), ("variable", "conv/kernel"),
           ("gradient", "dense/bias"), ("output", "dense"), ("output", "relu"),
           ("output_gradient", "relu")]


def metric_values(run, name):
    s = run.metrics[name]
    return dict(zip(s.steps.tolist(), s.field("value").tolist(), strict=True))


def rates(arrays):
    """Numpy's own per-channel and per-position activation rates of an output, and rows."""
    x = np.concatenate(arrays) != 0
    spatial = x.mean(axis=(0, 2)) if x.ndim == 3 else np.zeros(0)
    return x.mean(axis=tuple(range(x.ndim - 1))), spatial, x.shape[0]


def check_gradient_points(run, fe):
    """Each point's gradient statistics are those of the window's sums (numpy, not stats_np)."""
    for i, spec in enumerate(fe.plan.variables):
        s = tensor(run, "gradient", spec.name)
        assert s.steps.tolist() == [w.step for w in fe.history]
        for k, w in enumerate(fe.history):
            g = w.gsums[i]
            assert s.field("count")[k] == g.size
            assert s.field("mean")[k] == pytest.approx(g.mean(), rel=1e-9, abs=1e-15)
            assert s.field("rms")[k] == pytest.approx(np.sqrt(np.mean(g**2)), rel=1e-9)
            assert (s.field("min")[k], s.field("max")[k]) == (g.min(), g.max())
            assert s.field("q50")[k] == pytest.approx(np.median(g), rel=1e-9)


@pytest.mark.parametrize("per_execution", [1, 3])
def test_every_n_logs_a_point_at_each_sampled_step(tmp_path, per_execution):
    fe, pipeline = make(tmp_path, every=4, metric_rows=64)
    train(fe, pipeline, 14, per_execution)
    pipeline.end_epoch()
    pipeline.close()
    # Steps 4, 8, 12, whenever the execution that held them ended (1 step: at once; 3 steps:
    # after steps 6, 9 and 12), and only those: the front-end was asked three times.
    assert [w.step for w in fe.history] == [4, 8, 12]
    assert fe.calls["point"] == 3
    run = read(tmp_path)
    for view, name in TENSORS:
        s = tensor(run, view, name)
        assert s.steps.tolist() == [4, 8, 12], (view, name)
        assert s.info.cadence == "step"
        assert s.epochs.tolist() == [0, 0, 0]
    relu = tensor(run, "output", "relu")
    # The window's steps (every step since the last point) and its one statistics step;
    # with every=N even a rectifier's activity comes from the statistics steps.
    assert relu.field("steps").tolist() == [len(w.steps) for w in fe.history]
    assert relu.field("stats_steps").tolist() == [1, 1, 1]
    assert relu.field("activity_steps").tolist() == [1, 1, 1]
    check_gradient_points(run, fe)
    # The epoch's activity map sums the three points' counts (their statistics steps).
    channels, spatial, rows = rates([x for w in fe.history for x in w.counted[1]])
    a = run.activity["relu"]
    assert a.steps.tolist() == [14]
    assert a.field("samples")[0] == rows == 3 * 6
    np.testing.assert_allclose([a.field(f"c{c}")[0] for c in range(3)], channels, rtol=1e-12)
    np.testing.assert_allclose([a.field(f"s{p}")[0] for p in range(4)], spatial, rtol=1e-12)
    assert a.field("c0")[0] == 0  # the dead channel
    # Every step's metric value, none lost.
    assert metric_values(run, "loss") == pytest.approx(fe.truth["loss"], rel=1e-12)
    assert metric_values(run, "acc") == pytest.approx(fe.truth["acc"], rel=1e-12)


def test_every_epoch_logs_a_point_activity_maps_and_metric_bands_per_epoch(tmp_path):
    fe, pipeline = make(tmp_path, every="epoch", metric_rows=4, options={"stats_every": 2})
    for epoch in range(3):
        pipeline.begin_epoch(epoch)
        train(fe, pipeline, 5)
        pipeline.end_epoch({"val_loss": np.float32(0.5 + epoch), "val_note": "not a number"})
    pipeline.close()
    assert [w.step for w in fe.history] == [5, 10, 15]
    run = read(tmp_path)
    for view, name in TENSORS:
        s = tensor(run, view, name)
        assert s.steps.tolist() == [5, 10, 15]
        assert s.info.cadence == "epoch"
        assert s.epochs.tolist() == [0, 1, 2]
    # Steps 1, 3 and 5 of each epoch are statistics steps (stats_every=2); the rectifier's
    # activity counts every step, the other output's the statistics steps only.
    for view in ("output", "output_gradient"):
        relu = tensor(run, view, "relu")
        assert relu.field("steps").tolist() == [5, 5, 5]
        assert relu.field("stats_steps").tolist() == [3, 3, 3]
    assert tensor(run, "output", "relu").field("activity_steps").tolist() == [5, 5, 5]
    assert tensor(run, "output", "dense").field("activity_steps").tolist() == [3, 3, 3]
    check_gradient_points(run, fe)
    # The output statistics are the statistics steps' arrays taken together.
    dense = tensor(run, "output", "dense")
    for k, w in enumerate(fe.history):
        x = np.concatenate(w.outputs["output"][0])
        assert dense.field("count")[k] == x.size
        assert dense.field("rms")[k] == pytest.approx(np.sqrt(np.mean(x**2)), rel=1e-9)
        assert dense.field("dead_rate")[k] == pytest.approx(1 / 5)  # its column 4
    # One activity map per output and epoch, from the epoch's counted arrays.
    for j, name in enumerate(["dense", "relu"]):
        a = run.activity[name]
        assert a.steps.tolist() == [5, 10, 15] and a.epochs.tolist() == [0, 1, 2]
        for k, w in enumerate(fe.history):
            channels, spatial, rows = rates(w.counted[j])
            assert a.field("samples")[k] == rows == 6 * (5 if name == "relu" else 3)
            got = [a.field(f"c{c}")[k] for c in range(len(channels))]
            np.testing.assert_allclose(got, channels, rtol=1e-12)
            np.testing.assert_allclose([a.field(f"s{p}")[k] for p in range(len(spatial))],
                                       spatial, rtol=1e-12)
    # Each metric's band per epoch, from the epoch's per-step values (numpy's own).
    for name in ("loss", "acc"):
        band = run.metric_epochs[name]
        assert band.steps.tolist() == [5, 10, 15] and band.epochs.tolist() == [0, 1, 2]
        for k in range(3):
            v = [fe.truth[name][s] for s in range(5 * k + 1, 5 * k + 6) if s in fe.truth[name]]
            want = [*np.percentile(v, [0, 25, 50, 75, 100]), np.mean(v), len(v)]
            got = [band.field(f)[k] for f in slots.METRIC_EPOCH_FIELDS[1:]]
            np.testing.assert_allclose(got, want, rtol=1e-12)
    assert metric_values(run, "val_loss") == {5: 0.5, 10: 1.5, 15: 2.5}
    assert "val_note" not in run.metrics
    assert metric_values(run, "loss") == pytest.approx(fe.truth["loss"], rel=1e-12)
    assert run.metrics["loss"].epochs.tolist() == [(s - 1) // 5 for s in range(1, 16)]


def test_what_the_reader_reads_from_the_files_is_what_this_module_reads(tmp_path):
    """``read`` (the reader's functions on the records, in this process) is TensorBoard's
    data provider reading the files (``read_logdir``, in a subprocess without TensorFlow)."""
    fe, pipeline = make(tmp_path / "run", every="epoch", metric_rows=4)
    for epoch in range(2):
        pipeline.begin_epoch(epoch)
        train(fe, pipeline, 3)
        pipeline.end_epoch({"val_loss": 1.0})
    pipeline.close()
    series, _, tensorflow = read_logdir_elsewhere(tmp_path / "run", tmp_path)
    assert not tensorflow
    here = read(tmp_path / "run").all_series()
    # Tensors (2 views each of 3 variables and 2 outputs), 3 metrics, 2 bands, 2 maps.
    assert sorted(series) == sorted(here) and len(here) == 3 * 2 + 2 * 2 + 3 + 2 + 2
    for tag, s in here.items():
        steps, values = series[tag]
        assert steps.tolist() == s.steps.tolist(), tag
        np.testing.assert_array_equal(values, s.values, err_msg=tag)


@pytest.mark.parametrize(("rows", "per_execution"), [(4, 1), (4, 3), (4, 4), (2, 1), (5, 2)])
def test_the_metric_ring_is_drained_before_it_wraps(tmp_path, rows, per_execution):
    # Ten times the ring's rows between two points (every=40), in executions of up to
    # ``rows`` steps: every value is written, at its step.
    fe, pipeline = make(tmp_path, every=40, metric_rows=rows)
    train(fe, pipeline, 10 * rows, per_execution)
    assert fe.calls["point"] == (1 if 10 * rows >= 40 else 0)
    pipeline.guard(METRICS, pipeline.drain)
    pipeline.close()
    run = read(tmp_path)
    assert len(fe.truth["loss"]) == 10 * rows
    assert metric_values(run, "loss") == pytest.approx(fe.truth["loss"], rel=1e-12)
    assert metric_values(run, "acc") == pytest.approx(fe.truth["acc"], rel=1e-12)
    # ... and not by reading after every execution when the ring has room.
    if rows > 2 * per_execution:
        assert fe.calls["read_metrics"] < 10 * rows / per_execution


def test_running_metrics_are_written_at_the_current_step(tmp_path):
    fe, pipeline = make(tmp_path, every=100, metric_rows=50)
    train(fe, pipeline, 2)
    fe.step()
    pipeline.after_steps(1, {"auc": np.float32(0.25), "table": "not a number"})
    train(fe, pipeline, 2)
    pipeline.guard(METRICS, pipeline.drain)
    pipeline.close()
    run = read(tmp_path)
    assert metric_values(run, "auc") == {3: 0.25}
    assert "table" not in run.metrics
    assert metric_values(run, "loss") == pytest.approx(fe.truth["loss"], rel=1e-12)


def written_steps(log_dir, tag="introspect/metric/loss"):
    return [e.step for e in events(log_dir) for v in e.summary.value if v.tag == tag]


def test_flush_secs_drains_and_flushes_on_the_clock_unless_in_lockstep(tmp_path):
    fe, pipeline = make(tmp_path / "alone", every=100, metric_rows=50, flush_secs=0)
    for step in range(1, 6):
        train(fe, pipeline, 1)
        # On disk once the worker ran the clock's flush, while the sink is open: each step
        # drained and flushed (the step itself does not wait for it).
        assert pipeline.worker.wait(20)
        assert written_steps(tmp_path / "alone") == list(range(1, step + 1))
    pipeline.close()
    # Several processes read the ring together: never on one process's clock, only when the
    # ring is due (here: at the epoch's end).
    fe, pipeline = make(tmp_path / "lockstep", every=100, metric_rows=50, flush_secs=0,
                        lockstep=True)
    train(fe, pipeline, 5)
    assert fe.calls["read_metrics"] == 0 and written_steps(tmp_path / "lockstep") == []
    pipeline.end_epoch()
    pipeline.worker.wait()  # a window's writes and its flush run beside the next steps
    assert written_steps(tmp_path / "lockstep") == [1, 2, 3, 4, 5]
    pipeline.close()


def test_close_writes_what_is_pending(tmp_path):
    fe, pipeline = make(tmp_path, every=100, metric_rows=50)  # flush_secs=3600
    train(fe, pipeline, 7)
    pipeline.guard(METRICS, pipeline.drain)  # as each front-end does before closing
    assert written_steps(tmp_path) == []  # written, still in the process
    sink = pipeline.sink
    pipeline.close()
    assert sink.closed and pipeline.sink is None
    assert written_steps(tmp_path) == list(range(1, 8))
    pipeline.close()  # twice: nothing more
    assert len(list(tmp_path.iterdir())) == 1


def caught(fn, *args):
    """``fn(*args)``'s value and the warnings it gave, each one (no filter hides a repeat)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in seen]


def test_a_failing_point_warns_once_and_training_and_metrics_go_on(tmp_path):
    fe, pipeline = make(tmp_path, every=3, metric_rows=4, fail="point", fail_at=2)
    _, seen = caught(train, fe, pipeline, 15)
    assert seen == ["tb_introspect: statistics failed (RuntimeError: the fake's point failed);"
                    " statistics is off for the rest of training, training goes on"]
    assert pipeline.failures.off == {Part(STATISTICS)}
    assert fe.calls["point"] == 2  # never asked again
    _, seen = caught(pipeline.end_epoch)
    assert seen == []
    pipeline.close()
    run = read(tmp_path)
    assert tensor(run, "gradient", "dense/kernel").steps.tolist() == [3]
    assert metric_values(run, "loss") == pytest.approx(fe.truth["loss"], rel=1e-12)
    assert sorted(run.metric_epochs) == ["acc", "loss"]
    assert run.activity == {}  # the statistics part writes them: off


def test_failing_metrics_warn_once_and_the_points_go_on(tmp_path):
    fe, pipeline = make(tmp_path, every=3, metric_rows=4, fail="read_metrics", fail_at=2)
    _, seen = caught(train, fe, pipeline, 10)
    assert len(seen) == 1 and seen[0].startswith("tb_introspect: metrics failed (RuntimeError")
    assert pipeline.failures.off == {Part(METRICS)} and fe.calls["read_metrics"] == 2
    pipeline.close()
    run = read(tmp_path)
    assert tensor(run, "variable", "dense/kernel").steps.tolist() == [3, 6, 9]
    assert sorted(metric_values(run, "loss")) == [1, 2, 3]  # the first drain's


@pytest.mark.skipif(not os.path.exists("/dev/full") or not os.path.isdir("/proc/self/fd"),
                    reason="needs Linux's /dev/full and /proc")
def test_a_full_disk_stops_all_logging_with_one_warning(tmp_path):
    fe, pipeline = make(tmp_path, every=2, metric_rows=4)
    train(fe, pipeline, 4)
    pipeline.flush()
    # From now on the event file's writes fail as on a full disk (ENOSPC): its descriptor
    # is /dev/full's.
    path = os.path.realpath(pipeline.sink.path)
    (fd,) = [int(fd) for fd in os.listdir("/proc/self/fd")
             if os.path.realpath(f"/proc/self/fd/{fd}") == path]
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, fd)
    finally:
        os.close(full)
    _, seen = caught(train, fe, pipeline, 6)
    _, more = caught(pipeline.end_epoch)
    _, at_close = caught(pipeline.close)
    warned = seen + more + at_close
    assert len(warned) == 1, warned
    assert warned[0].startswith("tb_introspect: cannot write to the log directory (")
    assert "No space left on device" in warned[0]
    assert pipeline.failures.off == {Part(WRITING), Part(METRICS), Part(STATISTICS)}
    assert fe.step_count == 10


def test_a_points_time_is_paid_from_the_governors_budget(tmp_path):
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    clock = Clock()
    governor = Governor(0.05, spacing=1, clock=clock)
    fe, pipeline = make(tmp_path, every=2, metric_rows=64, governor=governor)

    def costs():
        clock.now += 0.25

    fe.on_point = costs
    train(fe, pipeline, 6)
    pipeline.close()
    assert fe.calls["point"] == 3
    assert sum(governor.log_seconds) == pytest.approx(0.75)
    assert governor.credit == pytest.approx(-0.75)


def wait_for(condition, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_on_finding_calls_back_on_a_nonfinite_gradient(tmp_path):
    found = []
    fe, pipeline = make(tmp_path / "clean", every=3, metric_rows=8, nan_at=9,
                        options={"on_finding": found.append,
                                 "on_finding_severity": "critical"})
    train(fe, pipeline, 8)
    pipeline.close()  # settles: the rules judged the points at 3 and 6
    assert found == []
    fe, pipeline = make(tmp_path / "nan", every=3, metric_rows=8, nan_at=9,
                        options={"on_finding": found.append,
                                 "on_finding_severity": "critical"})
    train(fe, pipeline, 12)
    pipeline.close()
    assert [(f.kind, f.first_step) for f in found] == [("nonfinite", 9)]
    assert tensor(read(tmp_path / "nan"), "gradient", "dense/kernel").field(
        "nan_count").tolist() == [0, 0, 1, 0]
    # tb-introspect diagnose, reading the files, finds it at the same step.
    _, findings, _ = read_logdir_elsewhere(tmp_path / "nan", tmp_path)
    assert ["nonfinite", 9] in findings


def test_on_finding_stop_is_handed_to_the_front_end_between_steps(tmp_path):
    fe, pipeline = make(tmp_path, every=3, metric_rows=8, nan_at=3,
                        options={"on_finding": "stop", "on_finding_severity": "critical"})
    train(fe, pipeline, 3)
    assert fe.history[0].step == 3
    wait_for(lambda: pipeline.act() or pipeline.stop is not None)  # the worker judged it
    with pytest.raises(FindingStop, match=r"training stopped at step 3: critical nonfinite") as e:
        pipeline.raise_stop()
    assert e.value.finding.kind == "nonfinite" and e.value.step == 3
    assert pipeline.take_stop() is None  # once
    pipeline.close()


def test_a_new_sink_gets_the_metadata_again(tmp_path):
    fe, pipeline = make(tmp_path / "a", every=2, metric_rows=4)
    train(fe, pipeline, 2)
    pipeline.close()  # as a Keras callback between two fits: the worker finishes first
    pipeline.set_sink(EventSink(tmp_path / "b"))
    train(fe, pipeline, 2)
    pipeline.close()
    for run_dir, step in (("a", 2), ("b", 4)):
        run = read(tmp_path / run_dir)  # readable alone: each file has its tags' metadata
        assert tensor(run, "variable", "dense/kernel").steps.tolist() == [step]
        summary = [v for e in events(tmp_path / run_dir) for v in e.summary.value
                   if v.tag == metadata.summary_tag("variable")]
        assert len(summary) == 1 and summary[0].HasField("metadata")


def test_only_a_sink_writes(tmp_path):
    """A process without a sink (not the chief) asks for the same points and writes nothing."""
    fe = FakeFrontEnd(Options.make(every=2, flush_secs=3600), metric_rows=4)
    pipeline = Pipeline(fe, None, lockstep=True)
    pipeline.start(0)
    train(fe, pipeline, 6)
    pipeline.end_epoch()
    pipeline.close()
    assert [w.step for w in fe.history] == [2, 4, 6]
    assert fe.calls["read_metrics"] >= 2 and pipeline.failures.off == set()
