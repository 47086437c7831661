"""The TF summary ops and the numpy writer produce the same data, as TensorBoard reads it.

The numpy writer also writes each view's VIEW_SUMMARY (the TF ops, one tensor per call,
cannot): both loaders read it back alike, metadata from its first point included.

Both loaders are exercised for real: the Python loader (EventMultiplexer +
MultiplexerDataProvider, what ``--load_fast=false`` uses) and the Rust data
server (``tensorboard_data_server`` spawned by TensorBoard's own
``SubprocessServerDataIngester`` and read through ``GrpcDataProvider``, what
``--load_fast=true`` uses).
"""

from __future__ import annotations

import doctest
import inspect
import re
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorboard import context as tb_context
from tensorboard.backend.event_processing import data_provider as mux_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.data import server_ingester
from tensorboard.util import grpc_util

from tb_introspect import metadata, slots, stats_np, summary, summary_pb, writer

RNG = np.random.default_rng(42)
STEPS = (0, 5, 10)


def tensors_at(step: int) -> dict[str, tuple[str, str, int, np.ndarray]]:
    """name -> (view, layer, depth, array) of the tensors logged at ``step``."""
    out = np.maximum(RNG.normal(size=(4, 3, 3, 5)), 0).astype(np.float32)
    out[..., 2] = 0.0
    out[0, 0, 0, 0] = np.nan
    return {
        "conv/kernel": ("variable", "conv", 0, RNG.normal(size=(3, 3, 2, 5)).astype(np.float32)),
        "conv/kernel_grad": ("gradient", "conv", 0, RNG.normal(size=(3, 3, 2, 5)) * 1e-3),
        "conv/output": ("output", "conv", 0, out),
        "dense/output_grad": ("output_gradient", "dense", 1, RNG.normal(size=(4, 7))),
    }


DATA = {step: tensors_at(step) for step in STEPS}
LOSSES = {step: [1.0 / (step + 1), 0.5 / (step + 1), np.nan] for step in STEPS}


def write_tf(logdir: str) -> None:
    w = tf.summary.create_file_writer(logdir)
    with w.as_default():
        for step in STEPS:
            epoch = step // 5
            for name, (view, layer, depth, arr) in DATA[step].items():
                summary.tensor_stats_summary(
                    name, tf.constant(arr), step, view=view, layer=layer, depth=depth,
                    epoch=epoch,
                )
            # An already computed vector (what the Keras callback writes).
            vec = stats_np.tensor_stats(DATA[step]["conv/output"][3], "output")
            vec[0] = epoch
            summary.write_stats_vector(
                "conv/output_epoch", vec, step, view="output", layer="conv", depth=0,
                shape=(None, 3, 3, 5), dtype="float32", cadence="epoch",
            )
            summary.metric_summary("loss", LOSSES[step][0], step, epoch=epoch)
            summary.metric_epoch_summary("loss", LOSSES[step], step, epoch=epoch)
    w.close()


def write_numpy(logdir: str) -> None:
    with writer.NumpyWriter(logdir) as w:
        for step in STEPS:
            epoch = step // 5
            for name, (view, layer, depth, arr) in DATA[step].items():
                w.add_tensor_stats(
                    arr, step, view=view, name=name, layer=layer, depth=depth, epoch=epoch
                )
            vec = stats_np.tensor_stats(DATA[step]["conv/output"][3], "output")
            vec[0] = epoch
            w.add_stats_vector(
                vec, step, view="output", name="conv/output_epoch", layer="conv", depth=0,
                shape=(None, 3, 3, 5), dtype="float32", cadence="epoch",
            )
            w.add_metric("loss", LOSSES[step][0], step, epoch=epoch)
            w.add_metric_epoch("loss", LOSSES[step], step, epoch=epoch)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("summaries")
    write_tf(str(root / "tf"))
    write_numpy(str(root / "np"))
    return str(root)


def snapshot(provider) -> dict:
    """{run: {tag: (plugin_content, [(step, vector)])}} through the DataProvider API."""
    ctx = tb_context.RequestContext()
    listing = provider.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME)
    data = provider.read_tensors(
        ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, downsample=10_000
    )
    out = {}
    for run, tags in listing.items():
        out[run] = {}
        for tag, series in tags.items():
            points = [(d.step, np.asarray(d.numpy)) for d in data[run][tag]]
            out[run][tag] = (series.plugin_content, points)
    return out


@pytest.fixture(scope="module")
def python_loader(logdir):
    mux = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={metadata.PLUGIN_NAME: 0}  # keep every point
    )
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    return snapshot(mux_provider.MultiplexerDataProvider(mux, logdir))


