"""The one event sink: records TensorBoard's own writer would write, byte for byte, read back
by TensorBoard's loader; URLs go to TensorFlow's file systems or are refused, never to a
local folder named after them."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from tb_introspect import summary_pb
from tb_introspect.pipeline.sink import EventSink, record


@pytest.mark.parametrize("size", [0, 1, 100, 70_000])
def test_records_are_tensorboards_byte_for_byte(size):
    data = np.random.default_rng(size).bytes(size)
    buf = io.BytesIO()
    RecordWriter(buf).write(data)  # TensorBoard's framing and CRC-32C, in Python
    assert record(data) == buf.getvalue()


def test_a_sinks_events_read_back(tmp_path):
    with EventSink(tmp_path) as sink:
        sink.write_steps([(1, [summary_pb.metric_pb("loss", 0.5)]),
                          (2, []),  # nothing at a step: no event
                          (3, [summary_pb.metric_pb("loss", 0.25),
                               summary_pb.metric_pb("acc", 0.75)])])
    (path,) = tmp_path.iterdir()
    events = [event_pb2.Event.FromString(raw)
              for raw in event_file_loader.RawEventFileLoader(str(path)).Load()]
    assert events[0].file_version == "brain.Event:2"
    assert [(e.step, [v.tag for v in e.summary.value]) for e in events[1:]] == [
        (1, ["introspect/metric/loss"]),
        (3, ["introspect/metric/loss", "introspect/metric/acc"])]
    with pytest.raises(ValueError, match="closed"):
        sink.write(4, [summary_pb.metric_pb("loss", 0.1)])


def test_a_url_goes_to_tensorflows_file_systems(tmp_path, monkeypatch):
    import tensorflow as tf

    monkeypatch.chdir(tmp_path)
    with EventSink("ram://sink-test/run") as sink:
        sink.write(1, [summary_pb.metric_pb("loss", 0.5)])
    assert sink.path.startswith("ram://sink-test/run/events.out.tfevents.")
    assert tf.io.gfile.exists(sink.path) and os.listdir(tmp_path) == []


def test_without_tensorflow_a_url_is_refused_and_nothing_is_written(tmp_path):
    code = textwrap.dedent("""
        import os, sys
        sys.modules["tensorflow"] = None  # as on a machine without TensorFlow
        from tb_introspect.pipeline.sink import EventSink
        try:
            EventSink("gs://bucket/run")
        except ValueError as e:
            print("refused:", e)
        print("files:", os.listdir("."))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert "refused: log_dir 'gs://bucket/run'" in out.stdout, out.stderr[-2000:]
    assert "files: []" in out.stdout
