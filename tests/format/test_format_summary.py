"""Every writer writes each view's VIEW_SUMMARY (format version 3), read back from real
event files: each point equals ``summary_pb.view_summary`` of that point's per-tensor
vectors (float32, rows in the order of the view's first point, NaN where a tensor has no
point), and only a tag's first summary event of a writer carries the metadata."""

from __future__ import annotations

import doctest
import glob
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import types_pb2

from tb_introspect import metadata, slots, summary_pb, writer
from tests.keras import collect_testlib as lib


def summary_events(log_dir: str) -> dict[str, list[list]]:
    """tag -> per event file, in order: (step, has metadata, tensor dtype, shape)."""
    out: dict[str, list[list]] = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))):
        seen: dict[str, list] = {}
        for event in event_file_loader.EventFileLoader(path).Load():
            for v in event.summary.value:
                if v.tag in {metadata.summary_tag(view) for view in slots.VIEWS}:
                    seen.setdefault(v.tag, []).append(
                        (event.step, v.HasField("metadata"), v.tensor.dtype,
                         [d.size for d in v.tensor.tensor_shape.dim]))
        for tag, events in seen.items():
            out.setdefault(tag, []).append(events)
    return out


def check_summaries(log_dir: str, views) -> dict[str, lib.Series]:
    """Check every view's summary against the per-tensor tags; returns the run."""
    run = lib.read_run(log_dir)
    events = summary_events(log_dir)
    for view in views:
        tags = {t for t, s in run.items() if s.data.kind == metadata.TENSOR_STATS
                and s.data.view == view}
        assert tags, view
        summary = run[metadata.summary_tag(view)]
        data = summary.data
        assert data.kind == metadata.VIEW_SUMMARY and data.view == view
        assert data.version == metadata.PROTO_VERSION
        assert tuple(data.fields) == slots.summary_fields(view)
        assert set(data.rows) == tags and len(data.rows) == len(tags)
        assert data.cadence == run[data.rows[0]].data.cadence
        assert summary.steps == sorted(set().union(*(run[t].steps for t in tags)))
        quantiles = run[data.rows[0]].data.quantiles
        width = len(slots.tensor_stats_fields(view, quantiles))
        for step, matrix in zip(summary.steps, summary.vectors, strict=True):
            vectors = np.stack([run[t].vectors[run[t].steps.index(step)]
                                if step in run[t].steps else np.full(width, np.nan)
                                for t in data.rows])
            assert matrix.dtype == np.float32
            np.testing.assert_array_equal(
                matrix, summary_pb.view_summary(view, data.rows, vectors, quantiles))
        for file_events in events[metadata.summary_tag(view)]:
            assert [m for _, m, _, _ in file_events] == [True] + [False] * (len(file_events) - 1)
            assert {d for _, _, d, _ in file_events} == {types_pb2.DT_FLOAT}
            assert {tuple(s) for _, _, _, s in file_events} == {(len(tags), len(data.fields))}
    return run


# ---------------------------------------------------------------------------- NumpyWriter