@pytest.fixture(scope="module")
def rust_loader(logdir):
    try:
        binary = server_ingester.get_server_binary()
    except server_ingester.NoDataServerError as e:
        pytest.fail(f"tensorboard-data-server is a dependency of tensorboard: {e}")
    ingester = server_ingester.SubprocessServerDataIngester(
        binary, logdir, reload_interval=0, channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin={metadata.PLUGIN_NAME: 0},
    )
    ingester.start()
    try:
        deadline = time.monotonic() + 60
        while True:  # the server loads the logdir in the background
            snap = snapshot(ingester.data_provider)
            n_points = sum(len(p) for tags in snap.values() for _, p in tags.values())
            if len(snap) == 2 and n_points == (2 * 7 + 4) * len(STEPS):
                return snap
            if time.monotonic() > deadline:
                pytest.fail(f"data server did not load the logdir: {snap.keys()}")
            time.sleep(0.3)
    finally:
        # --die-after-stdin: closing our end of its stdin stops the server.
        ingester._stdin_handle.close()


EXPECTED_TAGS = {
    metadata.stats_tag("variable", "conv/kernel"),
    metadata.stats_tag("gradient", "conv/kernel_grad"),
    metadata.stats_tag("output", "conv/output"),
    metadata.stats_tag("output_gradient", "dense/output_grad"),
    metadata.stats_tag("output", "conv/output_epoch"),
    metadata.metric_tag("loss"),
    metadata.metric_tag("loss", per_epoch=True),
}
SUMMARY_TAGS = {metadata.summary_tag(view) for view in slots.VIEWS}


@pytest.mark.parametrize("loader", ["python_loader", "rust_loader"])
def test_tf_and_numpy_paths_read_back_alike(loader, request):
    snap = request.getfixturevalue(loader)
    assert set(snap) == {"tf", "np"}
    assert set(snap["tf"]) == EXPECTED_TAGS
    assert set(snap["np"]) == EXPECTED_TAGS | SUMMARY_TAGS
    for tag in EXPECTED_TAGS:
        meta_tf, points_tf = snap["tf"][tag]
        meta_np, points_np = snap["np"][tag]
        assert meta_tf == meta_np, tag  # byte-identical PluginData
        assert [s for s, _ in points_tf] == [s for s, _ in points_np] == list(STEPS)
        for (step, a), (_, b) in zip(points_tf, points_np, strict=True):
            assert a.dtype == b.dtype == np.float64
            fields = metadata.parse_plugin_data(meta_tf).fields
            assert a.shape == b.shape == (len(fields),)
            if tag.endswith("output_epoch") or "/metric" in tag:
                np.testing.assert_array_equal(a, b)  # same vector written by both paths
            else:  # computed in-graph vs with numpy: exact regime, same definitions
                np.testing.assert_allclose(a, b, rtol=1e-9, atol=0, equal_nan=True)
            assert a[0] == step // 5  # the epoch slot


def test_python_and_rust_loaders_return_identical_data(python_loader, rust_loader):
    assert python_loader.keys() == rust_loader.keys()
    for run in python_loader:
        assert python_loader[run].keys() == rust_loader[run].keys()
        for tag, (meta, points) in python_loader[run].items():
            meta_r, points_r = rust_loader[run][tag]
            assert meta == meta_r
            assert [s for s, _ in points] == [s for s, _ in points_r]
            for (_, a), (_, b) in zip(points, points_r, strict=True):
                np.testing.assert_array_equal(a, b)  # bit-identical, NaNs included


def test_metadata_read_back_describes_the_tensor(python_loader):
    meta, points = python_loader["tf"][metadata.stats_tag("output", "conv/output")]
    data = metadata.parse_plugin_data(meta)
    assert data.version == metadata.PROTO_VERSION
    assert data.kind == metadata.TENSOR_STATS
    assert (data.view, data.layer, data.name, data.depth) == ("output", "conv", "conv/output", 0)
    assert list(data.shape) == [4, 3, 3, 5] and data.dtype == "float32"
    assert data.cadence == "step"
    assert tuple(data.fields) == slots.tensor_stats_fields("output")
    vec = dict(zip(data.fields, points[0][1], strict=True))
    assert vec["nan_count"] == 1 and vec["dead_rate"] == pytest.approx(1 / 5)
    epoch_meta, _ = python_loader["np"][metadata.stats_tag("output", "conv/output_epoch")]
    ed = metadata.parse_plugin_data(epoch_meta)
    assert ed.cadence == "epoch" and list(ed.shape) == [-1, 3, 3, 5]
    band_meta, band = python_loader["tf"][metadata.metric_tag("loss", per_epoch=True)]
    assert metadata.parse_plugin_data(band_meta).kind == metadata.METRIC_EPOCH
    epoch, lo, p25, p50, p75, hi, mean, count = band[0][1]
    assert (lo, p50, hi, mean, count) == (0.5, 0.75, 1.0, 0.75, 2)


