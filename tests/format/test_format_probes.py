"""The PROBES summary (format version 4), written to a real event file and read back with
TensorBoard's own loader: one float32 ``[rows, PROBE_FIELDS]`` matrix per point, rows fixed at
the first point, metadata on the first point of a writer only, bad input refused."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import types_pb2

from tb_introspect import metadata, schema, slots, summary_pb, writer
from tb_introspect.pipeline.options import Options
from tests.keras import collect_testlib as lib

NAN = float("nan")


def probe(abs_median=NAN, kurtosis=NAN, attn=NAN, logit_max=NAN, lse=NAN) -> np.ndarray:
    return np.array([abs_median, kurtosis, attn, logit_max, lse])


def test_contract_names():
    assert metadata.PROTO_VERSION == 4
    assert metadata.probes_tag() == "introspect/probes"
    assert slots.PROBE_FIELDS == ("row_key", "epoch", "abs_median", "kurtosis",
                                     "attn_logit_max", "logit_max", "logit_lse")
    assert slots.PROBE_VALUE_FIELDS == slots.PROBE_FIELDS[2:]
    assert schema.PROBE_REFERENCES == {"attn_logit_max": 100.0, "kurtosis": 3.0,
                                         "massive_abs": 100.0, "massive_ratio": 1000.0}
    assert metadata.PROBES == 6


def test_probes_written_and_read_back(tmp_path):
    points = [
        {"h.0.mlp": probe(0.5, 3.2), "h.0.attn": probe(attn=12.0), "lm_head": probe(
            0.7, 4.0, logit_max=9.5, lse=6.25)},
        # a module missing at a point, a new one (left out), a value past float32's range
        {"h.0.attn": probe(attn=1e300), "lm_head": probe(0.6, 3.9, logit_max=9.0, lse=6.0),
         "late": probe(1.0, 1.0)},
    ]
    summaries = summary_pb.ViewSummaries()
    with writer.NumpyWriter(tmp_path) as w:
        for step, values in enumerate(points, start=1):
            w.add_summary(summary_pb.encode(
                [summaries.probes(values, epoch=step - 1, cadence="epoch")]), step)
        assert summaries.probes({}, epoch=2) is None  # nothing to write
    run = lib.read_run(str(tmp_path))
    series = run[metadata.probes_tag()]
    data = series.data
    assert data.kind == metadata.PROBES and data.version == metadata.PROTO_VERSION
    assert tuple(data.fields) == slots.PROBE_FIELDS and data.cadence == "epoch"
    assert list(data.rows) == ["h.0.mlp", "h.0.attn", "lm_head"]
    assert series.steps == [1, 2]
    first, second = series.vectors
    assert first.dtype == np.float32 and first.shape == (3, len(slots.PROBE_FIELDS))
    keys = [slots.row_key(r) for r in data.rows]
    np.testing.assert_array_equal(first[:, 0], keys)
    np.testing.assert_array_equal(second[:, 0], keys)
    np.testing.assert_array_equal(first[:, 1], [0, 0, 0])
    np.testing.assert_allclose(first[0, 2:], np.float32(probe(0.5, 3.2)), equal_nan=True)
    np.testing.assert_allclose(first[2, 2:], np.float32(probe(0.7, 4.0, logit_max=9.5,
                                                              lse=6.25)), equal_nan=True)
    assert np.isnan(second[0, 1:]).all()  # h.0.mlp has no value at the second point
    assert second[1, 4] == np.finfo(np.float32).max  # held at float32's largest, still finite
    assert second[1, 1] == 1
    # Metadata only on the first event of the tag.
    (path,) = glob.glob(os.path.join(tmp_path, "events.out.tfevents.*"))
    events = [(v.HasField("metadata"), v.tensor.dtype)
              for e in event_file_loader.EventFileLoader(path).Load()
              for v in e.summary.value if v.tag == metadata.probes_tag()]
    assert events == [(True, types_pb2.DT_FLOAT), (False, types_pb2.DT_FLOAT)]


def test_restart_writes_the_metadata_again():
    summaries = summary_pb.ViewSummaries()
    values = {"a": probe(1.0, 3.0)}
    assert summaries.probes(values).metadata is not None
    assert summaries.probes(values).metadata is None
    summaries.restart()
    again = summaries.probes({"b": probe(2.0, 3.0), "a": probe(1.0, 3.0)})
    data = metadata.parse_plugin_data(again.metadata.plugin_data.content)
    assert list(data.rows) == ["a"]  # the same rows as before the restart


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="probes of 'x': 3 values, expected 5"):
        summary_pb.probes_pb({"x": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match="unknown cadence"):
        summary_pb.probes_pb({"x": probe()}, cadence="hourly")
    assert Options.make().probes is True
    assert Options.make(probes=False).probes is False
    with pytest.raises(ValueError, match="probes must be True or False"):
        Options.make(probes="yes")
