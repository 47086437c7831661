"""The on-disk format: metadata round trip, version handling, raw event contents."""

from __future__ import annotations

import glob
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import summary_pb2, types_pb2

from tb_introspect import metadata, slots, summary_pb, writer
from tb_introspect.proto import plugin_data_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tensor_stats_metadata_round_trip():
    meta = metadata.create_tensor_stats_metadata(
        view="gradient", name="block/conv/kernel", layer="block/conv", depth=7,
        shape=(3, 3, None, 16), dtype="bfloat16", cadence="epoch", quantiles=(1, 50, 99),
    )
    assert meta.plugin_data.plugin_name == "introspect"
    assert meta.data_class == summary_pb2.DATA_CLASS_TENSOR
    data = metadata.parse_plugin_data(meta.plugin_data.content)
    assert data.version == metadata.PROTO_VERSION
    assert data.kind == metadata.TENSOR_STATS
    assert (data.view, data.name, data.layer, data.depth) == (
        "gradient", "block/conv/kernel", "block/conv", 7,
    )
    assert list(data.shape) == [3, 3, -1, 16]
    assert (data.dtype, data.cadence) == ("bfloat16", "epoch")
    assert list(data.quantiles) == [1.0, 50.0, 99.0]
    assert tuple(data.fields) == slots.tensor_stats_fields("gradient", (1, 50, 99))
    assert data.fields[-1] == "cos_prev" and "logq99" in data.fields


def test_metric_metadata_round_trip():
    for per_epoch, kind, fields in [
        (False, metadata.METRIC, slots.METRIC_FIELDS),
        (True, metadata.METRIC_EPOCH, slots.METRIC_EPOCH_FIELDS),
    ]:
        meta = metadata.create_metric_metadata("val_loss", per_epoch=per_epoch)
        data = metadata.parse_plugin_data(meta.plugin_data.content)
        assert (data.kind, data.name, tuple(data.fields)) == (kind, "val_loss", fields)
        assert meta.data_class == summary_pb2.DATA_CLASS_TENSOR


def test_newer_version_warns_once_and_is_read(caplog):
    newer = plugin_data_pb2.PluginData(
        version=metadata.PROTO_VERSION + 41, kind=metadata.TENSOR_STATS, view="output",
        fields=["epoch", "count", "brand_new_slot"],
    ).SerializeToString()
    # A field this reader does not know (number 99, varint 5): protobuf keeps it aside.
    newer += bytes([99 << 3 & 0x7F | 0x80, 99 >> 4, 5])
    with caplog.at_level(logging.WARNING, logger="tb_introspect.metadata"):
        first = metadata.parse_plugin_data(newer)
        second = metadata.parse_plugin_data(newer)
    assert list(first.fields) == list(second.fields) == ["epoch", "count", "brand_new_slot"]
    warnings = [r for r in caplog.records if "newer" in r.getMessage()]
    assert len(warnings) == 1
    assert str(metadata.PROTO_VERSION + 41) in warnings[0].getMessage()


def test_current_version_does_not_warn(caplog):
    meta = metadata.create_metric_metadata("loss")
    with caplog.at_level(logging.WARNING, logger="tb_introspect.metadata"):
        metadata.parse_plugin_data(meta.plugin_data.content)
    assert not caplog.records


def test_malformed_plugin_data_raises_value_error():
    with pytest.raises(ValueError, match="malformed"):
        metadata.parse_plugin_data(b"\xff\xff\xff")


def test_summary_pb_checks_the_vector_against_the_layout():
    with pytest.raises(ValueError, match="slots"):
        summary_pb.tensor_stats_pb(np.zeros(4), view="output", name="x")
    with pytest.raises(ValueError, match="unknown view"):
        summary_pb.tensor_stats_pb(np.zeros(35), view="activation", name="x")
    with pytest.raises(ValueError, match="not a slot"):
        summary_pb.fill_slots(np.zeros(35), "output", update_ratio=1.0)


