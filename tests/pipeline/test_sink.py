"""The one event sink: records TensorBoard's own writer would write, byte for byte, read back
by TensorBoard's loader; a URL rolls into whole objects (fsspec's file://, as gs://; a scheme
only TensorFlow knows through its file systems) or is refused, never written to a local
folder named after it. Buckets: tests/remote."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from tb_introspect import summary_pb
from tb_introspect.pipeline.sink import EventSink, WriteFailed, record


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
    assert "pip install 'tb-introspect[gcs]'" in out.stdout
    assert "files: []" in out.stdout


def _url_events(folder):
    """Every event of the event files in ``folder``, files in name order (as TensorBoard)."""
    names = sorted(p.name for p in folder.iterdir())
    return names, [event_pb2.Event.FromString(raw) for name in names
                   for raw in event_file_loader.RawEventFileLoader(str(folder / name)).Load()]


def test_a_url_rolls_one_new_object_per_upload_in_name_order(tmp_path):
    # file:// goes through fsspec, as gs:// does: whole objects, never appended to.
    with EventSink(f"file://{tmp_path}/run", upload_secs=0) as sink:
        for step in (1, 2, 3):
            sink.write(step, [summary_pb.metric_pb("loss", 1.0 / step)])
            sink.flush()
            deadline = time.monotonic() + 60
            while len(list((tmp_path / "run").iterdir())) < step + 1:  # the thread put it
                assert time.monotonic() < deadline
                time.sleep(0.01)
    names, events = _url_events(tmp_path / "run")
    assert sink.path == f"file://{tmp_path}/run/{names[0]}" and len(names) == 4
    # Each object is an event file of its own (the file version first); each step once.
    assert [e.file_version for e in events if e.file_version] == ["brain.Event:2"] * 4
    assert [e.step for e in events if e.summary.value] == [1, 2, 3]


def test_a_url_uploads_at_most_once_per_interval_and_close_puts_the_rest(tmp_path):
    with EventSink(f"file://{tmp_path}/run", upload_secs=3600) as sink:
        sink.write(1, [summary_pb.metric_pb("loss", 1.0)])
        sink.flush()  # the first upload since the header: waits out the interval
        for step in range(2, 30):
            sink.write(step, [summary_pb.metric_pb("loss", 1.0 / step)])
            sink.flush()
        # A chance for a wrong early upload to show; no machine is slow enough for the hour
        # to pass and make a right one.
        time.sleep(0.2)
        assert len(list((tmp_path / "run").iterdir())) == 1  # the header alone
    names, events = _url_events(tmp_path / "run")
    assert len(names) == 2 and [e.step for e in events if e.summary.value] == list(range(1, 30))


def test_flush_now_puts_what_was_written_before_it_returns(tmp_path):
    """The end of training (``fit`` returning) does not wait out the interval."""
    with EventSink(f"file://{tmp_path}/run", upload_secs=3600) as sink:
        sink.write(1, [summary_pb.metric_pb("loss", 1.0)])
        sink.flush()
        assert len(list((tmp_path / "run").iterdir())) == 1  # the header alone
        sink.flush(now=True)
        names, events = _url_events(tmp_path / "run")
        assert len(names) == 2 and [e.step for e in events if e.summary.value] == [1]
        sink.flush(now=True)  # nothing new: no object
        assert len(list((tmp_path / "run").iterdir())) == 2


def test_a_failed_upload_counts_the_steps_it_lost(tmp_path):
    sink = EventSink(f"file://{tmp_path}/run", upload_secs=0)
    shutil.rmtree(tmp_path / "run")
    (tmp_path / "run").write_text("")  # where the objects went, a file: every put fails
    for step in (5, 6):
        sink.write(step, [summary_pb.metric_pb("loss", 1.0)])
    with pytest.raises(WriteFailed, match=r"the values of 2 steps \(5 to 6\) were not"):
        sink.close()
    assert sink.closed


def test_files_of_one_process_sort_in_the_order_they_were_made(tmp_path):
    """TensorBoard reads a run's files in name order and skips a file that appears after one
    sorting later: twelve sinks in one second must not name their tenth before their ninth."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(tmp_path),
                                             size_guidance={event_accumulator.TENSORS: 0})
    for step in range(12):
        with EventSink(tmp_path) as sink:
            sink.write(step, [summary_pb.metric_pb("loss", float(step))])
        acc.Reload()  # a live TensorBoard, reloading while the files appear
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 12
    tag = "introspect/metric/loss"
    assert [e.step for e in acc.Tensors(tag)] == list(range(12))