def test_numpy_writer_rows_missing_tensors_and_new_ones(tmp_path):
    rng = np.random.default_rng(0)
    q = (0.0, 25.0, 75.0, 100.0)  # no 50: the variable view's ILR median is interpolated
    with writer.NumpyWriter(tmp_path) as w:
        for step in range(4):
            names = {0: ["b", "a"], 1: ["a", "c"], 2: ["b", "a", "c"], 3: ["a"]}[step]
            for name in names:
                for view in ("variable", "gradient"):
                    w.add_tensor_stats(rng.normal(size=(3, 4)), step, view=view, name=name,
                                       epoch=step // 2, quantiles=q)
            w.add_metric("loss", 1.0 / (step + 1), step)
    run = lib.read_run(str(tmp_path))
    for view in ("variable", "gradient"):
        summary = run[metadata.summary_tag(view)]
        # Rows: the first point's tensors, in the order written; "c" came later.
        assert list(summary.data.rows) == [metadata.stats_tag(view, n) for n in ("b", "a")]
        assert summary.steps == [0, 1, 2, 3]
        fields = slots.summary_fields(view)
        rms, epoch = fields.index("rms"), fields.index("epoch")
        # "b" has no point at step 1: NaN but its row key.
        assert summary.vectors[1][0][0] == slots.row_key(metadata.stats_tag(view, "b"))
        assert np.isnan(summary.vectors[1][0][1:]).all()
        assert np.isfinite(summary.vectors[1][1][rms]) and summary.vectors[1][1][epoch] == 0
        assert summary.vectors[2][0][epoch] == 1
        ilr = summary.vectors[0][:, -1]
        if view == "variable":  # the median between the 25 and 75 points (NaN: first point)
            assert slots.summary_fields(view)[-1] == "ilr_q50" and np.isnan(ilr).all()
    events = summary_events(str(tmp_path))
    for view in ("variable", "gradient"):
        (file_events,) = events[metadata.summary_tag(view)]
        assert [(s, m) for s, m, _, _ in file_events] == [
            (0, True), (1, False), (2, False), (3, False)]
        assert {tuple(s) for _, _, _, s in file_events} == {(2, len(slots.summary_fields(
            view)))}
    for view in ("variable", "gradient"):
        summary = run[metadata.summary_tag(view)]
        for step, matrix in zip(summary.steps, summary.vectors, strict=True):
            vectors = [run[t].vectors[run[t].steps.index(step)] if step in run[t].steps else
                       np.full(len(slots.tensor_stats_fields(view, q)), np.nan)
                       for t in summary.data.rows]
            np.testing.assert_array_equal(
                matrix, summary_pb.view_summary(view, summary.data.rows, vectors, q))


def test_numpy_writer_flush_closes_its_step(tmp_path):
    """flush() writes the held step's summaries; a tensor of that step added after it is in
    its own tag only (one summary point per step), and close() loses nothing."""
    w = writer.NumpyWriter(tmp_path)
    w.add_stats_vector(np.arange(45.0), 7, view="variable", name="w")
    w.add_tensor_stats(np.ones(5), 7, view="output", name="o")
    w.flush()
    assert summary_events(str(tmp_path))[metadata.summary_tag("variable")] == [
        [(7, True, types_pb2.DT_FLOAT, [1, len(slots.summary_fields("variable"))])]]
    with pytest.warns(RuntimeWarning, match="its own tag only"):
        w.add_tensor_stats(np.ones(5), 7, view="output", name="late")
    w.add_tensor_stats(np.ones(5), 8, view="output", name="o")  # held until close
    w.close()
    w.close()
    run = lib.read_run(str(tmp_path))
    out = run[metadata.summary_tag("output")]
    assert out.steps == [7, 8]
    assert list(out.data.rows) == [metadata.stats_tag("output", "o")]
    assert run[metadata.stats_tag("output", "late")].steps == [7]
    assert run[metadata.summary_tag("variable")].steps == [7]
    np.testing.assert_array_equal(
        run[metadata.summary_tag("variable")].vectors[0],
        summary_pb.view_summary("variable", [metadata.stats_tag("variable", "w")],
                              np.arange(45.0)[None]))


def test_view_summary_pb_example_runs():
    result = doctest.testmod(summary_pb)
    assert result.failed == 0 and result.attempted > 0


def test_view_summary_pb_checks_its_shape():
    rows = [metadata.stats_tag("output", "a")]
    with pytest.raises(ValueError, match="expected"):
        summary_pb.view_summary_pb("output", rows, np.zeros((2, 38)))
    pb = summary_pb.view_summary_pb("output", rows, np.zeros((1, 38)), with_metadata=False)
    assert not pb.value[0].HasField("metadata")


# ---------------------------------------------------------------------------- Keras


def test_keras_callback_writes_every_views_summary(tmp_path):
    import keras

    from tb_introspect.keras import Introspect

    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 2))
    h = keras.layers.Conv2D(3, 3, activation="relu", name="conv")(inp)
    h = keras.layers.Flatten(name="flat")(h)
    model = keras.Model(inp, keras.layers.Dense(2, name="head")(h))
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 6, 6, 2)).astype("float32"), rng.integers(0, 2, 48)
    callback = Introspect(str(tmp_path), every=2)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    # After close(), a second fit of the same model and callback writes a new event file
    # whose first summary event carries the metadata again, with the same rows.
    callback.close()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    callback.close()
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 2
    run = check_summaries(str(tmp_path), slots.VIEWS)
    assert run[metadata.summary_tag("output")].steps == [2, 4, 6, 8, 10, 12]
    assert run[metadata.metric_tag("loss")].steps == list(range(1, 13))  # both fits' steps
    rows = run[metadata.summary_tag("variable")].data.rows
    assert list(rows) == [metadata.stats_tag("variable", v.path)
                          for v in model.trainable_variables]


# ---------------------------------------------------------------------------- PyTorch


def test_torch_introspector_writes_every_views_summary(tmp_path):
    torch = pytest.importorskip("torch")
    from tb_introspect.torch import Introspector
    from tests.torch import torch_support as ts

    torch.manual_seed(0)
    model = ts.small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Introspector(str(tmp_path), model, opt, every=2, overhead=None) as intro:
        ts.train(model, opt, ts.batches(6), intro=intro, epochs=2)
    run = check_summaries(str(tmp_path), slots.VIEWS)
    assert run[metadata.summary_tag("gradient")].steps == [2, 4, 6, 8, 10, 12]
    assert list(run[metadata.summary_tag("variable")].data.rows) == [
        metadata.stats_tag("variable", name.replace(".", "/"))
        for name, _ in model.named_parameters()]