def test_tensor_stats_pb_holds_what_make_tensor_proto_makes():
    """The vector's proto is built directly; it must be TensorBoard's own, byte for byte."""
    from tensorboard.util import tensor_util

    rng = np.random.default_rng(0)
    for view in slots.VIEWS:
        vec = rng.normal(size=len(slots.tensor_stats_fields(view)))
        vec[:3] = [np.nan, np.inf, -0.0]
        for first in (True, False):
            pb = summary_pb.tensor_stats_pb(vec, view=view, name="d/kernel", cadence="epoch",
                                            with_metadata=first)
            want = tensor_util.make_tensor_proto(vec)
            assert pb.value[0].tensor.SerializeToString() == want.SerializeToString()
            assert pb.value[0].HasField("metadata") == first
    with pytest.raises(ValueError, match="unknown cadence"):
        summary_pb.tensor_stats_pb(vec, view=view, name="x", cadence="hourly",
                                   with_metadata=False)


def test_view_summaries_describe_a_tag_once_per_event_file():
    views = summary_pb.ViewSummaries()
    vec = np.zeros(len(slots.tensor_stats_fields("gradient")))
    tags = {}
    for name in ("a", "b", "a", "b"):
        value = views.tensor_stats(vec, view="gradient", name=name, layer="L", depth=2)
        tags.setdefault(name, []).append(value.metadata is not None)
    assert tags == {"a": [True, False], "b": [True, False]}
    info = metadata.parse_plugin_data(
        views.tensor_stats(vec, view="gradient", name="c", layer="L", depth=2)
        .metadata.plugin_data.content)
    assert (info.name, info.layer, info.depth) == ("c", "L", 2)
    views.restart()  # a new event file: described again
    assert views.tensor_stats(vec, view="gradient", name="a").metadata is not None


def test_tensor_stats_pb_from_array_fills_epoch_and_extras():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 4
    s = writer.tensor_stats_pb_from_array(
        x, view="variable", name="w", layer="dense", depth=2, epoch=3,
        extras={"update_ratio": 0.01},
    )
    vec = dict(zip(slots.tensor_stats_fields("variable"), summary_pb.vector_of(s), strict=True))
    assert vec["epoch"] == 3 and vec["update_ratio"] == 0.01
    assert vec["q50"] == np.percentile(x, 50) and vec["count"] == 12
    data = metadata.parse_plugin_data(s.value[0].metadata.plugin_data.content)
    assert list(data.shape) == [3, 4] and data.dtype == "float32" and data.depth == 2


def test_metric_epoch_pb_band():
    s = summary_pb.metric_epoch_pb("loss", [4.0, 1.0, np.inf, 2.0, 3.0], epoch=2)
    assert list(summary_pb.vector_of(s)) == [2, 1, 1.75, 2.5, 3.25, 4, 2.5, 4]
    empty = summary_pb.vector_of(summary_pb.metric_epoch_pb("loss", [np.nan], epoch=0))
    assert empty[-1] == 0 and np.isnan(empty[1:-1]).all()