def test_summary_ops_in_a_tf_function_with_default_step(tmp_path):
    w = tf.summary.create_file_writer(str(tmp_path))
    x = tf.Variable(RNG.normal(size=(5, 3)).astype(np.float32))

    @tf.function
    def log():
        return summary.tensor_stats_summary(
            "v", x, view="variable", extras={"update_ratio": 0.25}
        )

    with w.as_default(step=3):
        assert bool(log())
    # Eagerly without a default writer: nothing written, no error.
    assert not bool(summary.tensor_stats_summary("v", x, 0, view="variable"))
    w.close()
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"introspect": 0})
    mux.AddRunsFromDirectory(str(tmp_path))
    mux.Reload()
    snap = snapshot(mux_provider.MultiplexerDataProvider(mux, str(tmp_path)))
    (_, points), = snap["."].values()
    step, vec = points[0]
    fields = slots.tensor_stats_fields("variable")
    assert step == 3 and vec[fields.index("update_ratio")] == 0.25 and vec[0] == 0


def test_docstring_examples_run():
    """The runnable examples of the module's and the public ops' docstrings pass."""
    result = doctest.testmod(summary)
    assert result.failed == 0 and result.attempted > 0
    documented = [f for f in (summary.tensor_stats_summary, summary.write_stats_vector,
                              summary.metric_summary, summary.metric_epoch_band,
                              summary.metric_epoch_summary) if ">>> " in (f.__doc__ or "")]
    assert len(documented) == 5 and ">>> " in summary.__doc__


def test_format_doc_shows_the_ops_signatures():
    """docs/format.md's signatures of the ops name their parameters in order, ``*`` included."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text(encoding="utf-8")
    ops = ("tensor_stats_summary", "write_stats_vector", "metric_summary", "metric_epoch_summary")
    for op in ops:
        shown = re.search(rf"`{op}\((.*?)\)`", doc, flags=re.S)
        assert shown, f"docs/format.md shows no signature of {op}"
        names = [part.split("=")[0].strip() for part in shown.group(1).split(",")]
        want = []
        for param in inspect.signature(getattr(summary, op)).parameters.values():
            if param.kind == param.KEYWORD_ONLY and "*" not in want:
                want.append("*")
            want.append(param.name)
        assert names == want, op


def test_summary_ops_reject_bad_input(tmp_path):
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        with pytest.raises(ValueError, match="slots"):
            summary.write_stats_vector("x", np.zeros(3), 0, view="output")
        with pytest.raises(ValueError, match="not a slot"):
            summary.tensor_stats_summary("x", np.ones(3), 0, view="output", extras={"cos": 1})
        with pytest.raises(TypeError, match="labels"):
            summary.tensor_stats_summary("labels", tf.constant(["a"]), 0, view="output")
        with pytest.raises(ValueError, match="cadence"):
            summary.write_stats_vector(
                "x", np.zeros(35), 0, view="output", cadence="hourly"
            )


@pytest.mark.parametrize("loader", ["python_loader", "rust_loader"])
def test_view_summaries_of_the_numpy_writer_read_back(loader, request):
    run = request.getfixturevalue(loader)["np"]
    for view in slots.VIEWS:
        meta, points = run[metadata.summary_tag(view)]
        data = metadata.parse_plugin_data(meta)  # the first point's metadata, kept
        assert data.kind == metadata.VIEW_SUMMARY and data.view == view
        assert tuple(data.fields) == slots.summary_fields(view)
        rows = [name for name, (v, *_) in DATA[0].items() if v == view]
        rows += ["conv/output_epoch"] if view == "output" else []
        assert list(data.rows) == [metadata.stats_tag(view, n) for n in rows]
        assert [s for s, _ in points] == list(STEPS)
        for i, (_, matrix) in enumerate(points):
            assert matrix.dtype == np.float32
            assert matrix.shape == (len(rows), len(data.fields))
            vectors = np.stack([run[tag][1][i][1] for tag in data.rows])
            np.testing.assert_array_equal(
                matrix, summary_pb.view_summary(view, data.rows, vectors))
