"""Reading real event files into RunSeries (the HTTP-independent API)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tb_introspect import metadata, slots
from tb_introspect.read import provider
from tests.plugin.plugin_testlib import LAYOUT, write_bad_tags, write_run


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader")
    written = write_run(str(root / "nested" / "run"), range(25), steps_per_epoch=10)
    write_bad_tags(str(root / "bad"))
    return str(root), written


def test_read_logdir_returns_every_point_by_field_name(logdir) -> None:
    root, written = logdir
    runs = provider.read_logdir(root)
    assert sorted(runs) == ["bad", "nested/run"]
    rs = runs["nested/run"]
    assert list(rs.tensors) == list(slots.VIEWS)
    for view, tensors in LAYOUT.items():
        got = rs.tensors[view]
        assert len(got) == len(tensors)
        # depth order: depth, then layer, then name
        assert [(s.info.depth, s.info.layer, s.info.name) for s in got] == sorted(
            (d, layer, n) for n, layer, d in tensors
        )
        for s in got:
            steps, values = written.stats[s.info.tag]
            np.testing.assert_array_equal(s.steps, steps)
            for name in ("rms", "q50", "logq100", "dead_rate", "epoch"):
                np.testing.assert_array_equal(s.field(name), values[name])
            assert s.info.shape == (4, 3) and s.info.view == view
    assert np.isnan(rs.tensors["output"][0].field("update_ratio")).all()  # not in its layout
    loss_steps, loss_epochs, loss_values = written.metrics["loss"]
    np.testing.assert_array_equal(rs.metrics["loss"].field("value"), loss_values)
    np.testing.assert_array_equal(rs.metrics["loss"].epochs, loss_epochs)
    band = rs.metric_epochs["loss"]
    np.testing.assert_array_equal(band.steps, [9, 19])  # epoch 2 is incomplete
    first = loss_values[loss_epochs == 0]
    assert band.field("min")[0] == first.min() and band.field("count")[0] == 10


def test_wrong_length_and_newer_version(logdir, caplog) -> None:
    root, _ = logdir
    provider._warned.clear()
    with caplog.at_level(logging.WARNING):
        rs = provider.read_logdir(root, runs=["bad"])["bad"]
    assert [t for t, _ in rs.skipped] == ["introspect/output/short"]
    width = len(slots.tensor_stats_fields("output"))
    assert f"{width - 3} values, layout has {width} fields" in rs.skipped[0][1]
    assert any("skipping tag 'introspect/output/short'" in r.message for r in caplog.records)
    tags = [s.info.tag for s in rs.tensors["output"]]
    assert tags == ["introspect/output/future", "introspect/output/good"]
    future = rs.tensors["output"][0]
    assert rs.format_version == metadata.PROTO_VERSION + 1
    np.testing.assert_array_equal(future.field("future_field"), 42.0 + np.arange(5))
    np.testing.assert_array_equal(future.field("rms"), rs.tensors["output"][1].field("rms"))


def test_unknown_run_and_missing_logdir(logdir, tmp_path) -> None:
    root, _ = logdir
    dp = provider.local_provider(root)
    with pytest.raises(KeyError, match="no tb-introspect data"):
        provider.read_run(dp, "", "nope")
    assert provider.read_run(dp, "", "nested/run").metrics["loss"].info.name == "loss"
    with pytest.raises(FileNotFoundError):
        provider.read_logdir(str(tmp_path / "absent"))


def test_parse_tag_info_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="malformed"):
        provider.parse_tag_info("t", b"\xff\xff\xff")
    meta = metadata.create_metric_metadata("loss")
    info = provider.parse_tag_info("introspect/metric/loss", meta.plugin_data.content, 7, 1.5)
    assert info.kind == "metric" and info.fields == ("epoch", "value") and info.max_step == 7