def test_raw_events_of_the_numpy_writer(tmp_path):
    with writer.NumpyWriter(tmp_path) as w:
        w.add_tensor_stats(np.ones((2, 3)), 4, view="output", name="d/out", layer="d")
        w.add_metric("loss", 0.5, 4, epoch=1)
    with pytest.raises(ValueError, match="closed"):
        w.add_metric("loss", 0.4, 5)
    (path,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    events = list(event_file_loader.EventFileLoader(path).Load())
    assert events[0].file_version == "brain.Event:2"
    values = [(e.step, v) for e in events[1:] for v in e.summary.value]
    # The step's view summary is written on close, after the metric.
    assert [v.tag for _, v in values] == ["introspect/output/d/out", "introspect/metric/loss",
                                          "introspect/summary/output"]
    for step, v in values:
        assert step == 4
        assert v.metadata.plugin_data.plugin_name == "introspect"
        assert v.metadata.data_class == summary_pb2.DATA_CLASS_TENSOR
    for _, v in values[:2]:
        assert v.tensor.dtype == types_pb2.DT_DOUBLE
        assert len(v.tensor.tensor_shape.dim) == 1
    summary = values[2][1].tensor
    assert summary.dtype == types_pb2.DT_FLOAT
    assert [d.size for d in summary.tensor_shape.dim] == [1, len(slots.summary_fields("output"))]


def test_numpy_path_works_without_tensorflow(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["tensorflow"] = None  # any import of TensorFlow now fails
        import numpy as np
        from tb_introspect import stats_np, summary_pb, writer
        with writer.NumpyWriter({str(tmp_path)!r}) as w:
            w.add_tensor_stats(np.ones(5), 0, view="variable", name="w")
            w.add_metric_epoch("loss", [1.0, 2.0], 0, epoch=0)
        assert "tensorflow" not in [m.split(".")[0] for m in sys.modules if sys.modules[m]]
        print("OK")
        """
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "OK"


def test_version_1_data_is_read_as_version_2():
    """A real event file written by the last version-1 writer (tests/data/format_v1)."""
    from tb_introspect.read import provider

    run = provider.read_logdir(os.path.join(ROOT, "tests", "data", "format_v1"))["adam_cnn"]
    assert run.format_version == 1
    assert {v: len(s) for v, s in run.tensors.items()} == {
        "variable": 4, "gradient": 4, "output": 3, "output_gradient": 3,
    }
    by_name = {s.info.name: s for s in run.tensors["output"]}
    # Version 1 wrote (n_pos - n_neg) / N: a ReLU output with ~47% zeros read +53%.
    # Read as version 2 it is the balance over the non-zero values: +100%.
    conv = by_name["conv"]
    assert 0.4 < conv.field("zero_fraction").min() and conv.field("zero_fraction").max() < 0.6
    np.testing.assert_allclose(conv.field("sign_balance"), 1.0, rtol=1e-12)
    for s in (s for view in run.tensors.values() for s in view):
        sb, zf = s.field("sign_balance"), s.field("zero_fraction")
        ok = np.isfinite(sb)
        assert np.all(np.abs(sb[ok]) <= 1.0)
        assert np.all(np.isnan(sb[zf == 1.0]))
    # Slots that version 1 did not write read as NaN, so every chart has a layout to draw.
    kernel = next(s for s in run.tensors["variable"] if s.info.name.endswith("conv/kernel"))
    assert not kernel.has("ilr_q50") and np.isnan(kernel.field("ilr_q50")).all()


def test_upgrade_values_converts_the_version_1_sign_balance():
    fields = ("zero_fraction", "sign_balance", "mean")
    v1 = np.array([[0.6, 0.4, 1.0], [0.0, -0.2, 1.0], [1.0, 0.0, 0.0], [0.5, 0.5 + 1e-17, 2.0]])
    got = slots.upgrade_values(1, fields, v1)
    np.testing.assert_allclose(got[:, 1], [1.0, -0.2, np.nan, 1.0])
    np.testing.assert_array_equal(got[:, [0, 2]], v1[:, [0, 2]])
    assert slots.upgrade_values(2, fields, v1) is v1
    means = v1[:, 2:]
    assert slots.upgrade_values(1, ("mean",), means) is means  # no balance: untouched


def test_activity_map_layout_and_metadata():
    pb = summary_pb.activity_pb([0.5, 0.0, 1.0], [0.25, 0.75], name="conv", samples=64,
                                epoch=3, layer="conv", depth=1, shape=(None, 1, 2, 3))
    data = metadata.parse_plugin_data(pb.value[0].metadata.plugin_data.content)
    assert data.kind == metadata.ACTIVITY_MAP and data.version == metadata.PROTO_VERSION
    assert tuple(data.fields) == ("epoch", "samples", "c0", "c1", "c2", "s0", "s1")
    assert pb.value[0].tag == metadata.activity_tag("conv") == "introspect/activity/conv"
    np.testing.assert_array_equal(summary_pb.vector_of(pb), [3, 64, 0.5, 0.0, 1.0, 0.25, 0.75])


def test_numpy_writer_activity_map_reads_back(tmp_path):
    from tb_introspect.read import provider

    with writer.NumpyWriter(str(tmp_path / "run")) as w:
        for epoch in range(2):
            w.add_activity("conv", [0.5, 0.0, 1.0 - epoch / 4], 10 * (epoch + 1),
                           spatial_rates=[0.25, 0.75, 1.0, 0.0], samples=64, epoch=epoch,
                           layer="conv", depth=2, shape=(None, 2, 2, 3))
    run = provider.read_logdir(str(tmp_path))["run"]
    assert not run.tensors and not run.metrics and not run.metric_epochs
    amap = run.activity["conv"]
    assert amap.info.kind == provider.KIND_ACTIVITY_MAP and amap.info.shape == (-1, 2, 2, 3)
    assert amap.steps.tolist() == [10, 20]
    np.testing.assert_array_equal(amap.values[:, :5], [[0, 64, 0.5, 0.0, 1.0],
                                                       [1, 64, 0.5, 0.0, 0.75]])
    np.testing.assert_array_equal(amap.field("s3"), [0.0, 0.0])
